"""The fork server ("zygote"): procs forked from a Python process that has
already imported what a proc needs.

Starting a proc as a fresh ``python -m monarch_core._launch._proc_main`` costs
the interpreter's start-up plus the imports of trio and the kernel (~0.3 s of
CPU).  A spawning process instead starts, once, a *zygote*: a child process
(``python -m monarch_core._launch._zygote``, started like a proc from the
kernel thread) that imports all of that, then waits for fork requests on a
``SOCK_SEQPACKET`` socket pair inherited from its spawner.  Each request
carries what :func:`~monarch_core._launch._spawn.start_proc` would give a new
process: the environment (as changes to the zygote's own, which is the
spawner's at the time the zygote started), the working directory, and the
spawner's standard streams (passed as file descriptors, so output goes where
an exec'd proc's would).  The forked child becomes what an exec'd proc is:
new session, that environment and directory, the ``sys.path`` an exec'd proc
would start with, ``random`` re-seeded, and then the same
:func:`monarch_core._launch._proc_main.main` (its parent, for the death signal
and the re-parenting check, is the zygote).

The zygote stays single-threaded and never imports torch (nothing may fork a
process that has started CUDA or other threads); it refuses to serve (and the
spawner falls back to exec) if it finds more than one thread after its imports.
It reaps its children through pidfds and reports each exit status, in
``Popen.returncode`` convention, to the spawner.  The spawner sees a forked
proc as a :class:`ForkedChild` (the interface of ``monarch_core._launch._children.Child``): it
holds a pidfd received from the zygote, so signals never reach a recycled pid.

Lifetimes: the zygote has ``PR_SET_PDEATHSIG`` = SIGKILL towards its spawner's
kernel thread and its children towards the zygote, so nothing outlives the
spawner.  If the zygote dies, its procs die with it; they are reported as
killed, with the zygote's fate as the reason, and the next spawn starts a new
zygote.  When the kernel loop ends, the socket is closed and the zygote exits.

Only procs that would run the default command (this Python, ``-m
monarch_core._launch._proc_main``, no wrapper such as ``numactl``, no change to
variables read when the interpreter starts or modules are imported) are
forked; ``MONARCH_FORK_SERVER=0`` turns the fork server off.
"""

from __future__ import annotations

import importlib
import logging
import marshal
import os
import selectors
import signal
import socket
import sys
from typing import Any, Sequence

logger = logging.getLogger("monarch.proc")

#: Largest control message on the fork socket.
_MAX_MSG = 1 << 20


# ====================================================================== the zygote process


def _preload(transport: str | None, sock: socket.socket, warm: Sequence[str]) -> None:
    """Import what a proc imports before its first actor message: the proc
    runtime, and the modules of the layers above named in ``warm`` (the
    spawner's :data:`warm_modules`; this layer does not import them).  The
    plugins come from the spawner's list (its ``plugins`` message, sent once
    its own registry exists) when that has arrived by then, which spares
    every forked proc the scan of the installed distributions."""
    import asyncio  # noqa: F401 - actors run asyncio loops
    import concurrent.futures.thread  # noqa: F401 - (the package imports it lazily)
    import random  # noqa: F401

    import cloudpickle  # noqa: F401
    import trio  # noqa: F401

    from monarch_core._proc import (  # noqa: F401
        _agent,
        _host,
        _serial,
        _state,
        _transport,
    )
    from monarch_core._kernel import _runtime, _wire  # noqa: F401
    from monarch_core._launch import _proc_main  # noqa: F401
    from monarch_core._mesh import _shape  # noqa: F401
    from monarch_core._plugins import adopt_registry, registry

    for name in warm:
        importlib.import_module(name)
    sock.setblocking(False)
    try:
        msg, _fds = _recv(sock)
    except BlockingIOError:
        msg = None
    finally:
        sock.setblocking(True)
    if msg is not None and msg[0] == "plugins":
        adopt_registry(msg[1])
    reg = registry()  # built here, before the first fork, whether or not a transport is named
    if transport:
        try:
            reg.transport(transport).prepare()  # e.g. TLS contexts, built once for every proc
        except Exception:  # noqa: BLE001, S110 - the proc reports it itself
            pass


def _unsafe_to_fork() -> str | None:
    threads = len(os.listdir("/proc/self/task"))  # (a zygote runs on Linux only: _fork_server.enabled)
    if threads != 1:
        return f"it has {threads} threads after its imports (something it imported started one); forking it is unsafe"
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return "CUDA was initialised in it during its imports"
        except Exception:  # noqa: BLE001, S110
            pass
    return None


def _recv(sock: socket.socket) -> tuple[Any, list[int]]:
    data, fds, flags, _addr = socket.recv_fds(sock, _MAX_MSG, 8)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        raise RuntimeError(f"fork request truncated (flags {flags:#x})")
    return marshal.loads(data), fds


def _send(sock: socket.socket, msg: tuple, fds: list[int] | None = None) -> None:
    if fds:
        socket.send_fds(sock, [marshal.dumps(msg)], fds)
    else:
        sock.send(marshal.dumps(msg))


class ProcExit(SystemExit):
    """A forked proc's ``SystemExit``, carried out of the fork server's loop
    (which would otherwise catch it) to the top of the interpreter."""


#: The zygote's process name (``/proc/PID/comm``, what ``ps -o comm`` and
#: ``top`` show); its procs take back the interpreter's.
COMM = "monarch-zygote"


def _set_comm(name: str) -> None:
    from monarch_core._launch._proc_main import PR_SET_NAME, _prctl

    _prctl(PR_SET_NAME, name.encode()[:15])


def serve(fd: int, parent_pid: int) -> None:
    """Main loop of the zygote process (never returns)."""
    from monarch_core._launch._proc_main import _set_parent_death_signal

    _set_parent_death_signal()
    _set_comm(COMM)
    if os.getppid() != parent_pid:
        os._exit(1)  # the spawner died before we set the death signal
    base_env = dict(os.environ)
    base_path = list(sys.path)  # what `python -m` starts with: [cwd, ...]
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    try:
        msg, _fds = _recv(sock)
        if msg is None:
            os._exit(0)
        _op, sys_path, transport, warm = msg
        for p in reversed(sys_path):
            if p not in sys.path:
                sys.path.insert(0, p)
        try:
            _preload(transport, sock, warm)
            problem = _unsafe_to_fork()
        except BaseException as e:  # noqa: BLE001 - reported to the spawner
            problem = f"its imports failed: {type(e).__name__}: {e}"
        if problem is not None:
            _send(sock, ("broken", problem))
            _linger(sock)
            os._exit(1)
        _send(sock, ("ready", os.getpid()))
        _loop(sock, base_env, base_path)
    except ProcExit:  # a forked proc ended: the interpreter finalizes it (atexit, module globals)
        raise
    except (BrokenPipeError, ConnectionResetError):
        pass
    except BaseException:  # pragma: no cover - logged, then exit
        logger.exception("monarch fork server (pid %d) failed", os.getpid())
    os._exit(0)


def _linger(sock: socket.socket, timeout: float = 5.0) -> None:
    """Before a zygote that cannot serve exits: send EOF, then wait (at most
    ``timeout`` seconds) until the spawner closed its end.  Exiting with the
    spawner's messages unread resets the connection, and Linux then drops what
    the spawner had not read yet -- the report of why (seen once under load:
    the procs were exec'd with "it exited with code 1" instead of the reason)."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(timeout)
        while sock.recv(65536):
            pass
    except OSError:
        pass


def _loop(sock: socket.socket, base_env: dict, base_path: list) -> None:
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, None)
    kids: dict[int, int] = {}  # pid -> pidfd
    while True:
        for key, _events in sel.select():
            if key.data is None:
                msg, fds = _recv(sock)
                if msg is None:  # the spawner closed its end (or is gone)
                    for pid, pidfd in kids.items():
                        try:
                            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                        except OSError:
                            pass
                    return
                if msg[0] == "plugins":  # came after the imports: the zygote scanned itself
                    continue
                if msg[0] == "fork":
                    _fork(sock, sel, kids, msg, fds, base_env, base_path)
                elif msg[0] == "info":
                    for f in fds:
                        os.close(f)
                    _send(sock, ("info", msg[1], {
                        "pid": os.getpid(),
                        "modules": sorted(sys.modules),
                        "threads": len(os.listdir("/proc/self/task")),
                        "children": sorted(kids),
                    }))
            else:
                pid = key.data
                pidfd = kids.pop(pid)
                sel.unregister(pidfd)
                os.close(pidfd)
                _pid, status = os.waitpid(pid, 0)
                _send(sock, ("exit", pid, os.waitstatus_to_exitcode(status)))


def _fork(sock: socket.socket, sel: Any, kids: dict, msg: tuple, fds: list[int], base_env: dict,
          base_path: list) -> None:
    _op, req_id, env_set, env_unset, cwd, targets = msg
    try:
        pid = os.fork()
    except OSError as e:
        for f in fds:
            os.close(f)
        _send(sock, ("failed", req_id, f"fork() failed: {e}"))
        return
    if pid == 0:  # the new proc
        try:
            sel.close()
            sock.close()
            for pidfd in kids.values():
                os.close(pidfd)
            _become_proc(fds, targets, env_set, env_unset, cwd, base_env, base_path)
        except SystemExit as e:  # the proc's own end: finalize as the interpreter does, out of serve()
            raise ProcExit(e.code) from None
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
        os._exit(1)
    for f in fds:
        os.close(f)
    pidfd = os.pidfd_open(pid)
    kids[pid] = pidfd
    sel.register(pidfd, selectors.EVENT_READ, pid)
    _send(sock, ("forked", req_id, pid), [pidfd])


def _become_proc(fds: list[int], targets: list[int], env_set: dict, env_unset: list, cwd: str | None,
                 base_env: dict, base_path: list) -> None:
    """In a forked child: turn into what ``python -m ..._proc_main`` would be, then run it."""
    import fcntl
    import importlib
    import random

    # The spawner's standard streams, as an exec'd proc inherits them.
    moved = [fcntl.fcntl(f, fcntl.F_DUPFD_CLOEXEC, 10) for f in fds]
    for f in fds:
        os.close(f)
    for target in (0, 1, 2):
        if target in targets:
            os.dup2(moved[targets.index(target)], target)
        else:
            try:
                os.close(target)
            except OSError:
                pass
    for f in moved:
        os.close(f)
    os.setsid()  # (its streams' buffering: ``_proc_main`` sets it, as for an exec'd proc)
    _set_comm(os.path.basename(sys.executable))
    env = dict(base_env)
    for k in env_unset:
        env.pop(k, None)
    env.update(env_set)
    os.environ.clear()
    os.environ.update(env)
    if cwd:
        os.chdir(cwd)
    sys.path[:] = [os.getcwd(), *base_path[1:]]
    importlib.invalidate_caches()
    random.seed()
    from monarch_core._launch import _proc_main

    sys.argv = [_proc_main.__file__]
    _proc_main.main()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
