"""Entry point of a proc (worker) process: ``python -m monarch_core._launch._proc_main``.

The spawning process passes the proc's :class:`~._spec.ProcSpec` in
``MONARCH_PROC_BOOTSTRAP`` (``ProcSpec.to_env``; decoded and checked once, by
``ProcSpec.from_env``).  The proc sets a parent-death signal (so it never outlives the process
that started it), starts its kernel on its own address, tells its parent it is
listening, and serves until told to stop.

:func:`main` is also how a proc forked by the fork server starts (see
``_zygote``): the forked child sets up the environment, directory and
``sys.path`` an exec'd proc would have, then calls it; its parent (for the
death signal and the re-parenting checks) is then the fork server.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import logging
import os
import signal
import sys
import time
from typing import Any

from monarch_core._launch._bootstrap import BOOTSTRAP_ENV
from monarch_core._launch._spec import ProcSpec
from monarch_core._proc import _output
from monarch_core._proc._state import tune_malloc  # noqa: F401 - defined below the launch layer


PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def _prctl(option: int, arg: Any) -> None:
    """``prctl(option, arg)``; nothing where there is none (non-Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except Exception:  # noqa: BLE001, S110 # pragma: no cover - non-Linux
        pass


def _set_parent_death_signal() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def main() -> None:
    raw = os.environ.pop(BOOTSTRAP_ENV, None)
    if raw is None:
        sys.stderr.write(
            "monarch_core._launch._proc_main starts a proc for a monarch program; it is not run by hand. "
            "Use HostMesh.spawn_procs(...) (or `python -m monarch_core.worker` for a host worker loop).\n"
        )
        sys.exit(2)
    try:
        spec = ProcSpec.from_env(raw)
    except ValueError as e:
        sys.stderr.write(f"monarch_core._launch._proc_main: {e}\n")
        sys.exit(2)
    _set_parent_death_signal()
    tune_malloc()
    _output.whole_lines()  # (procs share the client's terminal: no line of theirs is mixed with another's)
    if os.getppid() != spec.parent_pid:
        os._exit(1)  # the parent died before we set the death signal
    os.environ["MONARCH_PROC_ID"] = spec.proc_id
    from monarch_core._launch import _devices

    _devices.set_current(spec.devices)  # (monarch_core.runtime.proc_devices())
    for p in reversed(spec.sys_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    if spec.cpus:
        from monarch_core._launch._bootstrap import parse_cpu_list

        os.sched_setaffinity(0, parse_cpu_list(spec.cpus))
    _quiet_monarch_logger(spec.log_level)
    sys.breakpointhook = _breakpoint_without_debugger  # the debugger plugin's proc setup replaces it
    import trio

    from monarch_core._proc import _serial, _transport
    from monarch_core._proc import _control as C
    from monarch_core._launch._start import build_runtime
    from monarch_core._kernel import _wire as W
    from monarch_core._mesh._shape import Extent, Point
    from monarch_core._plugins import registry
    from monarch_core._telemetry import _reporting
    from monarch_core._telemetry import _runtime as _telemetry

    _transport.set_from_parent(spec.transport)
    rt = build_runtime(
        proc_id=spec.proc_id, kernel_name=spec.name, transport=registry().transport(spec.transport),
        bind_spec=spec.bind_spec, name=spec.describe, is_client=False, root=spec.root, parent=spec.parent,
        point=Point(spec.rank, Extent(spec.labels, spec.sizes)), python_executable=spec.command.program,
        proc_mesh_name=spec.name, ready=False, instrumentation=_telemetry.Telemetry(),
    )
    _telemetry.subscribe(rt.events)  # telemetry's records of what the runtime tells
    kernel = rt.kernel
    parent, status, worker_loop = spec.parent, spec.status, spec.worker_loop

    # a proc on a remote host (its parent a worker loop) writes to a per-host log file when it does not stream
    _reporting.start_proc(rt, host_name=spec.host_name or None, output=spec.output,
                          log_path=proc_log_file(spec.host_name or None, worker_loop[2]) if worker_loop else None)

    async def hello() -> None:
        import marshal

        payload, bufs = _serial.dumps(("hello", kernel.proc_id, kernel.address, os.getpid()))
        kernel.learn_address(parent[0], parent[1])
        kernel.send(status[0], status[1], W.K_PORT, 0, marshal.dumps((status[2], spec.rank, W.S_VALUE)),
                    payload, bufs)
        if worker_loop:  # our parent process, which heartbeats us, hears our address from us
            assert kernel.address is not None  # (set once the kernel listens)
            kernel.send(worker_loop[0], worker_loop[1], W.K_CONTROL, 0,
                        C.encode(C.ChildHello(kernel.proc_id, kernel.address)), b"", [])
        kernel.events.subscribe("proc_failed", _exit_if_parent(parent[0]))
        kernel.start_task(_watch_parent_pid, spec.parent_pid)
        kernel.start_task(_reporting.ship_loop, kernel)

    global _STARTED_WITH
    _STARTED_WITH = frozenset(sys.modules)
    # what the runtime (and a fork server) made lives as long as the proc: out of
    # the collector's sight, so neither a full collection nor the one at its
    # end (finish) walks it -- nor copies the pages a fork server shares
    gc.freeze()
    try:
        trio.run(functools.partial(kernel.serve, after_start=hello))
    except KeyboardInterrupt:
        pass
    finish(0)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (the proc's
    output capture replaces it: the record then reaches the client with the
    actor's prefix)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # (StreamHandler.setStream; always sys.stderr)
        pass


def _quiet_monarch_logger(level: Any) -> None:
    """monarch's own loggers (``monarch.*``) get a handler of their own on
    ``monarch``, at the proc's ``MONARCH_LOG_LEVEL`` (``level``), and do not
    propagate.  The root logger is left as a plain Python program has it --
    no handler, level WARNING -- so the user's ``logging.basicConfig(...)``,
    handlers and levels in an actor work as they would anywhere.  One prefix:
    the client's printer (or the log file) adds the actor and host."""
    lg = logging.getLogger("monarch")
    lg.setLevel(level if isinstance(level, int) else getattr(logging, str(level).upper(), logging.WARNING))
    h = _StderrHandler()
    h.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    lg.addHandler(h)
    lg.propagate = False


#: seconds a stopped proc's finalization (its threads, ``atexit`` handlers, its user modules' globals) may take
#: before the proc just exits
FINALIZE_S = 5.0


def finish(code: int) -> None:
    """End the proc as a program that returns from its main ends, in the
    order the interpreter's own finalization uses: wait for its non-daemon
    threads, run the ``atexit`` handlers (logging's flush, users' trackers),
    then drop the globals of the modules the proc imported *from outside the
    Python installation* after it started -- the user's own modules, whose
    ``__del__`` and ``weakref.finalize`` callbacks run -- flush the standard
    streams and exit (``os._exit``).

    What is skipped is the rest of ``Py_Finalize``: freeing every object of
    every installed and inherited module, one by one, and a last collection
    of cyclic garbage (a second per proc holding thousands of stopped actors).  In a proc forked from
    the fork server that is most of its stop (about 0.2 s of CPU, much of it
    copying pages it shares with the fork server), so N procs stopping cost
    N times that on a host's cores; ``multiprocessing``'s children skip it
    the same way.  A finalization that does not end within
    :data:`FINALIZE_S` (a thread or handler that never returns) is cut
    short, so a stop stays bounded."""
    import threading

    def cut_short() -> None:
        time.sleep(FINALIZE_S)
        _flush_std()
        os._exit(code)

    threading.Thread(target=cut_short, daemon=True, name="monarch-finalize-bound").start()
    try:
        _finalize(threading)
    except BaseException:  # noqa: BLE001 - as the interpreter does: report, and end all the same
        import traceback

        traceback.print_exc()
    _flush_std()
    os._exit(code)


def _finalize(threading: Any) -> None:
    import atexit

    gc.disable()  # what is left goes with the process: no collection walks it now
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter calls first: joins non-daemon threads
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    installed = _INSTALLED
    users = [m for name, m in list(sys.modules.items())
             if name not in _STARTED_WITH and not name.startswith("monarch_") and _is_users(m, installed)]
    for m in reversed(users):  # the last imported first, as the interpreter does
        d = getattr(m, "__dict__", None)
        if d is None:
            continue
        for k in [k for k in d if not (k.startswith("__") and k.endswith("__"))]:
            d[k] = None


#: the modules of this process when its proc started serving (the runtime's own, and what the fork server held)
_STARTED_WITH: frozenset[str] = frozenset()


def _installation_dirs() -> tuple[str, ...]:
    import sysconfig

    dirs = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= {sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


#: the Python installation's directories, found once where this module is
#: imported (in the fork server, before it forks a proc): a proc's stop then
#: neither imports ``sysconfig`` nor resolves these paths again
_INSTALLED = _installation_dirs()


def _is_users(module: Any, installed: tuple[str, ...]) -> bool:
    """A module the user's program brought: its file is outside the Python
    installation (stdlib, site-packages); a module without a file (built in,
    or made at run time) is not."""
    f = getattr(module, "__file__", None)
    if not isinstance(f, str):
        return False
    return not os.path.realpath(f).startswith(installed)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001, S110 - a closed or broken stream: nothing more to write
            pass


def proc_log_file(host_name: str | None, worker_pid: int) -> str:
    """Where a remote proc that does not stream writes its output: one file per
    host (worker loop), in ``MONARCH_PROC_LOG_DIR`` (default
    ``<tmp>/monarch-<uid>-logs``).  The folder is private (0700, this user's;
    checked before use) and the files are 0600, opened without following a
    link (``_proc._output.open_private_log``)."""
    import socket
    import tempfile

    from monarch_core import settings

    d = settings.get("MONARCH_PROC_LOG_DIR") or os.path.join(tempfile.gettempdir(), f"monarch-{os.getuid()}-logs")
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in (host_name or socket.gethostname()))
    return os.path.join(d, f"{host}-worker{worker_pid}.log")


async def _watch_parent_pid(parent_pid: int) -> None:
    """Belt and braces for the parent-death signal: exit once re-parented."""
    import trio

    while True:
        await trio.sleep(1.0)
        if os.getppid() != parent_pid:
            _exit_now("parent process %d is gone; exiting", parent_pid)


def _exit_if_parent(parent_id: str):  # type: ignore[no-untyped-def]
    def cb(proc_id: str, reason: str, stopped: bool) -> None:
        if proc_id == parent_id:
            _exit_now("owner %s is gone (%s); exiting", proc_id, reason)

    return cb


def _exit_now(msg: str, *args: Any) -> None:
    """Log ``msg`` (ERROR) and end the proc at once: what started it is gone."""
    logging.getLogger("monarch.proc").error(msg, *args)
    sys.stdout.flush()
    os._exit(1)


def _breakpoint_without_debugger(*args: Any, **kwargs: Any) -> Any:
    """``breakpoint()`` in a proc with no debugger plugin installed: a proc
    has no terminal, so pdb would read end-of-file and fail the endpoint.
    Say what to install, and go on.  ``PYTHONBREAKPOINT`` keeps its meaning."""
    from monarch_core import settings

    hookname = os.environ.get("PYTHONBREAKPOINT", "").strip()
    if hookname == "0":
        return None
    if hookname:
        return sys.__breakpointhook__(*args, **kwargs)
    logging.getLogger("monarch.debug").warning(
        "breakpoint() in proc %s: stopping an actor for `monarch debug` needs the debugger plugin "
        "(pip install ./plugins/debugger, then restart the program); continuing",
        settings.get("MONARCH_PROC_ID") or "?",
    )
    return None


if __name__ == "__main__":
    main()
