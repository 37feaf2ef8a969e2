"""One rank's script as a child process of its proc, as torchrun's agent runs
its workers.

Contract of :class:`RankProcess`:

* :meth:`RankProcess.start` starts ``cmd`` (``python -u train.py ...``) as a
  child of this proc, in a session of its own (``start_new_session``, as
  torchrun's ``SubprocessHandler``), with ``env`` as its whole environment,
  stdin from ``/dev/null`` and its stdout and stderr in pipes.  The child
  gets ``SIGKILL`` when the thread that started it ends (the actor's thread,
  which ends with the actor or its proc: ``PR_SET_PDEATHSIG``, set by a
  two-line ``python -I -S`` bootstrap that then ``exec``\\ s ``cmd`` itself),
  so a proc that is SIGKILLed leaves no rank behind.
* :meth:`RankProcess.pump` (on the starting thread) forwards the output
  chunk by chunk as it comes: to ``sys.stdout``/``sys.stderr`` of the
  calling thread (in an actor, the proc's output capture prefixes each line
  with the actor's rank and host) when the stream goes to the console, and
  to the stream's log file when it has one; it keeps the last lines of
  stderr (:attr:`RankProcess.stderr_tail`), and returns the child's exit
  status (``Popen.returncode``: ``-N`` for a signal N) once it exited and
  its pipes are drained (at most :data:`DRAIN_S` after its exit: a process
  the script started may hold them).  What the child's session still holds
  then (workers the script forked) is SIGKILLed.
* :meth:`RankProcess.terminate` is a stop: ``SIGTERM`` to the child's session,
  so the script's own SIGTERM handler runs (a checkpoint on preemption), then
  ``SIGKILL`` :func:`term_grace` seconds later if it is still running.
  Every rank process running in this proc is terminated when the proc
  begins to stop (the ``proc_stopping`` lifecycle event: ``ProcMesh.stop``,
  ``monarch torchrun`` stopping a failed attempt or on Ctrl-C) and when the
  actor that started it is stopped (``actor_stopped``).
"""

from __future__ import annotations

import codecs
import collections
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any, Sequence

logger = logging.getLogger("monarch.spmd")

#: after the child exited, how long its pipes may stay open (held by a process it started) before
#: the rest of its output is given up
DRAIN_S = 1.0
#: how many of the last stderr lines a failure reports
TAIL_LINES = 40

#: ``python -I -S -c BOOT PARENT_PID CMD...``: die with the thread that started us, then become CMD
BOOT = (
    "import ctypes, os, signal, sys\n"
    "try:\n"
    "    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)\n"
    "except Exception:\n"
    "    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "try:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "except OSError as e:\n"
    "    sys.stderr.write(f'cannot run {sys.argv[2]!r}: {e}\\n')\n"
    "    os._exit(127)\n"
)


def term_grace() -> float:
    """Seconds between the SIGTERM of a stop and the SIGKILL: what the proc's
    stop grace (``MONARCH_STOP_GRACE``) leaves after the rank reports its end
    (at least 1 s)."""
    from monarch_core import settings

    return max(1.0, float(settings.get("MONARCH_STOP_GRACE")) - 2.0)


class _Sink:
    """Where one of the child's streams goes: the console (a text stream of
    the calling thread, looked up at each write), a log file (bytes), and
    for stderr a tail of its last lines."""

    def __init__(self, name: str, console: bool, path: str | None, keep_tail: bool) -> None:
        self.name, self.console = name, console
        self.file: IO[bytes] | None = None
        if path is not None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.file = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.tail: collections.deque[str] | None = collections.deque(maxlen=TAIL_LINES) if keep_tail else None
        self._partial = ""

    def write(self, data: bytes) -> None:
        if self.file is not None:
            self.file.write(data)
            self.file.flush()
        text = self.decoder.decode(data)
        self._text(text)

    def _text(self, text: str) -> None:
        if not text:
            return
        if self.tail is not None:
            *whole, self._partial = (self._partial + text).split("\n")
            self.tail.extend(whole)
        if self.console:
            stream = getattr(sys, self.name)
            try:
                stream.write(text)
                if text.endswith("\n"):  # whole lines out now; a partial one waits for its end
                    stream.flush()
            except (OSError, ValueError):  # the proc's stream is closed: the file still has it
                pass

    def close(self) -> None:
        self._text(self.decoder.decode(b"", final=True))
        if self.tail is not None and self._partial:
            self.tail.append(self._partial)
            self._partial = ""
        if self.console:
            try:
                getattr(sys, self.name).flush()
            except (OSError, ValueError):
                pass
        if self.file is not None:
            self.file.close()
            self.file = None


class RankProcess:
    """One rank's script as a child process (see the module docstring)."""

    def __init__(self, cmd: Sequence[str], env: dict[str, str], *, stdout_console: bool = True,
                 stderr_console: bool = True, stdout_file: str | None = None, stderr_file: str | None = None,
                 python: str | None = None) -> None:
        self.cmd, self.env = list(cmd), env
        self.python = python or sys.executable
        self.sinks = {"stdout": _Sink("stdout", stdout_console, stdout_file, False),
                      "stderr": _Sink("stderr", stderr_console, stderr_file, True)}
        self.popen: subprocess.Popen[bytes] | None = None
        self.exited = threading.Event()
        self.terminated_by: str | None = None  # why a stop terminated it
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    @property
    def stderr_tail(self) -> list[str]:
        tail = self.sinks["stderr"].tail
        return list(tail) if tail is not None else []

    def start(self) -> None:
        """Start the child (see the module docstring); ``OSError`` when it cannot be."""
        boot = [self.python, "-I", "-S", "-c", BOOT, str(os.getpid()), *self.cmd]
        self.popen = subprocess.Popen(boot, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True, close_fds=True)

    def pump(self) -> int:
        """Forward the output until the child ended; its ``returncode``."""
        p = self.popen
        assert p is not None and p.stdout is not None and p.stderr is not None, "start() first"
        sel = selectors.DefaultSelector()
        pipes = {p.stdout.fileno(): self.sinks["stdout"], p.stderr.fileno(): self.sinks["stderr"]}
        for fd in pipes:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        exited_at: float | None = None
        try:
            while sel.get_map():
                for key, _ in sel.select(0.2):
                    fd = int(key.fd)
                    try:
                        data = os.read(fd, 65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if data:
                        pipes[fd].write(data)
                    else:
                        sel.unregister(fd)
                if exited_at is None and p.poll() is not None:
                    exited_at = time.monotonic()
                if exited_at is not None and time.monotonic() - exited_at > DRAIN_S:
                    break  # something the script started holds its pipes: their rest is not ours
        finally:
            sel.close()
            code = p.wait()
            self.exited.set()
            _kill_session(p.pid, signal.SIGKILL)  # what the script left running in its session
            for stream in (p.stdout, p.stderr):
                stream.close()
            for sink in self.sinks.values():
                sink.close()
        return code

    def terminate(self, why: str, grace: float | None = None) -> None:
        """Stop the child: SIGTERM to its session now, SIGKILL ``grace``
        seconds later (default :func:`term_grace`) if it is still running.
        Returns at once; a second call does nothing."""
        with self._lock:
            if self.terminated_by is not None or self.popen is None or self.exited.is_set():
                return
            self.terminated_by = why
        pid = self.popen.pid
        grace = term_grace() if grace is None else grace
        logger.info("stopping the rank process %d (%s): SIGTERM, SIGKILL in %.0f s if it still runs", pid, why,
                    grace)
        _kill_session(pid, signal.SIGTERM)

        def escalate() -> None:
            if not self.exited.wait(grace):
                logger.warning("the rank process %d did not end within %.0f s of its SIGTERM; sending SIGKILL",
                               pid, grace)
                _kill_session(pid, signal.SIGKILL)

        threading.Thread(target=escalate, name=f"monarch-spmd-kill-{pid}", daemon=True).start()


def _kill_session(pid: int, sig: int) -> None:
    """``sig`` to every process of the session (process group) ``pid`` leads."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------- the rank processes of this proc

_running: dict[str, RankProcess] = {}  # the starting actor's key -> its running child
_running_lock = threading.Lock()
_subscribed: list[bool] = []


def _on_proc_stopping(why: str = "", **_: Any) -> None:
    with _running_lock:
        procs = list(_running.values())
    for rp in procs:
        rp.terminate(f"the proc is stopping: {why}" if why else "the proc is stopping")


def _on_actor_stopped(actor_key: str = "", actor_name: str = "", why: str = "", **_: Any) -> None:
    with _running_lock:
        rp = _running.get(actor_key)
    if rp is not None:
        rp.terminate(f"its actor {actor_name} stopped: {why}")


def register(key: str, rp: RankProcess) -> None:
    """Terminate ``rp`` when this proc begins to stop or the actor ``key`` stops (until :func:`unregister`)."""
    from monarch_core import runtime

    if not _subscribed:
        runtime.subscribe("proc_stopping", _on_proc_stopping)
        runtime.subscribe("actor_stopped", _on_actor_stopped)
        _subscribed.append(True)
    with _running_lock:
        _running[key] = rp


def unregister(key: str, rp: RankProcess) -> None:
    with _running_lock:
        if _running.get(key) is rp:
            del _running[key]
