"""The spawner's side of the fork server: :class:`ForkServer` (one per
kernel) starts a zygote process (``_zygote``, whose docstring tells the whole
design), asks it to fork procs, and sees each forked proc as a
:class:`ForkedChild`; :func:`runtime_with_fork_server` (``this_host()``) and
:func:`start_early`/:func:`prestart` (the worker loop) start the zygote
before the first spawn so that its imports overlap with the caller's work.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any

from monarch_core import settings
from monarch_core._launch._children import close_pidfd
from monarch_core._launch._zygote import _recv, _send

if TYPE_CHECKING:
    import trio

    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.proc")

#: ``MONARCH_FORK_SERVER=0`` (in the spawning process) starts every proc with exec.
OPT_OUT_ENV = "MONARCH_FORK_SERVER"
#: Environment variables read when the interpreter starts or when monarch's
#: modules are imported (``MONARCH_*`` module constants): a zygote only forks
#: procs that agree with it on all of them.
_STARTUP_PREFIXES = ("PYTHON", "LD_", "MONARCH_", "MALLOC_", "LC_")
_STARTUP_NAMES = frozenset({"LANG", "LANGUAGE", "TZ"})
#: Per-proc variables that are set after start-up.
_PER_PROC = frozenset({"MONARCH_PROC_BOOTSTRAP", "MONARCH_PROC_ID", OPT_OUT_ENV})
#: Seconds a new zygote may take to import everything and say it is ready.
READY_TIMEOUT = 30.0
#: Modules of the layers above that the fork server imports before its first
#: fork (user actor modules import ``monarch_core.actor``): see :func:`warm`.
warm_modules: tuple[str, ...] = ()
#: Seconds the procs of a dead zygote get to die of their death signal.
ORPHAN_GRACE = 5.0


def warm(modules: tuple[str, ...]) -> None:
    """Have fork servers started from now on import ``modules`` before their
    first fork.  The mesh API calls it (``this_host()``, the worker loop's
    main) with its own modules: the launch layer names nothing above it."""
    global warm_modules
    warm_modules = tuple(modules)


def startup_fingerprint(env: Any) -> tuple:
    """The part of ``env`` a forked proc would inherit from the zygote's start."""
    return tuple(sorted(
        (k, v) for k, v in env.items()
        if (k.startswith(_STARTUP_PREFIXES) or k in _STARTUP_NAMES) and k not in _PER_PROC
    ))


def enabled() -> bool:
    return (
        settings.get(OPT_OUT_ENV)
        and sys.platform.startswith("linux")
        and hasattr(os, "pidfd_open")
        and hasattr(signal, "pidfd_send_signal")
        and hasattr(socket, "send_fds")
    )


class ForkServerUnavailable(Exception):
    """This proc cannot be forked now (the caller starts it with exec)."""


class ForkedChild:
    """A proc forked by a zygote, with the interface of ``monarch_core._launch._children.Child``:
    ``pid``, ``returncode`` (``Popen`` convention), ``wait()`` (any number of
    tasks), ``terminate()``, ``kill()``.  Signals go through a pidfd."""

    def __init__(self, server: _Zygote, pid: int, pidfd: int | None) -> None:
        import trio

        self.pid = pid
        self.fork_server_pid = server.pid
        self._pidfd = pidfd
        self._rc: int | None = None
        self._done = trio.Event()
        #: why it ended, when that is not its own doing (appended to its status)
        self.exit_note: str | None = None

    @property
    def returncode(self) -> int | None:
        return self._rc

    async def wait(self) -> int:
        await self._done.wait()
        return self._rc  # type: ignore[return-value]

    def _exited(self, rc: int, note: str | None = None) -> None:
        if self._rc is not None:
            return
        self._rc = rc
        self.exit_note = note
        close_pidfd(self)
        self._done.set()

    def _signal(self, sig: int) -> None:
        if self._rc is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def __repr__(self) -> str:
        return f"<ForkedChild pid {self.pid} from fork server {self.fork_server_pid} rc={self._rc}>"


class _Zygote:
    """One zygote process, as seen from its spawner (kernel loop)."""

    def __init__(self, env: dict[str, str], transport: str | None, *, fork: bool = False) -> None:
        """Start the zygote process (its death signal follows the calling
        thread: the kernel thread, or the main thread for an early start).
        ``fork``: fork it from this process instead of starting a new
        interpreter (see :func:`start_early`)."""
        import itertools
        import subprocess

        self.env = env
        self.fingerprint = startup_fingerprint(env)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            if fork:
                self.popen: Any = _ForkedZygote(mine, theirs)
            else:
                self.popen = subprocess.Popen(
                    [sys.executable, "-m", "monarch_core._launch._zygote", str(theirs.fileno()), str(os.getpid())],
                    env=env, start_new_session=True, pass_fds=(theirs.fileno(),),
                )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.pid = self.popen.pid
        mine.setblocking(False)
        self.sock = mine
        self.ready: Any = None
        self.broken: str | None = None
        self.was_ready = False
        self.retiring = False
        self.children: dict[int, ForkedChild] = {}
        self.pending: dict[int, list] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._send_lock: trio.Lock | None = None  # a trio.Lock, made on the loop thread at the first request
        _send(mine, ("config", [p for p in sys.path if p], transport, list(warm_modules)))
        logger.debug("started fork server pid %d", self.pid)

    def attach(self, kernel: Kernel) -> None:
        """Serve ``kernel`` (loop thread): start reading the zygote's reports."""
        import trio

        self.ready = trio.Event()
        kernel.start_task(self._read)
        try:  # the plugins this process resolved: the zygote need not scan for them
            from monarch_core._plugins import registry

            _send(self.sock, ("plugins", registry().resolved()))
        except (OSError, ValueError) as e:  # gone, or not marshallable: it scans itself
            logger.debug("could not send the plugin list to fork server pid %d: %s", self.pid, e)

    def discard(self) -> None:
        """Drop a zygote that was never attached (any thread)."""
        self.sock.close()
        self._kill()

    def _kill(self) -> None:
        """Kill the zygote if it still runs, and reap it (blocking)."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()

    # -- requests ------------------------------------------------------
    async def fork(self, env: dict[str, str], cwd: str | None) -> ForkedChild:
        import trio

        if not self.ready.is_set():
            with trio.move_on_after(READY_TIMEOUT):
                await self.ready.wait()
            if not self.ready.is_set():
                self._set_broken(f"it did not start within {READY_TIMEOUT:.0f}s")
                self._shut(kill=True)
        self._check_usable()
        base = self.env
        env_set = {k: v for k, v in env.items() if base.get(k) != v}
        env_unset = [k for k in base if k not in env]
        targets = []
        for fd in (0, 1, 2):
            try:
                os.fstat(fd)
                targets.append(fd)
            except OSError:
                pass
        return await self._request(("fork", env_set, env_unset, cwd, targets), targets)

    async def info(self) -> dict:
        """What the zygote has imported, its threads and children (for tests and debugging)."""
        await self.ready.wait()
        self._check_usable()
        return await self._request(("info",), [])

    def _check_usable(self) -> None:
        if self.broken is not None:
            raise ForkServerUnavailable(f"fork server (pid {self.pid}) {self.broken}")

    async def _request(self, msg: tuple, fds: list[int]) -> Any:
        """Send ``msg`` (its op, then its arguments) under a new request id
        and wait for the answer (a fork: its ``ForkedChild``)."""
        import trio

        req_id = next(self._ids)
        entry: list = [trio.Event(), None]  # resolved (and removed) by _handle / _gone
        self.pending[req_id] = entry
        try:
            # one writer at a time: with the socket's buffer full, every other
            # request would wait on the same fd, which trio refuses
            # (BusyResourceError) -- hundreds of procs spawned at once do that
            if self._send_lock is None:
                self._send_lock = trio.Lock()
            async with self._send_lock:
                while True:
                    self._check_usable()
                    try:
                        _send(self.sock, (msg[0], req_id, *msg[1:]), fds)
                        break
                    except BlockingIOError:
                        await trio.lowlevel.wait_writable(self.sock)
                    except OSError as e:
                        raise ForkServerUnavailable(f"cannot send to fork server (pid {self.pid}): {e}") from None
            await entry[0].wait()
            result = entry[1]
        finally:
            self.pending.pop(req_id, None)  # a fork answered after this is killed (see _handle)
        if isinstance(result, BaseException):
            raise result
        return result

    # -- the reader ----------------------------------------------------
    async def _read(self) -> None:
        import trio

        try:
            while not self._closed:
                await trio.lowlevel.wait_readable(self.sock)
                while not self._closed:
                    try:
                        msg, fds = _recv(self.sock)
                    except BlockingIOError:
                        break
                    if msg is None:
                        raise EOFError
                    self._handle(msg, fds)
        except (EOFError, ConnectionError, trio.ClosedResourceError):  # closed by it, or by us
            pass
        except trio.Cancelled:  # the kernel is stopping: so does the zygote
            self._shut(kill=False)
            try:  # it exits when it sees the socket closed: reap it
                self.popen.wait(timeout=1.0)
            except Exception:  # noqa: BLE001
                self._kill()
            raise
        except Exception:
            logger.exception("reading from fork server pid %d", self.pid)
        try:
            await self._gone()
        except trio.Cancelled:
            self._kill()
            raise

    def _handle(self, msg: tuple, fds: list[int]) -> None:
        op = msg[0]
        if op == "forked":
            _op, req_id, pid = msg
            child = ForkedChild(self, pid, fds[0] if fds else None)
            for extra in fds[1:]:
                os.close(extra)
            self.children[pid] = child
            if not self._answer(req_id, child):  # its spawn was cancelled
                child.kill()
            return
        for f in fds:
            os.close(f)
        if op == "exit":
            _op, pid, rc = msg
            ended = self.children.pop(pid, None)
            if ended is not None:
                ended._exited(rc)
            if self.retiring and not self.children and not self.pending:
                self._shut(kill=False)
        elif op in ("failed", "info"):
            self._answer(msg[1], ForkServerUnavailable(msg[2]) if op == "failed" else msg[2])
        elif op == "ready":
            self.was_ready = True
            self.ready.set()
        elif op == "broken":
            self._set_broken(msg[1])

    def _answer(self, req_id: int, value: Any) -> bool:
        """Resolve the pending request ``req_id`` with ``value`` (an exception
        is raised to its caller); False when nobody waits for it any more."""
        p = self.pending.pop(req_id, None)
        if p is not None:
            p[1] = value
            p[0].set()
        return p is not None

    def _set_broken(self, why: str) -> None:
        """The zygote cannot fork procs (``why``): procs start with exec."""
        self.broken = f"cannot fork procs: {why}"
        logger.warning("monarch fork server (pid %d) %s; starting procs with exec", self.pid, self.broken)
        self.ready.set()

    def retire(self) -> None:
        """Stop using this zygote; it exits once its procs are gone."""
        self.retiring = True
        if not self.children and not self.pending:
            self._shut(kill=False)

    def _shut(self, *, kill: bool) -> None:
        """Close our end (the zygote exits when it sees that) (loop thread)."""
        import trio

        if self._closed:
            return
        self._closed = True
        trio.lowlevel.notify_closing(self.sock)
        self.sock.close()
        if kill and self.popen.poll() is None:
            self.popen.kill()

    async def _gone(self) -> None:
        """The socket is closed: the zygote is dead or exiting.  Reap it and
        fail what still depended on it."""
        import trio

        self._shut(kill=False)
        with trio.move_on_after(2.0):
            while self.popen.poll() is None:
                await trio.sleep(0.01)
        self._kill()
        rc = self.popen.returncode
        if rc < 0:
            try:
                status = f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                status = f"was killed by signal {-rc}"
        else:
            status = f"exited with code {rc}"
        if self.broken is None:
            self.broken = f"is gone (it {status})"
        self.ready.set()
        for req_id in list(self.pending):
            self._answer(req_id, ForkServerUnavailable(f"fork server (pid {self.pid}) {status}"))
        orphans = [c for c in self.children.values() if c.returncode is None]
        self.children.clear()
        if orphans:
            note = f"the fork server that started it (pid {self.pid}) {status}, which kills its procs"
            logger.warning("monarch fork server (pid %d) %s with %d procs", self.pid, status, len(orphans))
            async with trio.open_nursery() as n:
                for c in orphans:
                    n.start_soon(_await_orphan, c, note)
        else:
            logger.debug("fork server pid %d %s", self.pid, status)


async def _await_orphan(child: ForkedChild, note: str) -> None:
    """A proc whose zygote died dies of its death signal: wait for that
    (its pidfd), kill it if it lingers, and report it killed."""
    import trio

    if child._pidfd is not None:
        with trio.move_on_after(ORPHAN_GRACE):
            await trio.lowlevel.wait_readable(child._pidfd)
        child._signal(signal.SIGKILL)
        with trio.move_on_after(ORPHAN_GRACE):
            await trio.lowlevel.wait_readable(child._pidfd)
    child._exited(-signal.SIGKILL, note)


class _ForkedZygote:
    """A zygote forked from this process (the ``Popen`` interface the rest
    uses: ``pid``, ``returncode``, ``poll``, ``wait``, ``kill``).  The child
    closes the spawner's end and serves; it never returns into the caller."""

    def __init__(self, mine: socket.socket, theirs: socket.socket) -> None:
        from monarch_core._launch import _zygote

        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the zygote: serve() ends the process (a proc forked from it leaves by SystemExit)
            mine.close()
            os.setsid()
            _zygote.serve(theirs.detach(), parent)
            os._exit(70)  # pragma: no cover - serve() does not return
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                import subprocess

                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ForkServer:
    """The spawning process's fork server (one per kernel, kernel loop only):
    starts a zygote on first use, replaces one that died or whose start-up
    environment no longer matches this process's, gives up (exec only) if a
    zygote cannot start."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.current: _Zygote | None = None
        self.disabled: str | None = None

    def start(self) -> _Zygote | None:
        """Make sure a zygote runs (loop thread); ``None`` if there can be none."""
        if self.disabled is not None:
            return None
        z = self.current
        if z is not None and z.broken is not None:
            if not z.was_ready:  # it never served: do not try again and again
                self.disabled = z.broken
                return None
            z.retire()
            z = self.current = None
        if z is None:
            early = _take_early()
            if early is not None:
                if early.popen.poll() is None and early.fingerprint == startup_fingerprint(os.environ):
                    early.attach(self.kernel)
                    self.current = early
                    return early
                early.discard()
            try:
                from monarch_core._proc import _state

                rt = _state.current_runtime_or_none()
                transport = rt.transport if rt is not None else None
                # On the kernel thread, like procs: the zygote's death signal is
                # tied to the thread that starts it.
                z = _Zygote(dict(os.environ), transport)
                z.attach(self.kernel)
                self.current = z
            except Exception as e:  # noqa: BLE001
                self.disabled = f"could not start a fork server: {type(e).__name__}: {e}"
                logger.warning("%s; starting procs with exec", self.disabled)
                return None
        return z

    def for_env(self, env: dict[str, str]) -> _Zygote | None:
        """The zygote that can fork a proc with ``env``, or ``None`` (exec)."""
        z = self.start()
        if z is None:
            return None
        fp = startup_fingerprint(env)
        if fp == z.fingerprint:
            return z
        if fp == startup_fingerprint(os.environ):
            # This process's environment changed since the zygote started.
            logger.debug("environment changed; replacing fork server pid %d", z.pid)
            z.retire()
            self.current = None
            z = self.start()
            return z if z is not None and z.fingerprint == fp else None
        return None  # this proc's own overrides change start-up variables


def server_of(kernel: Kernel) -> ForkServer:
    """The kernel's fork server object (created on first use, thread-safe)."""
    s = kernel.__dict__.get("_fork_server")
    if s is None:
        s = kernel.__dict__.setdefault("_fork_server", ForkServer(kernel))
    return s


_early: _Zygote | None = None
_early_lock = threading.Lock()


def start_early(*, fork: bool = False) -> None:
    """Start a zygote before this process's runtime exists (``this_host()``
    on the main thread, before the runtime imports trio), so that its imports
    overlap with the runtime's; the kernel adopts it (:func:`prestart`).  Only
    on the main thread, which lives as long as the process: the zygote's death
    signal is tied to the thread that starts it.

    ``fork=True`` (a worker loop, which has imported what a proc needs and
    started no thread of its own yet): fork the zygote from this process, so
    that it costs no second interpreter start and no second import of the
    proc runtime."""
    global _early
    from monarch_core._proc import _state, _transport

    if (
        _state.current_runtime_or_none() is not None
        or _state.is_shut_down()
        or threading.current_thread() is not threading.main_thread()
        or not enabled()
    ):
        return
    with _early_lock:
        if _early is not None:
            return
        choice = _transport.enabled_choice()
        try:
            _early = _Zygote(dict(os.environ), choice.name if choice is not None else "ipc", fork=fork)
        except Exception as e:  # noqa: BLE001 - the kernel tries again later
            logger.debug("could not start the fork server early: %s", e)


def _take_early() -> _Zygote | None:
    global _early
    with _early_lock:
        z, _early = _early, None
    return z


def runtime_with_fork_server(warm_modules: tuple[str, ...]) -> Any:
    """This process's runtime (started by ``_start.ensure_runtime()``), with a fork server
    on its way for the procs this host will start (``this_host()``): a
    zygote started before the runtime (:func:`start_early`, importing
    ``warm_modules`` too: :func:`warm`), adopted by its kernel (:func:`prestart`),
    so that the zygote's imports overlap with the runtime's start and with
    the caller's work before its first spawn.  Nothing starts before this
    is called: importing the API starts no process."""
    from monarch_core._launch import _start
    from monarch_core._proc import _state

    warm(warm_modules)
    start_early()
    try:
        _start.ensure_runtime()
        rt = _state.current()
    except BaseException:  # no runtime: the zygote started for it goes too
        z = _take_early()
        if z is not None:
            z.discard()
        raise
    prestart(rt.kernel)
    return rt


def prestart(kernel: Kernel) -> None:
    """Start the kernel's zygote now, from any thread, so its imports overlap
    with whatever the caller does before its first spawn."""
    if kernel.__dict__.get("_fork_server") is not None or not enabled():
        return
    s = server_of(kernel)
    if kernel.in_loop():
        s.start()
    else:
        kernel.call_soon(s.start)
