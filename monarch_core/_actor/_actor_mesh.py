"""``ActorMesh``: a mesh of actors of one class and its endpoints' adverbs (they send through ``_proc._send``)."""

from __future__ import annotations

import contextlib
from typing import Any, Generic, Protocol, TypeVar

from monarch_core._launch import _start
from monarch_core._proc import _serial, _state
from monarch_core._actor._endpoint import Endpoint, EndpointProperty, NotAnEndpoint
from monarch_core._proc._future import Cell, Future
from monarch_core._actor._mesh_base import _owner_check, _ProcSlot, _slot_from_ref
from monarch_core._proc._port import (
    GatherReplies,
    OneReply,
    StreamIterator,
    StreamReplies,
    this_proc_and_host,
)
from monarch_core._proc._send import Call, Recipients
from monarch_core._proc._supervision import MeshFailure
from monarch_core._mesh._shape import Extent, MeshTrait, Point, Region
from monarch_core._mesh._value_mesh import ValueMesh
from monarch_core.errors import ActorError, SupervisionError

T = TypeVar("T")


class ProcMesh(Protocol):
    """A ``_proc_mesh.ProcMesh`` as its actor meshes see it (that module
    imports this one, so it is not named here; ``ProcMesh`` satisfies this)."""

    @property
    def _actor_meshes(self) -> dict[str, ActorMesh[Any]]:
        """Actor mesh key -> the actor meshes spawned on these procs."""


def _sender_name() -> str:
    host = _state.current_actor.get()
    return host.display_name if host is not None else "client"


class _Mesh(MeshTrait):
    """What the actor, proc and host meshes share: the region of the view
    (``_region_``, the ``MeshTrait`` hook) and the cell that says when the
    mesh is ready (``_init_cell``)."""

    _region_: Region
    _init_cell: Cell

    @property
    def _region(self) -> Region:
        return self._region_

    @property
    def initialized(self) -> Future[bool]:
        """Resolves to True once the mesh is ready: every actor's ``__init__``
        has run (raises the first ``__init__`` error), every proc has started
        and run its bootstrap; a host mesh's at once."""
        return Future._of(self._init_cell)


class ActorMesh(_Mesh, Generic[T]):
    """A mesh of actors of one class.  Endpoint attributes are
    :class:`~monarch_core.actor.Endpoint` s; slicing gives a view.

    What its endpoints call (underscored: a public name would hide an endpoint
    of that name): ``_call_one``, ``_call_all``, ``_call_stream`` and ``_cast``
    send through the proc runtime's send path (``_proc._send``: this view's
    :class:`~monarch_core._proc._send.Recipients`); ``_describe_call`` words a
    failed call; ``_region`` is the ``MeshTrait`` hook."""

    def __init__(
        self,
        cls: type,
        name: str,
        key: str,
        members: list[_ProcSlot],
        region: Region,
        proc_mesh: ProcMesh | None,
        init_cell: Cell,
        owner: bool,
        health: dict | None = None,
    ) -> None:
        self._class = cls
        self._name = name
        self._key = key
        # actor rank -> failure report; shared by the owner and its slices
        self._health: dict[int, dict] = health if health is not None else {}
        self._members = members
        self._region_ = region
        self._proc_mesh = proc_mesh
        self._init_cell = init_cell
        self._owner = owner
        self._stopped = False
        self._endpoints: dict[str, Any] = {}
        self._recipients = Recipients(key, members, region)  # how messages reach this view (``_proc._send``)

    def _with_region(self, region: Region) -> ActorMesh[T]:
        return ActorMesh(
            self._class, self._name, self._key, self._members, region, self._proc_mesh, self._init_cell, False,
            self._health,
        )

    def _failed_error(self, ep: Endpoint[Any, Any]) -> SupervisionError | None:
        """If a rank of this (sliced) mesh has failed, the error to fail fast with."""
        health = self._health
        if not health:
            return None
        failed = [(i, health[r]) for i, r in enumerate(self._region_.root_ranks()) if r in health]
        if not failed:
            return None
        return _failed_ranks_error(self, ep.name, failed)

    def _describe_call(self, endpoint: str, adverb: str, ranks: list[int] | None, proc_id: str | None,
                       exc: BaseException) -> str | None:
        """How a failed call of ``endpoint`` on this view reads: the adverb, the
        mesh and its class, the ranks concerned (by the view's coordinates) and
        the proc and host of each; a stop reason its proc mesh was given.
        ``None`` when ``exc`` is the endpoint's own ``ActorError`` (which names
        all that already).  Only ever called for a failure."""
        if isinstance(exc, ActorError) and exc.endpoint == endpoint and exc.actor:
            return None  # raised by the endpoint itself: its text names the actor, endpoint, proc and host
        region = self._region_
        n = region.nelements
        members = self._members
        if ranks is None or any(r < 0 or r >= n for r in ranks):
            ranks = [i for i in range(n) if proc_id is None or members[region.root_rank(i)].proc_id == proc_id]
        head = f"{adverb}() of {self._name}.{endpoint} (actor mesh {self._name!r}, class {self._class.__qualname__})"
        if not ranks:
            return f"{head} failed"
        text = f"{head} failed on {_ranks_where(self, ranks)}"
        stops = {members[region.root_rank(r)].stopped for r in ranks} - {None}
        if stops:
            text += " (" + "; ".join(sorted(stops)) + ")"  # type: ignore[arg-type]  # (None taken out above)
        return text

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr in ("_class", "_endpoints", "_name", "_region_"):
            raise AttributeError(attr)
        eps = self._endpoints
        ep = eps.get(attr)
        if ep is not None:
            return ep
        for klass in self._class.__mro__:
            v = klass.__dict__.get(attr)
            if v is None:
                continue
            if isinstance(v, EndpointProperty):
                ep = eps[attr] = Endpoint(self, attr, v)
                return ep
            if callable(v) and not isinstance(v, type):
                return NotAnEndpoint(self, attr, v, self._class.__qualname__)
            break
        raise AttributeError(
            f"actor mesh {self._name!r} of {self._class.__qualname__} has no endpoint {attr!r}"
        )

    @property
    def proc_mesh(self) -> ProcMesh | None:
        return self._proc_mesh

    @property
    def name(self) -> str:
        return self._name

    # ------------------------------------------------------------- sending
    def _prologue(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict, adverb: str,
                  index: int | None = None) -> tuple[_state.ProcRuntime, Any, Any, list]:
        """The send prologue every adverb runs before it sends: this process's
        runtime (a client's started on first use), the endpoint's client-side
        telemetry (``Instrumentation.client_side``, kept on the endpoint; falsy when
        off), the refusal of a call to a view with failed ranks (counted on
        that telemetry as a failed call of ``adverb`` -- of rank ``index`` for
        a ``call_one`` -- then raised: a ``SupervisionError``), and the
        arguments pickled (``TypeError`` when they cannot be).  Returns
        ``(runtime, telemetry, payload, buffers)``."""
        rt = _state.current_runtime_or_none()
        if rt is None:
            _start.ensure_runtime()
            rt = _state.current()
        tm = ep._tm
        if tm is None:
            tm = ep._tm = rt.instrumentation.client_side(ep)
        if self._health:
            err = self._failed_error(ep)
            if err is not None:
                if tm:
                    tm.refused(self._region_, index, adverb, type(err).__name__)
                raise err
        try:
            payload, bufs = _serial.dumps((args, kwargs))
        except Exception as e:
            raise TypeError(f"arguments of {ep._describe()} could not be pickled: {e}") from e
        return rt, tm, payload, bufs

    def _call_one(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict, index: int,
                  adverb: str = "call_one") -> Cell:
        try:
            rt, tm, payload, bufs = self._prologue(ep, args, kwargs, adverb, index)
        except SupervisionError as err:
            return Future._failed(err)._ensure()
        kernel = rt.kernel
        if tm:
            h, trace = tm.one(kernel, self._region_, index, adverb, payload, bufs, ep)
        else:
            h, trace = OneReply(kernel, ep, adverb, index), None
        port_id = h.port_id
        call = Call(ep.name, payload, bufs, (rt.proc_id, kernel.address, port_id), port_id, None,
                    ep.explicit_response_port, _sender_name(), trace)
        h.proc_id = self._recipients.send_one(kernel, index, call)
        return h.cell

    def _call_all(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict) -> Cell:
        try:
            rt, tm, payload, bufs = self._prologue(ep, args, kwargs, "call")
        except SupervisionError as err:
            return Future._failed(err)._ensure()
        kernel = rt.kernel
        if tm:
            h = tm.gather(kernel, self._region_.extent, ValueMesh, "call", payload, bufs, ep)
            trace = tm.trace_bytes(h.sp)
        else:
            h, trace = GatherReplies(kernel, self._region_.extent, ep, ValueMesh), None
        call = Call(ep.name, payload, bufs, (rt.proc_id, kernel.address, h.port_id), h.port_id, None,
                    ep.explicit_response_port, _sender_name(), trace)
        recipients = self._recipients
        by_rank = recipients.rank_procs()
        if by_rank is not None:
            h.by_rank(by_rank)
        h.procs = recipients.cast(kernel, None, call, gather=h)
        return h.cell

    def _call_stream(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict) -> StreamIterator[Any]:
        n = self._region_.nelements
        try:
            rt, tm, payload, bufs = self._prologue(ep, args, kwargs, "stream")
        except SupervisionError as err:
            refused = StreamReplies(_state.current().kernel, n, "")
            refused.fail(err)
            return StreamIterator(refused)
        kernel = rt.kernel
        if tm:
            h = tm.stream(kernel, n, payload, bufs, ep)
            trace = tm.trace_bytes(h.sp)
        else:
            h, trace = StreamReplies(kernel, n, ep), None
        call = Call(ep.name, payload, bufs, (rt.proc_id, kernel.address, h.port_id), h.port_id, None,
                    ep.explicit_response_port, _sender_name(), trace)
        recipients = self._recipients
        by_rank = recipients.rank_procs()
        if by_rank is not None:
            h.by_rank(by_rank)
        h.procs = recipients.cast(kernel, None, call)
        return StreamIterator(h)

    def _cast(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict, port: Any, only: int | None,
              adverb: str = "broadcast") -> None:
        rt, tm, payload, bufs = self._prologue(ep, args, kwargs, adverb)
        reply = port._ref if port is not None else None
        host = _state.current_actor.get()
        ret = None
        if reply is None:
            ret = host.return_ref() if host is not None else rt.agent.return_ref()
        sp = tm.cast(adverb, self._region_.nelements if only is None else 1, payload, bufs) if tm else None
        call = Call(ep.name, payload, bufs, reply, None, ret, ep.explicit_response_port,
                    host.display_name if host is not None else "client",
                    tm.trace_bytes(sp) if sp is not None else None)
        self._recipients.cast(rt.kernel, None if only is None else (only,), call)
        if sp is not None:
            tm.end_cast(sp, adverb)

    # ------------------------------------------------------------- lifecycle
    def stop(self, reason: str = "stopped by its owner") -> Future[None]:
        """Stop every actor of this mesh (running ``__cleanup__``) and the
        meshes they own.  Only the owner may stop a mesh."""
        _owner_check(self, "stop")
        return self._stop_owned(reason)

    def _stop_owned(self, reason: str, grace: float | None = None) -> Future[None]:
        if self._stopped:
            return Future._resolved(None)
        self._stopped = True
        _start.ensure_runtime()
        rt = _state.current()
        h = GatherReplies(rt.kernel, self._region_.extent, "", lambda e, v: None)
        h.procs = self._recipients.stop(rt.kernel, reason, _sender_name(), h)
        _release(rt, self)
        rt.events.emit("actor_mesh_released", mesh_key=self._key, class_name=self._class.__qualname__, done=h.cell)
        done = _all_done([h.cell])
        rt.events.emit("actor_mesh_stopping", mesh=self, reason=reason, done=done)
        return Future._of(done)

    def __reduce__(self) -> Any:
        members = [self._members[r].ref() for r in self._region_.root_ranks()]
        return (_rebuild_actor_mesh, (self._class, self._name, self._key, members, self._region_.extent.region))

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} of {self._class.__qualname__} {self._region_.extent}>"


def _release(rt: Any, mesh: Any) -> None:
    """A mesh this process owns is stopping: nothing of this process keeps it
    any more -- the agent's (or the owning actor's) list of owned meshes, its
    supervision record, its proc mesh's list of actor meshes."""
    rt.agent.unregister_owned(mesh)
    host = _state.current_actor.get()
    if host is not None:
        with contextlib.suppress(ValueError):
            host.owned.remove(mesh)
    if isinstance(mesh, ActorMesh):
        rt.agent.unregister_supervised(mesh._key)
        pm = mesh._proc_mesh
        if pm is not None:
            pm._actor_meshes.pop(mesh._key, None)


#: Attributes an ``ActorMesh`` instance sets in ``__init__`` (they hide an endpoint of the same name too).
_INSTANCE_ATTRIBUTES = frozenset({
    "_class", "_name", "_key", "_health", "_members", "_region_", "_proc_mesh", "_init_cell", "_owner",
    "_stopped", "_endpoints", "_recipients",
})
#: Every name an ``ActorMesh`` answers itself, so that an endpoint of that name
#: would never be reached through the mesh (``Actor.__init_subclass__`` refuses them).
MESH_ATTRIBUTES: frozenset[str] = frozenset(
    n for n in dir(ActorMesh) if not (n.startswith("__") and n.endswith("__"))
) | _INSTANCE_ATTRIBUTES

#: ranks named one by one in a failure text; beyond, a count
_RANKS_SHOWN = 4


def _rank_where(mesh: ActorMesh[Any], index: int) -> str:
    """``rank 1 {'gpus': 1/2} on proc procs0{'gpus': 1/2} on host node7`` for
    rank ``index`` of the view ``mesh``."""
    region = mesh._region_
    root = region.root_rank(index)
    slot = mesh._members[root]
    coords = f" {Point(index, region.extent)}" if len(region.extent) else ""
    whole = _whole_extent(mesh)  # the actor's own coordinates, when the view is a slice
    actor = ""
    if whole is not None and len(whole):
        full = f" {Point(root, whole)}"
        if full != coords:
            actor = f" (actor {mesh._name}{full.strip()})"
    proc = slot.describe or f"proc {slot.proc_id}"
    if "on host " not in proc:
        host = slot.host_name if slot.host is not None else (this_proc_and_host()[1] if slot.describe else None)
        if host:
            proc += f" on host {host}"
    return f"rank {index}{coords}{actor} on {proc}"


def _whole_extent(mesh: ActorMesh[Any]) -> Extent | None:
    """The extent of the whole mesh ``mesh`` is a view of, when this process owns it."""
    rt = _state.current_runtime_or_none()
    rec = rt.agent.supervised.get(mesh._key) if rt is not None else None
    if rec is None or rec.mesh is None:
        return None
    return rec.mesh._region_.extent


def _ranks_where(mesh: ActorMesh[Any], ranks: list[int]) -> str:
    shown = "; ".join(_rank_where(mesh, r) for r in ranks[:_RANKS_SHOWN])
    if len(ranks) > _RANKS_SHOWN:
        shown += f"; and {len(ranks) - _RANKS_SHOWN} more ranks ({len(ranks)} in all)"
    return shown


def _failed_ranks_error(mesh: ActorMesh[Any], endpoint: str, failed: list[tuple[int, dict]]) -> SupervisionError:
    """The fail-fast error of a call to a view with failed ranks: every failed
    rank of the view, then the report of the first (its cascade, first failure first)."""
    ranks = ", ".join(f"{i} ({rep['mesh_name']}{rep['coords'] if rep['coords'] != '{}' else ''})"
                      for i, rep in failed[:_RANKS_SHOWN])
    if len(failed) > _RANKS_SHOWN:
        ranks += f" and {len(failed) - _RANKS_SHOWN} more"
    reports = [MeshFailure(None, rep).report() for _i, rep in failed[:2]]
    more = f"\n({len(failed) - 2} more failed ranks not shown)" if len(failed) > 2 else ""
    return SupervisionError(
        f"cannot call {mesh._name}.{endpoint}: actor mesh {mesh._name!r} ({mesh._class.__qualname__}) has failed "
        f"ranks; failed rank(s) of this view: {ranks}.\n" + "\n".join(reports) + more
    )


def _all_done(cells: list[Cell]) -> Cell:
    """A cell that resolves to None once every one of ``cells`` has, whatever
    the outcomes (stopping something already dead is not an error)."""
    out = Cell()

    def check() -> None:  # each cell is done before its callbacks run: the last one's sees them all done
        if all(c.done() for c in cells):
            out.set_result(None)

    for c in cells:
        c.add_callback(check)
    check()  # (those done already, or none at all)
    return out


def _rebuild_actor_mesh(cls: type, name: str, key: str, members: list, region: Region) -> ActorMesh[Any]:
    members = [_slot_from_ref(m) for m in members]
    return ActorMesh(cls, name, key, members, region, None, Future._resolved(True)._ensure(), False)
