"""One remote worker loop: started over an SSH exec channel, watched, stopped.

:class:`RemoteWorker` runs the bootstrap (``_bootstrap``) on the channel,
sends the worker's environment (credentials included) over the channel's
stdin, waits for the readiness line, then keeps pumping the channel's stdout
and stderr (the procs' output) to this process's, answers control
acknowledgements, and tells its owner when the host is lost: the worker
exited, the SSH connection closed, or keepalive requests went unanswered.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import paramiko

from monarch_core.errors import AllocationError
from monarch_core.hookspecs import WORKER_READY_PREFIX
from monarch_scheduler_ssh import _bootstrap
from monarch_scheduler_ssh._connect import Connection, Target

logger = logging.getLogger("monarch.ssh")

_TAIL = 8192


class _Stop(Exception):
    """The allocation is being given up (another host failed, cancelled)."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return
        view = view[n:]


def _read(recv: Callable[[int], bytes]) -> bytes | None:
    """One read of a channel stream: its bytes, ``b""`` at its end (EOF, the
    channel or connection closed), ``None`` when the read timed out -- a
    quiet worker, never an end (the channel is blocking, see ``_send``; this
    keeps a timeout set by anything else from being read as EOF)."""
    try:
        return recv(65536)
    except TimeoutError:  # socket.timeout: paramiko's timed-out read
        return None
    except (OSError, EOFError, paramiko.SSHException):
        return b""


class RemoteWorker:
    """The worker loop of one host (see the module docstring)."""

    def __init__(self, conn: Connection, target: Target, token: str, *, io_timeout: float) -> None:
        self.conn = conn
        self.target = target
        self.token = token
        self.io_timeout = io_timeout
        self.channel: paramiko.Channel | None = None
        self.hello: dict[str, Any] = {}
        self.cwd: str | None = None
        self.address: str | None = None
        self.worker_host: str | None = None
        self.python: str = ""
        self.ready = threading.Event()
        self.closing = False  # set by release: the end is expected
        self.lost: str | None = None
        #: the connection was given up on (keepalives unanswered): a worker may
        #: still run there, to kill once the host answers again (release)
        self.needs_reap = False
        self.on_lost: Callable[[str], None] | None = None
        self._events: queue.Queue = queue.Queue()
        self._stderr_tail = bytearray()
        self._stderr_held = bytearray()
        self._stdout_pre: list[str] = []
        self._acks: dict[int, threading.Event] = {}
        self._ack_ids = 0
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ping_since: float | None = None
        self._stopped = threading.Event()
        self._eof = threading.Event()

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def pid(self) -> int | None:
        pid = self.hello.get("pid")
        return int(pid) if isinstance(pid, int) else None

    # ------------------------------------------------------------ start

    def start(
        self,
        python: str,
        make_setup: Callable[[RemoteWorker], tuple[list[str], Mapping[str, str], str | None]],
        deadline: float,
        stop: Callable[[], bool],
    ) -> str:
        """Run the bootstrap, send the setup (``make_setup(self)`` after the
        hello: argv, env, cwd), wait for the readiness line; return the
        worker's address.  ``AllocationError`` naming the host."""
        self.python = python
        what = f"host {self.name!r} ({self.target.where})"
        try:
            ch = self.conn.exec(_bootstrap.remote_command(python, _bootstrap.STAGE_ONE, self.token), self.io_timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise AllocationError(f"{what}: the SSH server did not run the bootstrap: {type(e).__name__}: {e}") from None
        self.channel = ch
        threading.Thread(target=self._pump_stdout, name=f"monarch-ssh-out-{self.name}", daemon=True).start()
        threading.Thread(target=self._pump_stderr, name=f"monarch-ssh-err-{self.name}", daemon=True).start()
        self.hello = self._wait("hello", deadline, stop, what)
        argv, env, cwd = make_setup(self)
        setup = {"cwd": cwd, "env": dict(env), "argv": list(argv), "token": self.token,
                 "stage2": _bootstrap.python_c(_bootstrap.STAGE_TWO)}
        self._send(json.dumps(setup) + "\n", what)  # secrets: over the encrypted channel, never logged
        self.cwd = self._wait("cwd", deadline, stop, what).get("cwd")
        self.address = self._wait("ready", deadline, stop, what)["address"]
        with self._lock:
            held, self._stderr_held = bytes(self._stderr_held), bytearray()
            self.ready.set()
        if held:
            _write_all(2, held)
        return self.address

    def _send(self, line: str, what: str) -> None:
        assert self.channel is not None
        data = line.encode()
        try:
            with self._send_lock:
                # paramiko keeps one timeout per channel, for writes and reads alike: bound this
                # write, then put the channel back to blocking, or the pumps' reads would time out
                # after io_timeout of silence (an idle mesh)
                self.channel.settimeout(self.io_timeout)
                try:
                    self.channel.sendall(data)
                finally:
                    self.channel.settimeout(None)
        except TimeoutError:
            raise AllocationError(f"{what}: writing to the SSH channel did not finish within {self.io_timeout:g}s "
                                  "(io_timeout)") from None
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise AllocationError(f"{what}: the SSH channel closed while sending to it: {e}") from None

    def _wait(self, kind: str, deadline: float, stop: Callable[[], bool], what: str) -> dict[str, Any]:
        while True:
            if stop():
                raise _Stop()
            left = deadline - time.monotonic()
            if left <= 0:
                raise AllocationError(
                    f"{what}: the worker loop did not start within the allocation timeout (waiting for its "
                    f"{'readiness line' if kind == 'ready' else kind + ' line'})" + self._tails()
                )
            try:
                ev, obj = self._events.get(timeout=min(0.2, left))
            except queue.Empty:
                continue
            if ev == kind:
                return obj
            if ev == "error":
                raise AllocationError(self._error_message(what, obj))
            if ev == "eof":
                raise AllocationError(self._exit_message(what))

    def _exit_status(self, wait: float) -> int | None:
        ch = self.channel
        if ch is None:
            return None
        if ch.status_event.wait(wait):
            return ch.recv_exit_status()
        return None

    def _tails(self) -> str:
        out = ""
        if self._stdout_pre:
            out += "; its output:\n  " + "\n  ".join(self._stdout_pre[-8:])
        err = bytes(self._stderr_tail).decode(errors="replace").strip()
        if err:
            lines = err.splitlines()[-15:]
            out += "; its stderr ends with:\n  " + "\n  ".join(lines)
        return out

    def _exit_message(self, what: str) -> str:
        if not self.conn.is_active():
            return f"{what}: the SSH connection closed before the worker loop listened" + self._tails()
        status = self._exit_status(2.0)
        if status == 127 and not self.hello:
            return (f"{what}: the remote Python {self.python!r} was not found there (exit status 127). Set "
                    f"python = \"/path/to/python\" in the entry to an interpreter on that host that has monarch-core "
                    "installed" + self._tails())
        if status == 126 and not self.hello:
            return (f"{what}: the remote Python {self.python!r} cannot be run there (exit status 126: not "
                    "executable?); set python = ..." + self._tails())
        if not self.hello:
            return (f"{what}: the remote Python {self.python!r} exited with status {status} before running the "
                    "bootstrap (is it Python 3?)" + self._tails())
        return f"{what}: the worker loop exited with status {status} before it listened" + self._tails()

    def _error_message(self, what: str, obj: Mapping[str, Any]) -> str:
        kind = obj.get("kind")
        if kind == "module":
            path = ", ".join(str(p) for p in obj.get("path", []) if p) or "(empty)"
            why = f" ({obj['message']})" if obj.get("message") else ""
            return (
                f"{what}: the remote Python {obj.get('python')!r} (Python {obj.get('version')}) cannot import "
                f"{obj.get('module')}{why}: monarch-core is not installed for it. Install monarch-core and "
                "monarch-transport-tcp on that host (pip install ./ ./plugins/transport_tcp from a checkout), or set "
                "python = ... to an interpreter that has them, or env = { PYTHONPATH = ... } to where they are. "
                f"Its sys.path: {path}"
            )
        if kind == "cwd":
            return (f"{what}: cannot use the working directory {obj.get('cwd')!r} there: {obj.get('message')}; "
                    "set cwd = ... to a directory the user can create or enter")
        return f"{what}: the bootstrap failed ({kind}): {obj.get('message')}" + self._tails()

    # ------------------------------------------------------------ pumps

    def _pump_stdout(self) -> None:
        ch = self.channel
        assert ch is not None
        buf = b""
        ready_prefix = WORKER_READY_PREFIX.encode()
        mark = _bootstrap.MARK.encode()
        found = False  # the readiness line went by: the rest is the worker's and its procs' output
        while True:
            chunk = _read(ch.recv)
            if chunk is None:
                continue  # silence is not the end: only EOF or a closed channel is
            if not chunk:
                break
            buf += chunk
            lines = buf.split(b"\n")
            buf = lines.pop()
            out = []
            for line in lines:
                if line.startswith(mark):
                    self._control_line(line)
                elif found:
                    out.append(line + b"\n")
                elif line.startswith(ready_prefix):
                    found = True
                    self._events.put(("ready", {"address": line[len(ready_prefix):].decode().strip()}))
                else:
                    self._stdout_pre.append(line.decode(errors="replace"))
                    del self._stdout_pre[:-50]
            if found and buf and not mark.startswith(buf[: len(mark)]):
                out.append(buf)  # a partial line (a progress bar's "\r"): pass it on now
                buf = b""
            if out:
                _write_all(1, b"".join(out))
        if buf and found:
            _write_all(1, buf)
        self._eof.set()
        self._events.put(("eof", None))
        self._ended()

    def _control_line(self, line: bytes) -> None:
        try:
            obj = json.loads(line.decode())
        except ValueError:
            return
        kind = obj.get("monarch_ssh")
        if kind == "ack":
            if obj.get("token") != self.token:
                return
            with self._lock:
                ev = self._acks.pop(obj.get("id"), None)
            if ev is not None:
                ev.set()
        elif isinstance(kind, str):
            self._events.put((kind, obj))

    def _pump_stderr(self) -> None:
        ch = self.channel
        assert ch is not None
        while True:
            chunk = _read(ch.recv_stderr)
            if chunk is None:
                continue
            if not chunk:
                return
            with self._lock:
                self._stderr_tail += chunk
                del self._stderr_tail[:-_TAIL]
                if not self.ready.is_set():
                    self._stderr_held += chunk
                    del self._stderr_held[:-(1 << 20)]
                    continue
            _write_all(2, chunk)

    # ------------------------------------------------------------ while in use

    def control(self, op: Mapping[str, Any]) -> None:
        """Send a control line to the worker's bootstrap and wait for its
        acknowledgement (``io_timeout``)."""
        what = f"host {self.name!r} ({self.target.where})"
        with self._lock:
            self._ack_ids += 1
            ident = self._ack_ids
            ev = self._acks[ident] = threading.Event()
        self._send(json.dumps({**op, "id": ident}) + "\n", what)
        if not ev.wait(self.io_timeout):
            with self._lock:
                self._acks.pop(ident, None)
            raise AllocationError(f"{what}: its worker did not acknowledge {op.get('op')!r} within "
                                  f"{self.io_timeout:g}s (io_timeout)")

    def start_keepalive(self) -> None:
        """Send keepalive requests every ``keepalive_interval`` s; the owner's
        monitor calls :meth:`check_keepalive`."""
        if self.target.keepalive_interval <= 0:
            return
        threading.Thread(target=self._pinger, name=f"monarch-ssh-ping-{self.name}", daemon=True).start()

    def _pinger(self) -> None:
        try:
            t = self.conn.transport
        except EOFError:
            return
        while not self._stopped.wait(self.target.keepalive_interval):
            if not t.is_active():
                return
            self._ping_since = time.monotonic()
            try:
                t.global_request("keepalive@openssh.com", wait=True)  # OpenSSH answers "failure": an answer
            except Exception:  # noqa: BLE001 - a broken transport: the stdout pump reports it
                return
            self._ping_since = None

    def check_keepalive(self, now: float) -> None:
        """Declare the host lost when a keepalive request went unanswered for
        ``keepalive_interval * keepalive_count`` s (the network is down)."""
        since = self._ping_since
        limit = self.target.keepalive_interval * self.target.keepalive_count
        if since is None or self.closing or self.lost is not None or now - since < limit:
            return
        self.needs_reap = True
        self._lose(
            f"its SSH server ({self.target.where}) did not answer keepalives for {now - since:.0f}s "
            f"(keepalive_interval={self.target.keepalive_interval:g} x keepalive_count={self.target.keepalive_count}): "
            "network down, or the host hung"
        )
        self.conn.close()  # stop waiting on it; the worker there is reaped at release if the host comes back

    def _ended(self) -> None:
        if self.closing or not self.ready.is_set() or self.lost is not None:
            return  # expected, not started yet, or already lost (keepalives: the connection was closed on purpose)
        if not self.conn.is_active():
            exc = self.conn.exception()
            self._lose(f"its SSH connection ({self.target.where}) closed"
                       + (f": {exc}" if exc else " (sshd stopped, the host rebooted, or the network reset it)"))
            return
        status = self._exit_status(5.0)
        how = "was killed by a signal" if status in (None, -1) else f"exited with status {status}"
        self._lose(f"its worker loop (pid {self.pid}) {how}" + self._tails())

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self.lost is not None or self.closing:
                return
            self.lost = reason
            cb = self.on_lost
        self._stopped.set()
        if cb is not None:
            cb(reason)

    # ------------------------------------------------------------ stop

    def stop(self) -> None:
        """Expected end: close the channel's stdin (the bootstrap then ends the
        worker, whose procs die with it)."""
        self.closing = True
        self._stopped.set()
        ch = self.channel
        if ch is not None:
            try:
                ch.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                pass

    def wait_ended(self, timeout: float) -> bool:
        """Has the worker's channel ended within ``timeout`` s?"""
        if self.channel is None:
            return True
        return self._eof.wait(timeout)
