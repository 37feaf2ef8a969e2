"""``ProcMesh``: a mesh of procs that spawns actor meshes, and stops its procs (``_launch._spawn.stop_procs``)."""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from monarch_core._launch import _start
from monarch_core._proc import _send, _serial, _state
from monarch_core._actor._actor import Actor
from monarch_core._actor._actor_mesh import ActorMesh, _Mesh, _release
from monarch_core._actor._endpoint import _diagnose
from monarch_core._proc._future import Cell, Future
from monarch_core._proc._owned import Applied
from monarch_core._actor import _engine, _patches
from monarch_core._actor._mesh_base import START_TIMEOUT, _owner_check, _ProcSlot, _slot_from_ref
from monarch_core._proc._port import GatherReplies
from monarch_core._proc import _control as C
from monarch_core._launch._spawn import stop_procs
from monarch_core._mesh._shape import Point, Region

logger = logging.getLogger("monarch.mesh")

T = TypeVar("T")


class HostMesh(Protocol):
    """A ``_host_mesh.HostMesh`` as its proc meshes see it (that module
    imports this one, so it is not named here; ``HostMesh`` satisfies this)."""

    _name: str

    def spawn_procs(self, per_host: dict[str, int] | None = None,
                    bootstrap: Callable[[], Any] | None = None) -> ProcMesh:
        """Start ``per_host`` procs on every host of this mesh (``_host_mesh.HostMesh.spawn_procs``)."""

    def _forget_procs(self, pm: ProcMesh) -> None:
        """``pm`` (spawned here) is stopping: these hosts no longer keep it."""


class ProcMesh(_Mesh):
    """A mesh of processes that can spawn actor meshes."""

    def __init__(
        self,
        name: str,
        slots: list[_ProcSlot],
        region: Region,
        host_mesh: HostMesh | None,
        init_cell: Cell,
        owner: bool,
        actor_meshes: dict[str, ActorMesh] | None = None,
    ) -> None:
        self._name = name
        self._slots = slots
        self._region_ = region
        self._host_mesh = host_mesh
        self._init_cell = init_cell
        self._owner = owner
        self._stopped: Cell | None = None
        #: mesh key -> the actor meshes this process spawned here and has not stopped (shared by slices):
        #: released when this mesh stops
        self._actor_meshes: dict[str, ActorMesh] = {} if actor_meshes is None else actor_meshes
        if owner and host_mesh is not None:
            _start.ensure_runtime()
            _state.current().events.emit("proc_mesh_spawned", mesh=name, slots=slots, extent=region.extent,
                                         host_mesh=getattr(host_mesh, "_name", ""))

    def _with_region(self, region: Region) -> ProcMesh:
        return ProcMesh(self._name, self._slots, region, self._host_mesh, self._init_cell, False, self._actor_meshes)

    @property
    def host_mesh(self) -> HostMesh | None:
        return self._host_mesh

    @property
    def name(self) -> str:
        return self._name

    @property
    def proc_ids(self) -> list[str]:
        """The ids of this view's procs, in rank order (two views hold the
        same proc where they list the same id: slices of one mesh share them)."""
        return [self._slots[r].proc_id for r in self._region_.root_ranks()]

    def spawn(self, name: str, Class: type[T], *args: Any, **kwargs: Any) -> T:
        """Spawn an actor mesh of ``Class`` on every proc of this mesh.

        Returns immediately; each actor's ``__init__`` runs before its first
        endpoint call.  ``ValueError`` if ``Class`` is not an ``Actor``
        subclass, or if an actor mesh of this proc mesh (or of a slice of it)
        already has that ``name`` and has not been stopped; ``TypeError``,
        before anything is sent, if ``args``/``kwargs`` do not fit the
        signature of ``Class.__init__`` (as torchmonarch does)."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"spawn(name, Class, ...): name must be a non-empty str, got {name!r}")
        Class = _patches.spawn_class(Class) if isinstance(Class, type) else Class  # monarch_core.testing's patches
        if not (isinstance(Class, type) and issubclass(Class, Actor)):
            raise ValueError(
                f"spawn({name!r}, {getattr(Class, '__name__', Class)!r}): the class must subclass "
                "monarch_core.actor.Actor"
            )
        if self._stopped is not None:
            why = next((s.stopped for s in self._slots if s.stopped), None)
            raise RuntimeError(
                f"proc mesh {self._name!r} has been stopped{f' ({why})' if why else ''}; cannot spawn "
                f"{name!r} on it: spawn procs again"
            )
        _bind_constructor(name, Class, args, kwargs)
        for other in self._actor_meshes.values():
            if other._name == name:
                raise ValueError(
                    f"spawn({name!r}, {Class.__qualname__}): proc mesh {self._name!r} already has an actor mesh "
                    f"named {name!r} (class {other._class.__qualname__}); their metrics and logs would be "
                    f"mixed up. Give this one another name (for example {name + '_2'!r}), or stop the other first "
                    f"({name}.stop())"
                )
        try:
            payload, bufs = _serial.dumps_spawn(Class, args, kwargs)
        except Exception as e:
            raise TypeError(f"constructor arguments of {Class.__qualname__} could not be pickled: {e}") from e
        _start.ensure_runtime()
        rt = _state.current()
        kernel = rt.kernel
        region = self._region_
        key = f"{name}-{uuid.uuid4().hex[:10]}"
        gather = GatherReplies(kernel, region.extent, f"spawn of actor mesh {name!r} ({Class.__qualname__})",
                               lambda e, v: True, adverb="spawn")
        reply = (rt.proc_id, kernel.address, gather.port_id)
        owner_host = _state.current_actor.get()
        owner = (rt.proc_id, kernel.address, owner_host.key if owner_host is not None else "")
        members = [self._slots[root] for root in region.root_ranks()]
        mesh: ActorMesh[Any] = ActorMesh(Class, name, key, members, region.extent.region, self, gather.cell, True)
        from monarch_core._proc._agent import Supervised

        # Register before sending: a failing __init__ reports back at once.
        rt.agent.register_supervised(
            Supervised(key, name, Class.__qualname__, mesh, owner_host, mesh._health, members)
        )
        trace, traced = rt.instrumentation.spawn_trace(name)  # (the ``__init__`` s record under a traced spawn)
        gather.by_rank([slot.proc_id for slot in members])  # (a proc that answered and then ended fails nothing)
        for i, slot in enumerate(members):
            _send.control(kernel, slot.proc_id, slot.address if slot.ready.is_set() else None,
                          C.Spawn(key, name, i, region.labels, region.sizes, reply, Class.__qualname__, owner, trace),
                          payload, bufs, gather.port_id)
        gather.procs = [slot.proc_id for slot in members]
        if traced is not None and not gather.cell.add_callback(traced):
            traced()
        rt.agent.register_owned(mesh)
        self._actor_meshes[key] = mesh
        rt.events.emit("actor_mesh_spawned", mesh=mesh, proc_mesh=self._name, init=gather)
        return mesh  # type: ignore[return-value]

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every proc (and actor) of this mesh and release it.  Only the
        owner may stop it."""
        _owner_check(self, "stop")
        return self._stop_owned(reason)

    def _stop_owned(self, reason: str, grace: float | None = None) -> Future[None]:
        if self._stopped is not None:
            return Future._of(self._stopped)
        from monarch_core._proc._agent import STOP_GRACE

        cell = self._stopped = Cell()
        _start.ensure_runtime()
        rt = _state.current()
        _release(rt, self)
        if self._host_mesh is not None:
            self._host_mesh._forget_procs(self)
        for am in list(self._actor_meshes.values()):  # they stop with their procs: nothing keeps them
            if not am._stopped:
                am._stopped = True
                _release(rt, am)
                rt.events.emit("actor_mesh_released", mesh_key=am._key, class_name=am._class.__qualname__, done=cell)
        self._actor_meshes.clear()
        slots = [s for s in self._slots if s.proc_id != rt.proc_id]
        note = f"its proc mesh {self._name!r} was stopped: {reason}"
        for s in slots:  # shared with the actor meshes spawned here: their failures say why
            if s.stopped is None:
                s.stopped = note
        if slots:
            rt.events.emit("proc_mesh_stopping", mesh=self._name, reason=reason)
            stop_procs(rt.kernel, slots, reason, STOP_GRACE if grace is None else grace, cell, self._name)
        else:
            cell.set_result(None)
        return Future._of(cell)

    def logging_option(
        self,
        stream_to_client: bool = True,
        aggregate_window_sec: float | None = 3,
        level: int = logging.INFO,
    ) -> Applied:
        """Where this mesh's procs send their output, from now on.

        ``stream_to_client=True``: each proc's stdout, stderr and ``logging``
        records reach this client's terminal, each line prefixed with the actor
        (or proc) that wrote it and its host -- ``[trainers{'gpus': 3/4} h2] ...`` --
        in the order each proc wrote them; what a proc printed before it stops
        arrives before ``stop()`` returns.  With ``aggregate_window_sec``, the
        lines of this mesh's procs are collected for that many seconds and
        identical ones are printed once with a count (``[16 similar lines] step
        10 loss 0.12``); ``None`` or 0 prints each line as it comes.
        ``stream_to_client=False``: a local proc writes to this host's terminal,
        a remote one to its host's log file (the client logs its path).
        ``level`` is the level of the procs' root logger (the user's
        ``logging`` calls; monarch's own loggers keep ``MONARCH_LOG_LEVEL``).

        Blocks until every proc applied it (each within ``MONARCH_PROC_START_TIMEOUT``);
        ``RuntimeError`` naming the procs that did not.  The reference's is
        ``async``: the result may be awaited (``await pm.logging_option(...)``,
        ``asyncio.run(pm.logging_option(...))``), which returns at once, the
        work being done.  The defaults differ from the reference's
        (``stream_to_client=False``): see docs/logging.md.
        """
        if not isinstance(stream_to_client, bool):
            raise TypeError(f"logging_option(stream_to_client=...) must be True or False, got {stream_to_client!r}")
        if aggregate_window_sec is not None and (
            isinstance(aggregate_window_sec, bool) or not isinstance(aggregate_window_sec, (int, float))
            or aggregate_window_sec < 0
        ):
            raise ValueError(
                f"logging_option(aggregate_window_sec=...) must be a number of seconds >= 0 or None, "
                f"got {aggregate_window_sec!r}"
            )
        if isinstance(level, str):
            named = logging.getLevelName(level.upper())
            if not isinstance(named, int):
                raise ValueError(f"logging_option(level={level!r}): not a logging level name; use e.g. logging.INFO")
            level = named
        if isinstance(level, bool) or not isinstance(level, int) or level < 0:
            raise TypeError(f"logging_option(level=...) must be a logging level such as logging.INFO, got {level!r}")
        if self._stopped is not None:
            raise RuntimeError(f"proc mesh {self._name!r} has been stopped; spawn procs again")
        slots = [self._slots[r] for r in self._region_.root_ranks()]
        _start.ensure_runtime()
        _state.current().instrumentation.log_option(self._name, slots, stream_to_client, level,
                                                    aggregate_window_sec, START_TIMEOUT)
        return Applied()

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._owner:
            await self.stop()

    def activate(self) -> Any:
        """A context manager: inside it every torch operation runs on every
        proc of this mesh, as distributed tensors (the tensor engine plugin,
        ``monarch-tensor-engine``; docs/tensors.md).  ``ImportError`` naming
        the plugin when it is not installed."""
        return _engine.engine("ProcMesh.activate()").activate(_patches.activation_mesh(self))

    def rank_tensor(self, dim: str) -> Any:
        """A distributed integer tensor whose value on each proc is its coordinate along ``dim``."""
        return _engine.engine("ProcMesh.rank_tensor()").rank_tensor(self, dim)

    def rank_tensors(self) -> Any:
        """``{dim: rank_tensor(dim)}`` for every dimension of this mesh."""
        return _engine.engine("ProcMesh.rank_tensors()").rank_tensors(self)

    def process_group(self, dims: Any, backend: str | None = None) -> Any:
        """A ``torch.distributed`` process group over the dimensions ``dims`` of
        this mesh, for remote functions running on its procs (the tensor
        engine's ``RemoteProcessGroup``; docs/tensors.md)."""
        return _engine.engine("ProcMesh.process_group()").process_group(self, dims, backend)

    def to_table(self) -> str:
        """A text table: rank, coordinates, proc id, pid, address, host name."""
        rows = [f"{'rank':>4}  {'coords':<28} {'proc':<40} {'pid':>8}  {'address':<40} host"]
        ext = self._region_.extent
        for i, root in enumerate(self._region_.root_ranks()):
            s = self._slots[root]
            rows.append(f"{i:>4}  {str(Point(i, ext)):<28} {s.proc_id:<40} {s.pid or '-':>8}  "
                        f"{s.address or '(starting)':<40} {s.host_name or '-'}")
        return "\n".join(rows)

    @classmethod
    def from_host_mesh(cls, host_mesh: HostMesh, hy_proc_mesh: Any = None, region: Any = None, setup: Any = None,
                       _attach_controller_controller: bool = True) -> ProcMesh:
        """Spawn one proc per host of ``host_mesh`` (``setup`` as bootstrap)."""
        return host_mesh.spawn_procs(bootstrap=setup)

    def __reduce__(self) -> Any:
        refs = [self._slots[r].ref() for r in self._region_.root_ranks()]
        return (_rebuild_proc_mesh, (self._name, refs, self._region_.extent.region))

    def __repr__(self) -> str:
        return f"<ProcMesh {self._name!r} {self._region_.extent}>"


def _rebuild_proc_mesh(name: str, refs: list, region: Region) -> ProcMesh:
    return ProcMesh(name, [_slot_from_ref(r) for r in refs], region, None, Future._resolved(True)._ensure(), False)



def _bind_constructor(name: str, Class: type[Any], args: tuple, kwargs: dict) -> None:
    """``TypeError`` naming the class and the argument if ``Class(*args,
    **kwargs)`` would not bind to ``Class.__init__`` 's signature (checked
    here, before anything is sent: the actors would all fail in ``__init__``)."""
    if Class.__init__ is object.__init__:  # no ``__init__`` of its own: it takes no arguments
        if args or kwargs:
            raise TypeError(
                f"spawn({name!r}, {Class.__qualname__}, ...): {Class.__qualname__} defines no __init__, so it takes "
                f"no constructor arguments; got {len(args)} positional and {sorted(kwargs)} keyword")
        return
    try:
        sig = inspect.signature(Class.__init__)
    except (TypeError, ValueError):  # no signature to check (a builtin): the actors find out
        return
    try:
        sig.bind(None, *args, **kwargs)  # ``None`` for ``self``
    except TypeError as e:
        # a misspelt keyword is named first (``Signature.bind`` would report the
        # required argument it stands for as missing), as endpoint calls do
        why = _diagnose(list(sig.parameters.values())[1:], kwargs, e).rstrip(".")
        raise TypeError(
            f"spawn({name!r}, {Class.__qualname__}, ...): the arguments do not fit "
            f"{Class.__qualname__}.__init__{_shown(sig)}: {why}{'' if why.endswith('?') else '.'} "
            "Nothing was spawned."
        ) from None


def _shown(sig: inspect.Signature) -> str:
    """The signature without ``self``, as the user wrote it."""
    params = list(sig.parameters.values())[1:]
    return str(sig.replace(parameters=params))
