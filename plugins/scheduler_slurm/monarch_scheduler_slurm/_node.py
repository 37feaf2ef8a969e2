"""The task of the worker step on each node:
``python -m monarch_scheduler_slurm._node SESSION_DIR [--signal USR2]``.

Standard library only (it starts before anything else on the node).  It

1. prints ``@@monarch-slurm hello NODE STEP PID`` (the client learns which
   ``srun --label`` task is which node);
2. reads its launch file ``SESSION_DIR/NODE.json`` (mode 0600, in the 0700
   session directory the client made on the shared filesystem: the worker's
   command line and its TLS key and certificate, issued for this node
   alone) and removes it at once -- no secret on a command line, in the job's
   environment (which slurmctld stores), or left on disk; the last node to
   read its file removes the emptied directory (a client killed outright
   leaves nothing behind);
3. starts the worker loop as its child with those credentials in the
   child's environment, ``PYTHONUNBUFFERED=1``, its standard streams the
   step's (so everything it and its procs print reaches the client, labelled)
   and the warning signal *ignored* (inherited by the procs: Slurm signals
   every process of the step, and a proc must not die of the warning).
   The child is *forked* from this process, which runs the worker's
   ``python -m MODULE`` (or ``-c CODE``) in it as a fresh interpreter would
   (``runpy``): one interpreter start per node, not two.  Only when the
   command names another interpreter, or its environment changes a variable
   the interpreter reads as it starts (``PYTHON*`` but ``PYTHONUNBUFFERED``,
   ``LD_*``), is the child an ``exec`` of the command, so that those apply.
   A forked worker loop has this launcher's command line and the process
   name (``ps -o comm``) ``monarch-worker``;
4. on the warning signal (``--signal``: Slurm's ``--signal=SIG@SECONDS``)
   prints ``@@monarch-slurm notice NODE SIG`` once -- the client turns it
   into a notice for the host mesh's owner;
5. when the worker loop exits, prints ``@@monarch-slurm exit NODE RC`` and
   exits with its code; SIGTERM/SIGINT are passed on to it.

A missing launch file (a ``state_dir`` that is not shared with the node)
ends it with ``@@monarch-slurm error NODE MESSAGE`` and exit code 2.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

MARK = "@@monarch-slurm "
#: The process name (``/proc/PID/comm``) of a worker loop forked from this
#: launcher, whose command line is the launcher's (an exec'd one shows
#: ``python -m monarch_core.worker``).
COMM = "monarch-worker"
#: Seconds to wait for the launch file (a shared filesystem may show a new
#: file on another node a little late).
FILE_WAIT = 30.0


def say(*words: object) -> None:
    sys.stdout.write(MARK + " ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def _read_launch(path: str, node: str) -> dict:
    deadline = time.monotonic() + FILE_WAIT
    delay = 0.005
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"no launch file {path} on {node} after {FILE_WAIT:.0f}s: the slurm scheduler's state_dir must "
                    "be on a filesystem every node shares (set state_dir in the [hosts] entry)"
                ) from None
            time.sleep(delay)
            delay = min(0.1, delay * 2)
            continue
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))  # the last node to read removes the (then empty) session directory
        except OSError:
            pass
        return data


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--signal"):
        print("usage: python -m monarch_scheduler_slurm._node SESSION_DIR [--signal SIGNAME]", file=sys.stderr)
        return 2
    session = argv[0]
    warn = getattr(signal, "SIG" + argv[2]) if len(argv) == 3 else None
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    say("hello", node, os.environ.get("SLURM_STEP_ID", "?"), os.getpid())
    warned: list[int] = []
    child: list[subprocess.Popen | _Forked] = []

    def on_warning(signum: int, frame: object) -> None:
        if not warned:
            warned.append(signum)
            say("notice", node, signal.Signals(signum).name)

    def on_end(signum: int, frame: object) -> None:
        if child and child[0].poll() is None:
            child[0].send_signal(signum)
        else:
            sys.exit(128 + signum)

    if warn is not None:
        signal.signal(warn, on_warning)
    signal.signal(signal.SIGTERM, on_end)
    signal.signal(signal.SIGINT, on_end)
    try:
        data = _read_launch(os.path.join(session, f"{node}.json"), node)
    except (RuntimeError, OSError, ValueError) as e:
        say("error", node, str(e).replace("\n", " "))
        return 2
    env = dict(os.environ)
    env.update(data["env"])
    env["PYTHONUNBUFFERED"] = "1"
    argv = list(data["argv"])
    del data
    handled = [s for s in (warn, signal.SIGTERM, signal.SIGINT) if s is not None]
    if in_process(argv, env):
        # Signals wait until the child is known: a SIGTERM between fork and
        # the child's own dispositions must neither run our handler there nor be lost.
        signal.pthread_sigmask(signal.SIG_BLOCK, handled)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            become_worker(argv, env, warn, unblock=handled)  # never returns
        child.append(_Forked(pid))
        del env
        signal.pthread_sigmask(signal.SIG_UNBLOCK, handled)
    else:
        def ignore_warning() -> None:  # in the child: ignored dispositions survive exec
            if warn is not None:
                signal.signal(warn, signal.SIG_IGN)

        try:
            child.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, preexec_fn=ignore_warning))
        except OSError as e:
            say("error", node, f"cannot start the worker loop {argv[:3]}: {e}")
            return 2
        del env
    rc = child[0].wait()
    say("exit", node, rc)
    return rc if rc >= 0 else 128 - rc


#: Variables the interpreter reads only as it starts (and which a forked
#: child would therefore not honour): a worker whose environment changes one
#: is exec'd.  ``PYTHONUNBUFFERED`` is applied to a forked child's streams.
def _startup_vars(env: Mapping[str, str]) -> set[str]:
    return {k for k in env if k.startswith(("PYTHON", "LD_")) and k != "PYTHONUNBUFFERED"}


def in_process(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether the worker command can run in a child forked from this
    interpreter instead of a new one: ``[this python, "-m", MODULE, ...]``
    (or ``"-c", CODE``) with the same start-up variables."""
    if len(argv) < 3 or argv[1] not in ("-m", "-c") or not sys.executable:
        return False
    if os.path.abspath(argv[0]) != os.path.abspath(sys.executable):
        return False
    return all(env.get(k) == os.environ.get(k) for k in _startup_vars(env) | _startup_vars(os.environ))


def become_worker(argv: Sequence[str], env: Mapping[str, str], warn: signal.Signals | None, *,
                  unblock: Sequence[signal.Signals]) -> None:
    """In the forked child: become ``argv`` as a fresh interpreter would run
    it -- its environment, stdin from ``/dev/null``, default signal
    dispositions but the warning's (ignored), ``sys.argv``, ``__main__`` --
    and exit the way the interpreter does: a ``SystemExit`` (or an uncaught
    error) unwinds to the top, where the interpreter's own exit runs
    (threads joined, ``atexit`` handlers, streams flushed)."""
    try:  # what ps -o comm and top show (its command line is this launcher's)
        with open("/proc/self/comm", "w") as f:
            f.write(COMM)
    except OSError:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if warn is not None:
        signal.signal(warn, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(env)
    if env.get("PYTHONUNBUFFERED") and not getattr(sys.stdout, "write_through", True):
        _unbuffered_streams()
    mode, what = argv[1], argv[2]
    if mode == "-m":
        import importlib.util
        import runpy

        try:
            found = importlib.util.find_spec(what) is not None
        except ImportError:
            found = False
        if not found:  # as `python -m` says it
            sys.stderr.write(f"{sys.executable}: No module named {what}\n")
            raise SystemExit(1)
        sys.argv = [what, *argv[3:]]  # runpy puts the module's path in argv[0]
        runpy.run_module(what, run_name="__main__", alter_sys=True)
    else:
        import types

        import builtins

        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = main
        sys.argv = ["-c", *argv[3:]]
        sys.path[0] = ""  # what `python -c` puts first
        exec(compile(what, "<string>", "exec"), main.__dict__)
    raise SystemExit(0)  # the command ended without sys.exit: as an interpreter would


def _unbuffered_streams() -> None:
    """``PYTHONUNBUFFERED=1`` for a forked interpreter: stdout and stderr write through."""
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        if old is None:
            continue
        old.flush()
        raw = io.FileIO(old.fileno(), "w", closefd=False)
        new = io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, write_through=True,
                               line_buffering=False)
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


class _Forked:
    """The forked worker, as much of ``Popen`` as :func:`main` uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            try:
                _, status = os.waitpid(self.pid, 0)  # EINTR is retried, after our signal handlers ran ...
            except ChildProcessError:
                if self.returncode is None:
                    raise
                break  # ... one of which reaped it (poll)
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:  # reaped meanwhile by :meth:`wait`, which this handler interrupted
                pass

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
