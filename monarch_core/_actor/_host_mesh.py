"""``HostMesh``: a mesh of hosts that spawns proc meshes (``spawn_procs`` plans them, ``_launch`` starts them), losing hosts, shutting down."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import sys
import uuid
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel
    from monarch_core._launch._alloc import AllocationRecord
    from monarch_core.hookspecs import HostHandle

from monarch_core import settings
from monarch_core._launch import _devices, _start
from monarch_core._proc import _send, _serial, _state
from monarch_core._proc import _supervision as S
from monarch_core._proc._future import Cell, Future
from monarch_core._actor._actor_mesh import _all_done, _Mesh
from monarch_core._actor._mesh_base import _owner_check
from monarch_core._actor._proc_mesh import ProcMesh
from monarch_core._proc import _control as C
from monarch_core._launch._bootstrap import (
    BootstrapCommand,
    default_bootstrap_cmd,
    validate_proc_bind,
)
from monarch_core._launch._spawn import Launch, host_proc_id
from monarch_core._launch._spec import ProcSpec
from monarch_core._mesh._shape import Extent, Point, Region
from monarch_core._workspace import Workspace

logger = logging.getLogger("monarch.mesh")

_names = itertools.count()


class HostMesh(_Mesh):
    """A mesh of hosts that can spawn proc meshes.

    As an async context manager it shuts the hosts down on exit."""

    #: stopped, at its owner's stop, after the meshes of tier 0 (its proc meshes, whose
    #: procs' ends its worker loops report): ``_proc._agent._stop_meshes``
    _stop_tier = 1

    def __init__(
        self,
        hosts: list[HostHandle],
        region: Region,
        *,
        owner: bool,
        allocation: AllocationRecord | None = None,
        python_executable: str | None = None,
        name: str = "hosts",
        shared: dict | None = None,
    ) -> None:
        self._hosts = hosts
        self._region_ = region
        self._init_cell = Future._resolved(True)._ensure()  # (hosts are ready once allocated)
        self._owner = owner
        self._allocation = allocation
        self._python = python_executable
        self._name = name
        # state shared by views of the same host mesh
        self._shared: dict[str, Any] = shared if shared is not None else {"procs": [], "shutdown": False, "lost": {}}
        if owner and shared is None:
            self._watch_hosts()

    def _with_region(self, region: Region, python_executable: str | None = None) -> HostMesh:
        """A view of these hosts over ``region`` (starting procs with ``python_executable``, if given)."""
        return HostMesh(self._hosts, region, owner=False, allocation=self._allocation,
                        python_executable=python_executable or self._python, name=self._name, shared=self._shared)

    @property
    def region(self) -> Region:
        return self._region_

    @property
    def stream_logs(self) -> bool:
        """Whether procs spawned on these hosts stream their stdout, stderr and
        ``logging`` records to this client (prefixed ``[<actor or proc> <host>]``)
        unless ``ProcMesh.logging_option`` says otherwise.  By default every
        proc does; ``MONARCH_STREAM_LOGS=0`` turns it off: this host's procs then
        write to this client's terminal themselves, and a remote proc to a
        per-host log file whose path the client logs (``monarch.logs``, INFO)."""
        return _output_mode(any(h.address is not None for h in self.hosts)) == "stream"

    @property
    def is_fake_in_process(self) -> bool:
        return False

    @property
    def hosts(self) -> list[HostHandle]:
        """The hosts of this view, in rank order (name, worker address, labels)."""
        return [self._hosts[r] for r in self._region_.root_ranks()]

    def to_table(self) -> str:
        """A text table: rank, coordinates, host name, worker-loop address, labels."""
        rows = [f"{'rank':>4}  {'coords':<28} {'host':<20} {'address':<40} labels"]
        ext = self._region_.extent
        lost = self._shared["lost"]
        for i, h in enumerate(self.hosts):
            labels = " ".join(f"{k}={v}" for k, v in h.labels.items())
            if h.name in lost:
                labels = (labels + " " if labels else "") + f"LOST ({lost[h.name]})"
            rows.append(f"{i:>4}  {str(Point(i, ext)):<28} {h.name:<20} {h.address or '(this process)':<40} {labels}")
        return "\n".join(rows)

    def _watch_hosts(self) -> None:
        """Heartbeat the worker loop of every remote host (``ProcWatch.watch_host``):
        one that answers none for ``MONARCH_HOST_HEARTBEAT_TIMEOUT`` s -- frozen,
        or cut off while its SSH server or scheduler still answers -- is lost.
        The heartbeat is also what tells each worker loop that its client is
        alive, so a host mesh made before anything else in a fresh client
        starts the client's runtime here."""
        remote = [(h.name, h.address) for h in self._hosts if h.address is not None]
        if not remote:
            return
        try:
            _start.ensure_runtime()
            rt = _state.current()
        except RuntimeError:  # the monarch context was shut down: nothing to watch with
            return

        def watch() -> None:
            for name, address in remote:
                rt.agent.watch_host(host_proc_id(address), address, functools.partial(self._host_silent, name))

        with contextlib.suppress(RuntimeError):  # the kernel is gone: nothing to watch with
            rt.kernel.call_soon(watch)

    def _host_silent(self, host_name: str, reason: str) -> None:
        """The worker loop of ``host_name`` stopped answering heartbeats (loop
        thread): the host is lost, as if its scheduler had said so."""
        if self._shared["shutdown"] or host_name in self._shared["lost"]:
            return
        if self._allocation is not None:  # through the record: released/closing allocations ignore it
            self._allocation.report_lost(host_name, reason)
        else:
            logger.warning("host %s of %s is lost: %s", host_name, self._name, reason)
            self._host_lost(host_name, reason)

    def _host_lost(self, host_name: str, reason: str) -> None:
        """A scheduler (or the heartbeat) reported ``host_name`` lost (any
        thread): every proc on it fails, nothing else does, and no proc is
        started there again (later spawns fail naming the host and why)."""
        if host_name in self._shared["lost"]:
            return
        self._shared["lost"][host_name] = reason
        _state.emit("host_lost", mesh=self._name, host_name=host_name, reason=reason)
        rt = _state.current_runtime_or_none()
        if rt is not None:
            rt.kernel.call_soon(_procs_of_host_lost, rt.kernel, self._shared, self._hosts, host_name, reason)

    def _host_notice(self, host_name: str | None, message: str) -> None:
        """A scheduler's notice (any thread): a ``MeshFailure`` with
        ``notice`` set for this host mesh's owner (its ``__supervise__``, or
        the client's ``unhandled_fault_hook``); nothing fails."""
        coords = "{}"
        for i, h in enumerate(self.hosts):
            if h.name == host_name:
                coords = str(Point(i, self._region_.extent))
        failure = S.make_notice(self, self._name, host_name, coords, message)
        owner = self._shared.get("owner")
        rt = _state.current_runtime_or_none()
        if owner is not None:
            owner.supervise(failure)
        elif rt is not None and rt.is_client:
            S.deliver_to_root(failure)
        else:
            logger.warning("%s", failure.report())

    def with_python_executable(self, python_executable: str) -> HostMesh:
        """A view of these hosts that starts procs with ``python_executable``."""
        if not isinstance(python_executable, str) or not python_executable:
            raise TypeError("with_python_executable() needs the path of a Python executable")
        return self._with_region(self._region_, python_executable)

    def spawn_procs(
        self,
        per_host: dict[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        proc_bind: list[dict[str, str]] | None = None,
        bootstrap_command: BootstrapCommand | Callable[[Point], BootstrapCommand] | None = None,
    ) -> ProcMesh:
        """Start ``per_host`` procs on every host of this mesh.

        Returns immediately; the procs start in the background
        (``ProcMesh.initialized`` resolves when all have run ``bootstrap``).
        The proc mesh's dimensions are this host mesh's, then ``per_host``'s.
        Each proc sees one device of its host: ``CUDA_VISIBLE_DEVICES`` is
        its host's entry at its coordinate along ``gpus`` (settings
        ``MONARCH_PROC_DEVICES``, ``MONARCH_DEVICE_DIMS``; docs/configuration.md).
        """
        if self._shared["shutdown"]:
            raise RuntimeError(f"HostMesh has already been shut down (host mesh {self._name!r} has been shut down "
                               "and its hosts given back): allocate hosts again")
        per_host = _check_per_host(per_host, self._region_.labels)
        if self._allocation is not None:  # in use again: the client's end releases it
            self._allocation.stopped = False
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"bootstrap must be a callable run on each new proc, got {type(bootstrap).__name__}")
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        if bootstrap_command is not None and not (
            isinstance(bootstrap_command, BootstrapCommand) or callable(bootstrap_command)
        ):
            raise TypeError("bootstrap_command must be a BootstrapCommand or a callable Point -> BootstrapCommand")
        nper = math.prod(per_host.values())
        binds = validate_proc_bind(proc_bind, nper)
        try:
            boot_payload = _serial.dumps(bootstrap)
        except Exception as e:
            raise TypeError(f"bootstrap callable could not be pickled: {e}") from e
        name = name or f"procs{next(_names)}"
        _start.ensure_runtime()
        rt = _state.current()
        extent = Extent(self._region_.labels + tuple(per_host), self._region_.sizes + tuple(per_host.values()))
        launch = Launch(rt)
        try:
            self._plan(launch, rt, name, extent, nper, bootstrap_command, binds)
        except BaseException:
            launch.close()
            raise
        pm = ProcMesh(name, launch.slots, extent.region, self, launch.cell, True)
        self._shared["procs"].append(pm)
        rt.agent.register_owned(pm)
        launch.start(boot_payload, self._shared["lost"])
        return pm

    def _plan(self, launch: Launch, rt: Any, name: str, extent: Extent, nper: int, bootstrap_command: Any,
              binds: list[dict[str, str]] | None) -> None:
        """``spawn_procs``'s plan: add each host's ``ProcSpec`` s to ``launch``."""
        from monarch_core._launch import _code_sync

        level = settings.get("MONARCH_LOG_LEVEL") or logging.getLevelName(
            logging.getLogger("monarch").getEffectiveLevel()
        )
        common = dict(name=name, labels=extent.labels, sizes=extent.sizes, status=launch.status,
                      parent=(rt.proc_id, rt.kernel.address), root=tuple(rt.root), transport=rt.transport,
                      log_level=level)
        hosts = self.hosts
        per_host = dict(zip(extent.labels[len(self._region_.labels):], extent.sizes[len(self._region_.labels):]))
        here_path = tuple(p for p in sys.path if p)
        remote_path = _code_sync.remote_sys_path() if any(h.address is not None for h in hosts) else ()
        for hi, host in enumerate(hosts):
            remote = host.address is not None
            # what sync_workspace gave this host: its directories first on sys.path, a shipped env's Python
            sys_path, env_python = _code_sync.spawn_overrides(self._shared, host.name, remote_path if remote else here_path)
            specs = []
            for j in range(nper):
                point = Point(hi * nper + j, extent)
                cmd, default = self._command(bootstrap_command, point, env_python, remote, rt.python_executable)
                describe = f"proc {name}{point if len(extent) else ''}" + (f" on host {host.name}" if remote else "")
                specs.append(ProcSpec(
                    proc_id=f"{name}-{point.rank}-{uuid.uuid4().hex[:8]}", rank=point.rank, describe=describe,
                    command=cmd, default_program=default, bind=binds[j] if binds else None, host_name=host.name,
                    output=_output_mode(remote), sys_path=sys_path, devices=_devices.plan(per_host, j),
                    **common,
                ))
            launch.add_host(host, specs)

    def _command(self, bootstrap_command: Any, point: Point, env_python: str | None, remote: bool,
                 python: str) -> tuple[BootstrapCommand, bool]:
        """The ``BootstrapCommand`` of the proc at ``point``, and whether it is
        the default one the starting host's Python runs (``ProcSpec.default_program``)."""
        if callable(bootstrap_command) and not isinstance(bootstrap_command, BootstrapCommand):
            cmd = bootstrap_command(point)
            if not isinstance(cmd, BootstrapCommand):
                raise TypeError(f"bootstrap_command({point}) returned {type(cmd).__name__}, not a BootstrapCommand")
            return cmd, False
        if bootstrap_command is not None:
            return bootstrap_command, False
        if env_python is not None and self._python is None:
            return default_bootstrap_cmd(env_python), False
        return default_bootstrap_cmd(self._python or python), self._python is None and remote

    def stop(self) -> Future[None]:
        """Stop every proc spawned on these hosts; keep the hosts for reuse.

        If the client ends while the mesh is stopped (no ``spawn_procs``
        since), its allocation is *detached* rather than released
        (``Allocation.detach``): a scheduler whose hosts can outlive the
        client (a Slurm job) keeps them for a later client."""
        _owner_check(self, "stop")
        if self._allocation is not None:
            self._allocation.stopped = True
        _state.emit("host_mesh_stopping", mesh=self._name, shutdown=False)
        self._stop_watcher()
        return _stopped_when_done(self._stop_procs(), mesh=self._name, shutdown=False)

    def _stop_watcher(self) -> None:
        """End the ``auto_reload`` watcher of a ``sync_workspace`` call, if any."""
        if self._shared.get("watcher") is not None:
            from monarch_core._launch import _code_sync

            _code_sync.stop_watcher(self._shared)

    def _forget_procs(self, pm: Any) -> None:
        """``pm`` (spawned here) is stopping: these hosts no longer keep it."""
        with contextlib.suppress(ValueError):
            self._shared["procs"].remove(pm)

    def _stop_procs(self, grace: float | None = None) -> Future[None]:
        procs = list(self._shared["procs"])
        self._shared["procs"].clear()
        return Future._of(_all_done([p._stop_owned("its host mesh was stopped", grace)._ensure() for p in procs]))

    def shutdown(self) -> Future[None]:
        """Stop every proc and give the hosts back; the mesh is unusable after
        (a second ``shutdown()`` raises ``RuntimeError``, as the reference's does)."""
        _owner_check(self, "shut down")
        if self._shared["shutdown"]:
            raise RuntimeError(f"HostMesh has already been shut down (host mesh {self._name!r} has been shut down "
                               "and its hosts given back): nothing to do")
        return self._end(detach=False)

    def _end(self, *, detach: bool) -> Future[None]:
        """Stop the procs, tell the worker loops to exit, then release the
        allocation (``detach``: through ``Allocation.detach``, keeping the hosts)."""
        _state.emit("host_mesh_stopping", mesh=self._name, shutdown=True)
        self._stop_watcher()
        fut = self._stop_procs()
        self._shared["shutdown"] = True
        alloc = self._allocation
        if alloc is not None:
            alloc.closing = True  # worker loops ending from now on are not lost hosts
        remote = [h.address for h in self._hosts if h.address is not None]
        if alloc is None and not remote:
            return _stopped_when_done(fut, mesh=self._name, shutdown=True)
        _start.ensure_runtime()
        rt = _state.current()
        out = Cell()

        async def release() -> None:
            kernel = rt.kernel
            for a in remote:  # worker loops exit (and kill anything left)
                rt.agent.unwatch_host(host_proc_id(a))
                _send.control(kernel, host_proc_id(a), a, C.HostShutdown())
            await kernel.flush(2.0)
            if alloc is not None:  # off the loop: a scheduler's release may block
                import trio

                release = functools.partial(alloc.release, detach=True) if detach else alloc.release
                await trio.to_thread.run_sync(release, abandon_on_cancel=True)
            _state.emit("host_mesh_stopped", mesh=self._name, shutdown=True)
            out.set_result(None)

        def after() -> None:
            rt.kernel.call_soon(rt.kernel.start_task, release)

        c = fut._ensure()
        if not c.add_callback(after):
            after()
        return Future._of(out)

    async def sync_workspace(self, workspace: Workspace, conda: bool = False, auto_reload: bool = False) -> None:
        """Copy ``workspace``'s local directories to every host of this mesh
        (or slice), only what changed, into each host's working directory;
        procs spawned on them afterwards import the new code (the host's
        copies first on their ``sys.path``).

        ``conda=True``: also ship the client's environment (the active conda
        env, else the venv at ``sys.prefix``); procs spawned afterwards run
        its interpreter.  ``auto_reload=True``: watch the workspace and, on a
        change, sync it and reload the changed modules in the running procs
        of these hosts (what a reload cannot do: docs/workspace.md); the next
        call replaces the watcher, ``stop()``/``shutdown()`` end it.

        Done by the scheduler that allocated the hosts (``ssh``: SFTP;
        ``slurm``: a shared filesystem used where it is, else job steps;
        see docs/workspace.md); ``this_host()`` and ``local`` hosts share
        this machine's files, so nothing is copied.  Raises ``TypeError``
        for bad arguments, ``FileNotFoundError`` for a missing local
        directory, ``RuntimeError`` for ``conda=True`` on a system
        interpreter, ``NotImplementedError`` naming what is unsupported (a
        scheduler that cannot copy, worker loops attached with
        ``attach_to_workers``), ``AllocationError`` naming the host a copy
        failed on."""
        from monarch_core._launch import _code_sync

        if self._shared["shutdown"]:
            raise RuntimeError(f"HostMesh has already been shut down (host mesh {self._name!r} has been shut down "
                               "and its hosts given back): allocate hosts again")
        cell = _code_sync.start(self._allocation, self.hosts, workspace, conda, auto_reload,
                                attached=self._allocation is None, mesh=self._name, shared=self._shared)
        await Future._of(cell)

    def _stop_owned(self, reason: str, grace: float | None = None) -> Future[None]:
        """How the agent shuts a host mesh it owns down at exit (``register_owned``)."""
        if self._shared["shutdown"]:
            return Future._resolved(None)
        if self._allocation is None:  # attached worker loops outlive their clients
            return self._stop_procs(grace)
        return self._end(detach=self._allocation.stopped)

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._owner and not self._shared["shutdown"]:
            await self.shutdown()

    def __reduce__(self) -> Any:
        return (_rebuild_host_mesh, (self._hosts, self._region_, self._python, self._name))

    def __repr__(self) -> str:
        return f"<HostMesh {self._name!r} {self._region_.extent}>"


def _output_mode(remote: bool) -> Literal["direct", "stream", "file"]:
    """Where procs' output goes by default (``ProcSpec.output``): see :attr:`HostMesh.stream_logs`."""
    if settings.get("MONARCH_STREAM_LOGS"):  # (default: every proc streams, as Ray's workers do)
        return "stream"
    return "file" if remote else "direct"


def _stopped_when_done(fut: Future[None], mesh: str, shutdown: bool) -> Future[None]:
    """``fut`` (a host mesh's stop), emitting the runtime event ``host_mesh_stopped`` when it resolves."""
    def done() -> None:
        _state.emit("host_mesh_stopped", mesh=mesh, shutdown=shutdown)

    if not fut._ensure().add_callback(done):
        done()
    return fut


def _rebuild_host_mesh(hosts: list, region: Region, python: str | None, name: str) -> HostMesh:
    return HostMesh(hosts, region, owner=False, python_executable=python, name=name)


def _procs_of_host_lost(kernel: Kernel, shared: dict, hosts: list, host_name: str, reason: str) -> None:
    """Fail every proc of the host meshes sharing ``shared`` that runs on
    ``host_name``, and the session to its worker loop (kernel loop)."""
    agent = getattr(kernel, "agent", None)
    for pm in list(shared["procs"]):
        for slot in pm._slots:
            if slot.host_name == host_name and slot.proc_id not in kernel.dead:
                if agent is not None:  # what its reports say: the host, not the process, was seen to go
                    agent.note_failure_cause(slot.proc_id, f"host lost: {host_name}: {reason}")
                kernel.proc_failed(slot.proc_id, f"{slot.describe}: its host {host_name} was lost: {reason}")
    for h in hosts:
        if h.name == host_name and h.address is not None:
            kernel.proc_failed(host_proc_id(h.address), f"host {host_name} was lost: {reason}")


def _check_per_host(per_host: Any, host_labels: tuple) -> dict[str, int]:
    if per_host is None:
        return {}
    if not isinstance(per_host, dict):
        raise TypeError(f"per_host must be a dict like {{'gpus': 4}}, got {type(per_host).__name__}")
    if not per_host:
        raise ValueError(
            "per_host={} names no dimension of procs per host: give one, like per_host={'gpus': 4}, or leave "
            "per_host out for one proc per host")
    for k, v in per_host.items():
        if not isinstance(k, str) or not k:
            raise TypeError(f"per_host keys must be dimension names (str), got {k!r}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"per_host[{k!r}] must be an int >= 1, got {v!r}")
        if k in host_labels:
            raise ValueError(f"per_host dimension {k!r} clashes with a host mesh dimension {list(host_labels)}")
    return dict(per_host)

