"""Starting procs (on this host, and through the worker loop of a remote host) and stopping them.

:func:`start_proc` turns a :class:`~._spec.ProcSpec` into an OS process on
the host that runs it (this process is its parent): the environment is that
host's, plus its transport's ``child_env()`` (credentials), plus the
command's overrides, plus the proc's ``CUDA_VISIBLE_DEVICES`` (``_devices``:
this host's entry at its device index, unless the command or a hook sets
it), plus ``monarch_proc_env`` hook results.
A proc that runs the default command is forked from the spawning process's
fork server (see ``_fork_server``, ``_zygote``); any other is exec'd (``_children``).

The client side of a spawn: a :class:`Launch` carries out the plan the
mesh API made (``HostMesh.spawn_procs``: per host, the specs of its procs):
it starts the procs of a host without a worker loop (``this_host()``) with
:func:`start_proc`, asks a worker loop to start the others, sends each proc
its ``init`` (the bootstrap callable), and collects every proc's ``hello``
(its address) and ``ready`` (its bootstrap ran), which resolves
``ProcMesh.initialized``.  :func:`stop_procs` is ``ProcMesh.stop``'s
escalation: ask, then SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from monarch_core._proc import _control as C
from monarch_core._proc import _send
from monarch_core._proc._future import format_duration
from monarch_core._kernel import _wire as W
from monarch_core._kernel._ports import PortHandler
from monarch_core._launch import _devices
from monarch_core._launch._children import start_child
from monarch_core._launch._spec import ProcSpec
from monarch_core.errors import ActorError, SupervisionError

from monarch_core._launch._bootstrap import (
    BOOTSTRAP_ENV,
    PROC_MODULE,
    BootstrapCommand,
    apply_bind,
    apply_overrides,
)

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel
    from monarch_core._proc._slot import ProcSlot

logger = logging.getLogger("monarch.proc")
#: proc stop escalation (docs/logging.md)
escalation_log = logging.getLogger("monarch.mesh")


async def start_proc(kernel: Kernel, spec: ProcSpec, *, bind_spec: str | None) -> Any:
    """Start the OS process for ``spec`` as a child of this process and hand
    it to the kernel to watch (kernel loop).  The proc gets ``spec`` with what
    this host knows filled in (``MONARCH_PROC_BOOTSTRAP``, :meth:`ProcSpec.to_env`).
    Raises on failure to start (the caller reports it)."""
    from monarch_core._plugins import registry

    program = sys.executable if spec.default_program else spec.command.program
    cmd = dataclasses.replace(spec.command, program=program)
    env = cmd.build_env(transport_env(kernel.transport))
    hook = registry().pm.hook.monarch_proc_env
    hooked: list = []
    if hook.get_hookimpls():
        from monarch_core._mesh._shape import Extent, Point

        coords = dict(Point(spec.rank, Extent(spec.labels, spec.sizes)))
        hooked = [overrides or {} for overrides in hook(proc_name=spec.name, rank=spec.rank, coords=coords)]
    # its device: this host's CUDA_VISIBLE_DEVICES entry at its index, unless the command or a hook sets one
    devices = _devices.assign(spec.devices, os.environ, mesh=spec.name, host=spec.host_name, describe=spec.describe)
    devices = _devices.apply(env, [cmd.env, *hooked], devices)
    for overrides in hooked:
        apply_overrides(env, overrides)
    argv, cpus = apply_bind(cmd.argv(), spec.bind)
    # A worker loop is its procs' parent but not their spawner's address
    # book: they tell it where they listen (for its heartbeats).
    worker_loop = None
    if kernel.agent is not None and kernel.agent.is_host:
        assert kernel.address is not None  # (set once the kernel listens)
        worker_loop = (kernel.proc_id, kernel.address, os.getpid())
    spec = dataclasses.replace(spec, command=cmd, bind_spec=bind_spec, parent_pid=os.getpid(), cpus=cpus,
                               worker_loop=worker_loop, devices=devices)
    zygote = _fork_server(kernel, cmd, argv, env)
    if zygote is not None:
        from monarch_core._launch._fork_server import ForkServerUnavailable

        env[BOOTSTRAP_ENV] = dataclasses.replace(spec, parent_pid=zygote.pid).to_env()
        kernel.expect_proc(spec.proc_id)
        try:
            child = await zygote.fork(env, os.getcwd())
        except ForkServerUnavailable as e:
            logger.info("starting %s with exec: %s", spec.describe, e)
        except Exception as e:
            e.monarch_start_method = forked_from(zygote.pid)  # type: ignore[attr-defined]
            raise
        else:
            logger.debug("%s forked from fork server pid %d as pid %d", spec.describe, zygote.pid, child.pid)
            kernel.adopt_child(spec.proc_id, child, describe=spec.describe)
            return child
    env[BOOTSTRAP_ENV] = spec.to_env()
    executable = cmd.program if cmd.arg0 is not None and argv[0] == cmd.arg0 else None
    kernel.expect_proc(spec.proc_id)
    try:
        child = start_child(argv, env, executable=executable)
    except Exception as e:
        e.monarch_start_method = execd_with(spec.argv_for_errors())  # type: ignore[attr-defined]
        raise
    import trio  # (lazily: ``import monarch_core.actor`` must not load trio)

    await trio.lowlevel.checkpoint()
    kernel.adopt_child(spec.proc_id, child, describe=spec.describe)
    return child


def forked_from(zygote_pid: int) -> str:
    """How a forked proc started, for error messages."""
    return f"forked from the fork server (pid {zygote_pid})"


def execd_with(argv: list[str]) -> str:
    """How an exec'd proc started, for error messages."""
    return f"exec'd with {argv!r}"


def start_method(proc: Any, spec: ProcSpec) -> str:
    """How ``proc`` (what :func:`start_proc` returned for ``spec``) was started, for error messages."""
    zpid = getattr(proc, "fork_server_pid", None)
    return forked_from(zpid) if zpid is not None else execd_with(spec.argv_for_errors())


def compress_ranks(ranks: list[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (sorted, runs joined)."""
    runs: list[list[int]] = []
    for r in sorted(set(ranks)):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def transport_env(transport: Any) -> dict[str, str]:
    """This process's environment plus what procs need to use ``transport``
    as this process does (``Transport.child_env()``: its credentials)."""
    env = dict(os.environ)
    child_env = getattr(transport, "child_env", None)
    if child_env is not None:
        env.update(child_env())
    return env


def _fork_server(kernel: Kernel, cmd: BootstrapCommand, argv: list[str], env: dict[str, str]) -> Any:
    """The zygote to fork this proc from, or ``None`` to exec it: only the
    default command (this Python, ``-m`` the proc module, no wrapper) with no
    change to start-up variables is forked (see ``_zygote``), by clients and
    worker loops alike (a worker loop's zygote starts with the worker loop,
    so a host's procs start in parallel from a warm parent)."""
    from monarch_core._launch import _fork_server

    if (
        argv != [sys.executable, "-m", PROC_MODULE]
        or cmd.arg0 is not None
        or not _fork_server.enabled()
    ):
        return None
    return _fork_server.server_of(kernel).for_env(env)


# ---------------------------------------------------------------- the spawning client's side


def host_proc_id(address: str) -> str:
    """The session key of the worker loop at ``address``."""
    return f"host@{address}"


class Launch(PortHandler):
    """One ``spawn_procs`` call carried out (the spawning client's side).

    The mesh API builds the plan -- :meth:`add_host`, per host, with the
    :class:`ProcSpec` s of its procs, whose ``status`` is :attr:`status` --
    then calls :meth:`start` (any thread): a host without a worker loop
    (``this_host()``) starts its procs here (:func:`start_proc`, all at
    once), one with a worker loop is asked to (``host_spawn``), a host
    already lost fails its procs at once; each proc then gets its ``init``
    (the bootstrap callable).  The procs' ``hello`` (their address) and
    ``ready`` (their bootstrap ran) come to this port (any thread):
    :attr:`cell` resolves when every proc is ready, or fails once for the
    whole spawn (``ProcMesh.initialized`` reports it): after the first
    failure it waits until every proc is ready or failed, at most
    :data:`FAILURE_SETTLE` s, then raises one ``SupervisionError`` saying how
    many ranks failed, which, the first cause and how those procs were
    started (forked from the fork server pid X, or exec'd with the command);
    one ERROR line on ``monarch.proc`` says the same.  Each proc's own
    failure is reported to the kernel as well (``proc_failed``)."""

    def __init__(self, rt: Any) -> None:
        from monarch_core._proc._future import Cell

        self.rt = rt
        self.kernel = rt.kernel
        #: one per proc, in rank order (the proc mesh's)
        self.slots: list[ProcSlot] = []
        self.hosts: list[tuple[Any, list[tuple[ProcSlot, ProcSpec]]]] = []
        self.cell = Cell()
        self.ready = 0
        self.lock = threading.Lock()
        #: the first failure's message, once one came (guarded by ``lock``)
        self.first_failure: str | None = None
        #: the first failure itself (an ``ActorError`` when a proc's ``bootstrap=`` raised)
        self.first_exc: BaseException | None = None
        #: rank -> how its proc was started (:func:`start_method`), for the failure report
        self.methods: dict[int, str] = {}
        #: the spawn's proc mesh name, for the failure report
        self.mesh_name = ""
        self.port_id = self.kernel.add_port(self)
        #: the port the procs report to: every spec's ``status``
        self.status = (rt.proc_id, self.kernel.address, self.port_id)

    def add_host(self, host: Any, specs: list[ProcSpec]) -> None:
        """Plan ``specs`` (the next ranks) on ``host`` (a ``HostHandle``)."""
        from monarch_core._proc._slot import ProcSlot  # (lazily: it loads the mesh data model)

        entries = []
        for spec in specs:
            slot = ProcSlot(spec.proc_id)
            slot.host, slot.host_name, slot.describe = host.address, host.name, spec.describe
            if host.address is not None:
                self.methods[len(self.slots)] = f"started by the worker loop at {host.address}"
            self.mesh_name = spec.name
            self.slots.append(slot)
            entries.append((slot, spec))
        self.hosts.append((host, entries))

    def start(self, bootstrap: tuple, lost: dict[str, str]) -> None:
        """Start every planned proc (any thread; the work runs on the kernel
        loop).  ``bootstrap``: the pickled bootstrap callable (payload,
        buffers); ``lost``: host name -> why, for hosts lost already."""
        kernel = self.kernel
        for host, entries in self.hosts:
            if host.name in lost:
                kernel.call_soon(self._fail_lost, entries, host.name, lost[host.name])
            elif host.address is None:
                kernel.call_soon(kernel.start_task, self._start_here, entries, bootstrap)
            else:
                kernel.call_soon(self._ask_worker_loop, host.address, entries, bootstrap)

    async def _start_here(self, entries: list, bootstrap: tuple) -> None:
        """Start the OS processes of procs on this host (kernel loop), then send each its ``init``."""
        kernel = self.kernel

        async def start(slot: ProcSlot, spec: ProcSpec) -> None:
            try:
                proc = await start_proc(kernel, spec, bind_spec=kernel.transport.child_bind_spec(kernel.address))
                kernel.child_starting(slot.proc_id)  # its death before ``ready``: this plan's one report (_settle)
                self.methods[spec.rank] = start_method(proc, spec)
                slot.pid = proc.pid
                self.rt.agent.watch_child(slot.proc_id)
            except Exception as e:
                method = getattr(e, "monarch_start_method", None) or execd_with(spec.argv_for_errors())
                self.methods[spec.rank] = method
                msg = f"could not start {spec.describe} ({method}): {type(e).__name__}: {e}"
                logger.debug("%s", msg)  # (the spawn's one report names it: _settle)
                self._start_failed(slot, msg)
                return
            self._send_init(slot, spec, bootstrap)

        import trio

        # All at once: the fork server gets every request in one go (no round
        # trip between two forks), and exec'd procs start their imports together.
        async with trio.open_nursery() as nursery:
            for slot, spec in entries:
                nursery.start_soon(start, slot, spec)

    def _ask_worker_loop(self, address: str, entries: list, bootstrap: tuple) -> None:
        """Ask the worker loop at ``address`` to start procs (kernel loop)."""
        from monarch_core._proc import _serial

        kernel = self.kernel
        for slot, _spec in entries:
            kernel.expect_proc(slot.proc_id)
        payload, bufs = _serial.dumps([spec for _slot, spec in entries])
        _send.control(kernel, host_proc_id(address), address, C.HostSpawn(), payload, bufs, self.port_id)
        for slot, spec in entries:
            self._send_init(slot, spec, bootstrap)

    def _send_init(self, slot: ProcSlot, spec: ProcSpec, bootstrap: tuple) -> None:
        _send.control(self.kernel, slot.proc_id, None, C.Init(spec.status, spec.rank), bootstrap[0], bootstrap[1],
                      self.port_id)

    def _fail_lost(self, entries: list, host_name: str, reason: str) -> None:
        """Procs asked for on a host already lost fail at once (kernel loop)."""
        for slot, _spec in entries:
            self._start_failed(slot, f"{slot.describe} could not start: its host {host_name} was lost ({reason})")

    def _start_failed(self, slot: ProcSlot, msg: str) -> None:
        """``slot``'s proc could not start (``msg``): the kernel and the plan fail it."""
        slot.failed = msg  # (read by the kernel's failure handling: the proc's report)
        self.kernel.proc_failed(slot.proc_id, msg)
        self.fail(SupervisionError(msg), slot.proc_id)

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        from monarch_core._proc import _serial

        try:
            msg = _serial.loads(payload, buffers)
        except Exception as e:
            msg, status = e, W.S_ERROR
        if status == W.S_ERROR:
            if 0 <= rank < len(self.slots) and not self.slots[rank].failed:
                self.slots[rank].failed = str(msg)  # its bootstrap raised: the one report counts and names it
            self._fail(msg if isinstance(msg, BaseException) else RuntimeError(str(msg)))
            return
        if msg[0] == "hello":
            _tag, proc_id, address, pid = msg
            slot = self.slots[rank]
            slot.address = address
            slot.pid = pid
            slot.ready.set()
            if self.kernel.in_loop():
                self.kernel.learn_address(proc_id, address)
            else:
                self.kernel.call_soon(self.kernel.learn_address, proc_id, address)
        elif msg[0] == "ready":
            with self.lock:
                self.ready += 1
                done = self.ready == len(self.slots)
            if 0 <= rank < len(self.slots):
                from monarch_core._proc import _state

                self.kernel.child_started(self.slots[rank].proc_id)
                _state.emit("proc_ready", proc_id=self.slots[rank].proc_id, pid=self.slots[rank].pid, last=done)
            if done:
                self.close()
                self.cell.set_result(True)

    def close(self) -> None:
        """Give the port back (a plan abandoned before :meth:`start`, or one that is over)."""
        self.kernel.remove_port(self.port_id)

    def _fail(self, exc: BaseException) -> None:
        """A proc failed while starting (``exc``; any thread): the first
        failure starts :meth:`_settle`, which fails :attr:`cell` once."""
        with self.lock:
            if self.first_failure is not None or self.cell.done():
                return
            self.first_failure = str(exc)
            self.first_exc = exc
        self.kernel.call_soon(self.kernel.start_task, self._settle)

    def _failed_ranks(self) -> list[int]:
        dead = self.kernel.dead
        return [r for r, s in enumerate(self.slots) if s.failed or s.proc_id in dead]

    async def _settle(self) -> None:
        """Wait (kernel loop) until every proc is ready or failed, at most
        :data:`FAILURE_SETTLE` s, then fail :attr:`cell` with one report."""
        import trio

        with trio.move_on_after(FAILURE_SETTLE):
            while self.ready + len(self._failed_ranks()) < len(self.slots):
                await trio.sleep(0.05)  # polling the slots' states, bounded by the settle time
        failed = self._failed_ranks()
        methods = sorted({self.methods.get(r, "") for r in failed} - {""})
        how = "; ".join(methods) if methods else "start method unknown"
        which = f"ranks {compress_ranks(failed)}" if failed else "rank unknown"
        first = self.first_exc
        # a bootstrap that raised: its ActorError carries the remote traceback once (_spawn_error)
        cause = (f"{first.message} ({first.where()}): {type(first.exception).__name__}: {first.exception}"
                 if type(first) is ActorError else self.first_failure)
        msg = (f"{max(1, len(failed))} of {len(self.slots)} procs of proc mesh {self.mesh_name!r} failed while "
               f"starting ({which}); they were {how}; the first failure: {cause}")
        # procs stopped on purpose while they were starting (their mesh was stopped: the program ended) are no news
        quiet = bool(failed) and all(self.slots[r].stopped is not None for r in failed)
        logger.log(logging.DEBUG if quiet else logging.ERROR, "%s", msg)
        self.close()
        self.cell.set_exception(self._spawn_error(msg))

    def _spawn_error(self, msg: str) -> BaseException:
        """The error :attr:`cell` fails with, ``msg`` being the spawn's report:
        ``ActorError`` when the first failure was the user's ``bootstrap=``
        raising (user code, as for an actor's ``__init__``; the remote
        exception and traceback kept), ``SupervisionError`` otherwise (a proc
        that could not start, died, or whose host was lost)."""
        first = self.first_exc
        if type(first) is ActorError:  # (only a proc's bootstrap sends one to this port: ProcAgent._on_init)
            return ActorError(first.exception, msg, remote_traceback=first.remote_traceback)
        return SupervisionError(msg)

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        for s in self.slots:
            if s.proc_id == proc_id:
                s.failed = str(exc)
                s.ready.set()
        self._fail(exc)


#: Seconds a failed spawn waits, after its first failure, for its other
#: procs to be ready or fail, so that its one report counts them all.
FAILURE_SETTLE = 2.0

# ---------------------------------------------------------------- stopping procs

#: Seconds between SIGTERM and SIGKILL, and after SIGKILL before giving up waiting.
SIGNAL_WAIT = 1.0


def stop_procs(kernel: Kernel, slots: list[ProcSlot], reason: str, grace: float, cell: Any, mesh: str = "") -> None:
    """Stop the procs of ``slots`` (``ProcMesh.stop``; any thread, the work
    runs on the kernel loop): each is asked to (``stop_proc``: its actors'
    ``__cleanup__`` run) and gets ``grace`` seconds; one still alive then gets
    SIGTERM, and one alive :data:`SIGNAL_WAIT` s later SIGKILL -- directly when
    this process is its parent, through its host's worker loop (``host_kill``)
    otherwise;
    ``cell`` resolves once all are gone (or the last wait ended), after what
    they sent before stopping (their output, their last telemetry) was
    handled and printed, and the runtime event ``proc_mesh_stopped`` (for a
    named ``mesh``)."""
    kernel.call_soon(kernel.start_task, _stop, kernel, slots, reason, grace, cell, mesh)


async def _stop(kernel: Kernel, slots: list[ProcSlot], reason: str, grace: float, cell: Any, mesh: str) -> None:
    import trio

    from monarch_core._proc import _output, _state

    stop = C.StopProc(reason, max(0.5, grace - 0.5))
    starting = []  # procs that never said hello: nothing of the user's runs there yet, so nothing to lose
    for s in slots:
        kernel.expect_exit(s.proc_id)
        if s.proc_id in kernel.dead:
            continue
        if s.ready.is_set():
            _send.control(kernel, s.proc_id, None, stop)
        else:
            starting.append(s)
            _signal(kernel, s, "kill")
    if starting:
        escalation_log.debug("%d procs of %s were still starting; killed", len(starting), mesh or "a proc mesh")
    waited = [s for s in slots if s not in starting or kernel.child(s.proc_id) is not None]
    for s in starting:
        if kernel.child(s.proc_id) is None:
            # a remote one's death would come from its worker loop, which may be ending too: gone now (what
            # was queued for it is dropped, not waited for)
            kernel.proc_failed(s.proc_id, f"stopped while it was starting ({reason})", stopped=True)

    async def all_gone() -> None:
        for s in waited:
            await kernel.wait_dead(s.proc_id)

    with trio.move_on_after(grace):
        await all_gone()
    for sig_name in ("terminate", "kill"):
        alive = [s for s in waited if s.proc_id not in kernel.dead]
        if not alive:
            break
        for s in alive:
            escalation_log.warning("%s did not stop within its %s stop grace period; sending %s",
                                   s.describe or s.proc_id, format_duration(grace), sig_name)
            _signal(kernel, s, sig_name)
        with trio.move_on_after(SIGNAL_WAIT):
            await all_gone()
    # What they sent last (output lines, telemetry batches) was delivered before they ended
    # and waits in the loop's queue: a callback queued now runs after it.
    handled = trio.Event()
    trio.lowlevel.current_trio_token().run_sync_soon(handled.set)
    with trio.move_on_after(1.0):
        await handled.wait()
    _output.printer.flush(mesh or None)
    if mesh:
        _state.emit("proc_mesh_stopped", mesh=mesh)
    cell.set_result(None)


def _signal(kernel: Kernel, s: ProcSlot, sig_name: str) -> None:
    """SIGTERM (``terminate``) or SIGKILL (``kill``) the proc of ``s``: directly
    when this process is its parent, else through its host's worker loop."""
    child = kernel.child(s.proc_id)
    if child is not None:
        getattr(child, sig_name)()
    elif s.host is not None:
        _send.control(kernel, host_proc_id(s.host), s.host, C.HostKill((s.proc_id,), sig_name))
