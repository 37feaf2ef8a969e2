"""``ActorMesh``: a mesh of actors of one class, and how messages reach its members (directly or through the cast tree)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

from monarch_core._launch import _start
from monarch_core._proc import _serial, _state, _tree
from monarch_core._actor._endpoint import Endpoint, EndpointProperty, NotAnEndpoint
from monarch_core._proc._future import Cell, Future
from monarch_core._actor._mesh_base import _owner_check, _ProcSlot, _slot_from_ref
from monarch_core._proc._port import (
    GatherReplies,
    OneReply,
    StreamIterator,
    StreamReplies,
)
from monarch_core._proc import _control as C
from monarch_core._kernel import _wire as W
from monarch_core._mesh._shape import Extent, MeshTrait, Region
from monarch_core._mesh._value_mesh import ValueMesh
from monarch_core.errors import SupervisionError

T = TypeVar("T")
#: A ``ProcMesh`` (``_proc_mesh`` imports this module, so it is not named here).
ProcMesh = Any


def _sender_name() -> str:
    host = _state.current_actor.get()
    return host.display_name if host is not None else "client"


class ActorMesh(MeshTrait, Generic[T]):
    """A mesh of actors of one class.  Endpoint attributes are
    :class:`~monarch_core.actor.Endpoint` s; slicing gives a view."""

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
        self._whole_view: bool | None = None
        self._tree_view_id: str | None = None
        self._tree_sent: tuple | None = None  # (kernel, deaths known) when the member table last went out

    # MeshTrait hooks
    @property
    def _region(self) -> Region:
        return self._region_

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
        return _failed_ranks_error(self, ep._name, failed)

    def _describe_call(self, endpoint: str, adverb: str, ranks: list[int] | None, proc_id: str | None,
                       exc: BaseException) -> str | None:
        """How a failed call of ``endpoint`` on this view reads: the adverb, the
        mesh and its class, the ranks concerned (by the view's coordinates) and
        the proc and host of each; a stop reason its proc mesh was given.
        ``None`` when ``exc`` is the endpoint's own ``ActorError`` (which names
        all that already).  Only ever called for a failure."""
        return _describe_call(self, endpoint, adverb, ranks, proc_id, exc)

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
                return NotAnEndpoint(self, attr, v)
            break
        raise AttributeError(
            f"actor mesh {self._name!r} of {self._class.__qualname__} has no endpoint {attr!r}"
        )

    @property
    def initialized(self) -> Future[bool]:
        """Resolves to True once every actor's ``__init__`` has run (raises the
        first ``__init__`` error)."""
        return Future._of(self._init_cell)

    @property
    def proc_mesh(self) -> ProcMesh | None:
        return self._proc_mesh

    @property
    def name(self) -> str:
        return self._name

    # ------------------------------------------------------------- sending
    def _send(self, index: int, method: str, reply: tuple | None, rank_in_msg: int, region: Region,
              explicit: bool, payload: Any, bufs: list, reply_port: int | None, kernel: Kernel, sender: str,
              ret: tuple | None = None, trace: bytes | None = None) -> str:
        slot = self._members[region.root_rank(index)]
        header = W.actor_header(self._key, method, reply, rank_in_msg, region.labels, region.sizes, sender, ret,
                                explicit, trace)
        flags = W.F_PACKED if trace is None else W.F_PACKED | W.F_TRACE  # (a traced call: see ``Kernel.route``)
        addr = slot.address if slot.ready.is_set() else None
        if ret is not None:  # fire-and-forget: the return port hears only of undeliverable messages
            kernel.send(slot.proc_id, addr, W.K_ACTOR, flags, header, payload, bufs, ret[2], track=False)
        else:
            kernel.send(slot.proc_id, addr, W.K_ACTOR, flags, header, payload, bufs, reply_port)
        return slot.proc_id

    def _send_many(self, indices: Any, method: str, reply: tuple | None, region: Region, explicit: bool,
                   payload: Any, bufs: list, reply_port: int | None, kernel: Kernel, sender: str,
                   ret: tuple | None = None, gather: Any = None, trace: bytes | None = None) -> list[str]:
        """Send to the region indices ``indices`` (None: all of them), through
        the cast tree for a mesh of ``_tree.TREE_MIN`` actors or more; the procs
        a reply to ``reply_port`` now waits on.  ``gather``: the port handler
        of a ``call()``, whose replies the tree's forwarders gather into one
        batch per subtree."""
        if len(self._members) < _tree.TREE_MIN:
            idx = range(region.nelements) if indices is None else indices
            return [self._send(i, method, reply, i, region, explicit, payload, bufs, reply_port, kernel, sender, ret,
                               trace) for i in idx]
        members = self._members
        n = len(members)
        fanout = _tree.FANOUT
        if indices is None and self._whole():
            targets = None  # every member: each forwarder works out its children
        else:
            idx = range(region.nelements) if indices is None else indices
            targets = [(region.root_rank(i), i) for i in idx]
        dead_procs = kernel.dead

        def dead(m: int) -> bool:
            return members[m].proc_id in dead_procs

        _here, _rank, groups = _tree.plan(-1, n, fanout, targets, dead)
        view = self._tree_view()
        # A cast to every member carries the member table only the first time (and after
        # a death): the forwarders keep it, so the next ones cost this process fanout
        # small messages whatever the size of the mesh.
        carry = targets is not None or self._tree_sent != (kernel, len(dead_procs))
        procs: list[str] = []
        if gather is not None:
            for m in _tree.skipped_dead(-1, n, fanout, targets, dead):
                gather.deliver(m, W.S_ERROR, *_serial.dumps(kernel._dead_error(members[m].proc_id)))
        for hop, sub in groups.items():
            nodes = _tree.touched(hop, sub, n, fanout) if carry or reply_port is not None else (hop,)
            # The addresses every forwarder below needs (waits for procs still starting); a member
            # known to be dead goes without one, so that forwarders route around it too.
            table = {}
            for m in nodes:
                table[m] = (members[m].proc_id, _tree.DEAD) if dead(m) else members[m].ref()
            header = _tree.encode(self._key, method, reply, region.labels, region.sizes, sender, ret, explicit, n,
                                  fanout, hop, sub, table if carry else None, view, gather is not None)
            proc_id, address = table[hop]
            flags = W.F_TREE
            if trace is not None:
                header, flags = trace + header, W.F_TREE | W.F_TRACE
            if ret is not None:
                kernel.send(proc_id, address, W.K_ACTOR, flags, header, payload, bufs, ret[2], track=False)
            else:
                kernel.send(proc_id, address, W.K_ACTOR, flags, header, payload, bufs, reply_port)
            if reply_port is not None:
                # The loss of any proc on the way fails the call at once (this process hears of a
                # death first when it spawned the proc; a forwarder only sees a broken connection).
                for m in nodes:
                    p, a = table[m]
                    if a != _tree.DEAD:
                        kernel.expect_reply(p, reply_port)
                        procs.append(p)
        if targets is None:
            self._tree_sent = (kernel, len(dead_procs))
        return procs

    def _tree_view(self) -> str:
        """An id of this view's member list (forwarders key the member tables they keep by it)."""
        v = self._tree_view_id
        if v is None:
            import hashlib

            ids = "\0".join(slot.proc_id for slot in self._members).encode()
            v = self._tree_view_id = hashlib.blake2b(ids, digest_size=12).hexdigest()
        return v

    def _whole(self) -> bool:
        """This view is the whole mesh, rank i being member i."""
        w = self._whole_view
        if w is None:
            region = self._region_
            n = len(self._members)
            w = self._whole_view = region.nelements == n and all(region.root_rank(i) == i for i in range(n))
        return w

    def _pack(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict) -> tuple[Any, list]:
        try:
            return _serial.dumps((args, kwargs))
        except Exception as e:
            raise TypeError(f"arguments of {ep._describe()} could not be pickled: {e}") from e

    def _call_one(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict, index: int,
                  adverb: str = "call_one") -> Cell:
        err = self._failed_error(ep)
        if err is not None:
            return _failed_cell(err)
        payload, bufs = self._pack(ep, args, kwargs)
        rt = _start.runtime()
        kernel = rt.kernel
        tm = ep._tm
        if tm is None:
            tm = ep._tm = rt.observer.client_side(ep)
        if tm:
            h, trace = tm.one(kernel, self._region_, index, adverb, payload, bufs, ep)
        else:
            h, trace = OneReply(kernel, ep, adverb, index), None
        reply = (rt.proc_id, kernel.address, h.port_id)
        if len(self._members) < _tree.TREE_MIN:
            h.proc_id = self._send(index, ep._name, reply, index, self._region_, ep._prop._explicit_response_port,
                                   payload, bufs, h.port_id, kernel, _sender_name(), None, trace)
        else:
            h.proc_id = tuple(self._send_many((index,), ep._name, reply, self._region_,
                                              ep._prop._explicit_response_port, payload, bufs, h.port_id, kernel,
                                              _sender_name(), trace=trace))
        return h.cell

    def _call_all(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict) -> Cell:
        err = self._failed_error(ep)
        if err is not None:
            return _failed_cell(err)
        payload, bufs = self._pack(ep, args, kwargs)
        rt = _start.runtime()
        kernel = rt.kernel
        region = self._region_
        tm = ep._tm
        if tm is None:
            tm = ep._tm = rt.observer.client_side(ep)
        if tm:
            h = tm.gather(kernel, region.extent, ValueMesh, "call", payload, bufs, ep)
            trace = tm.trace_bytes(h.sp)
        else:
            h, trace = GatherReplies(kernel, region.extent, ep, ValueMesh), None
        reply = (rt.proc_id, kernel.address, h.port_id)
        h.procs = self._send_many(None, ep._name, reply, region, ep._prop._explicit_response_port, payload, bufs,
                                  h.port_id, kernel, _sender_name(), gather=h, trace=trace)
        return h.cell

    def _call_stream(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict) -> StreamIterator[Any]:
        err = self._failed_error(ep)
        payload, bufs = self._pack(ep, args, kwargs)
        rt = _start.runtime()
        kernel = rt.kernel
        region = self._region_
        tm = ep._tm
        if tm is None:
            tm = ep._tm = rt.observer.client_side(ep)
        describe = ep if err is None else ""
        if tm:
            h = tm.stream(kernel, region.nelements, payload, bufs, describe)
            trace = tm.trace_bytes(h.sp)
        else:
            h, trace = StreamReplies(kernel, region.nelements, describe), None
        if err is not None:
            h.fail(err)
            return StreamIterator(h)
        reply = (rt.proc_id, kernel.address, h.port_id)
        h.procs = self._send_many(None, ep._name, reply, region, ep._prop._explicit_response_port, payload, bufs,
                                  h.port_id, kernel, _sender_name(), trace=trace)
        return StreamIterator(h)

    def _cast(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict, port: Any, only: int | None,
              adverb: str = "broadcast") -> None:
        err = self._failed_error(ep)
        if err is not None:
            raise err
        payload, bufs = self._pack(ep, args, kwargs)
        rt = _start.runtime()
        kernel = rt.kernel
        region = self._region_
        reply = port._ref if port is not None else None
        host = _state.current_actor.get()
        ret = None
        if reply is None:
            ret = host.return_ref() if host is not None else rt.agent.return_ref()
        sender = host.display_name if host is not None else "client"
        tm = ep._tm
        if tm is None:
            tm = ep._tm = rt.observer.client_side(ep)
        sp = tm.cast(adverb, region.nelements if only is None else 1, payload, bufs) if tm else None
        self._send_many(None if only is None else (only,), ep._name, reply, region,
                        ep._prop._explicit_response_port, payload, bufs, None, kernel, sender, ret,
                        trace=tm.trace_bytes(sp) if sp is not None else None)
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
        rt = _start.runtime()
        kernel = rt.kernel
        region = self._region_
        h = GatherReplies(kernel, region.extent, "", lambda e, v: None)
        reply = (rt.proc_id, kernel.address, h.port_id)
        if len(self._members) >= _tree.TREE_MIN:
            # Through the tree, like every message to this mesh: the stop reaches
            # each actor after what was cast to it before.
            live = []
            for i in range(region.nelements):
                if self._members[region.root_rank(i)].proc_id in kernel.dead:
                    h.deliver(i, W.S_VALUE, _NONE_PAYLOAD, [])
                else:
                    live.append(i)
            if live:
                payload, bufs = _serial.dumps(reason)
                h.procs = self._send_many(live, _tree.STOP_METHOD, reply, region, False, payload, bufs, h.port_id,
                                          kernel, _sender_name())
            _release(rt, self)
            rt.observer.retire_when_stopped(h.cell, self._key, self._class.__qualname__)
            return Future._of(rt.observer.actor_mesh_stopping(self, reason, _never_fails(h.cell)))
        for i in range(region.nelements):
            slot = self._members[region.root_rank(i)]
            if slot.proc_id in kernel.dead:
                h.deliver(i, W.S_VALUE, _NONE_PAYLOAD, [])
                continue
            header = C.encode(C.StopActor(self._key, reply, reason))
            kernel.send(slot.proc_id, slot.address if slot.ready.is_set() else None, W.K_CONTROL, 0, header, b"", [],
                        h.port_id)
            h.procs.append(slot.proc_id)
        _release(rt, self)
        rt.observer.retire_when_stopped(h.cell, self._key, self._class.__qualname__)
        return Future._of(rt.observer.actor_mesh_stopping(self, reason, _never_fails(h.cell)))

    def __reduce__(self) -> Any:
        members = [self._members[r].ref() for r in self._region_.root_ranks()]
        region = Extent(self._region_.labels, self._region_.sizes).region
        return (_rebuild_actor_mesh, (self._class, self._name, self._key, members, region))

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} of {self._class.__qualname__} {self._region_.extent}>"


def _release(rt: Any, mesh: Any) -> None:
    """A mesh this process owns is stopping: nothing of this process keeps it
    any more -- the agent's (or the owning actor's) list of owned meshes, its
    supervision record, its proc mesh's list of actor meshes."""
    rt.agent.unregister_owned(mesh)
    host = _state.current_actor.get()
    if host is not None:
        try:
            host.owned.remove(mesh)
        except ValueError:
            pass
    if isinstance(mesh, ActorMesh):
        rt.agent.unregister_supervised(mesh._key)
        pm = mesh._proc_mesh
        if pm is not None:
            pm._actor_meshes.pop(mesh._key, None)


#: Attributes an ``ActorMesh`` instance sets in ``__init__`` (they hide an endpoint of the same name too).
_INSTANCE_ATTRIBUTES = frozenset({
    "_class", "_name", "_key", "_health", "_members", "_region_", "_proc_mesh", "_init_cell", "_owner",
    "_stopped", "_endpoints", "_whole_view", "_tree_view_id", "_tree_sent",
})
#: Every name an ``ActorMesh`` answers itself, so that an endpoint of that name
#: would never be reached through the mesh (``Actor.__init_subclass__`` refuses them).
MESH_ATTRIBUTES: frozenset[str] = frozenset(
    n for n in dir(ActorMesh) if not (n.startswith("__") and n.endswith("__"))
) | _INSTANCE_ATTRIBUTES

_NONE_PAYLOAD = _serial.dumps(None)[0]

#: ranks named one by one in a failure text; beyond, a count
_RANKS_SHOWN = 4


def _rank_where(mesh: ActorMesh[Any], index: int) -> str:
    """``rank 1 {'gpus': 1/2} on proc procs0{'gpus': 1/2} on host node7`` for
    rank ``index`` of the view ``mesh``."""
    from monarch_core._proc._port import this_proc_and_host
    from monarch_core._mesh._shape import Point

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


def _describe_call(mesh: ActorMesh[Any], endpoint: str, adverb: str, ranks: list[int] | None,
                   proc_id: str | None, exc: BaseException) -> str | None:
    from monarch_core.errors import ActorError

    if isinstance(exc, ActorError) and exc.endpoint == endpoint and exc.actor:
        return None  # raised by the endpoint itself: its text names the actor, endpoint, proc and host
    region = mesh._region_
    n = region.nelements
    members = mesh._members
    if ranks is None or any(r < 0 or r >= n for r in ranks):
        ranks = [i for i in range(n) if proc_id is None or members[region.root_rank(i)].proc_id == proc_id]
    head = f"{adverb}() of {mesh._name}.{endpoint} (actor mesh {mesh._name!r}, class {mesh._class.__qualname__})"
    if not ranks:
        return f"{head} failed"
    text = f"{head} failed on {_ranks_where(mesh, ranks)}"
    stops = {members[region.root_rank(r)].stopped for r in ranks} - {None}
    if stops:
        text += " (" + "; ".join(sorted(stops)) + ")"
    return text


def _failed_ranks_error(mesh: ActorMesh[Any], endpoint: str, failed: list[tuple[int, dict]]) -> SupervisionError:
    """The fail-fast error of a call to a view with failed ranks: every failed
    rank of the view, then the report of the first (its cascade, first failure first)."""
    from monarch_core._proc._supervision import MeshFailure

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


def _failed_cell(exc: BaseException) -> Cell:
    c = Cell()
    c.set_exception(exc)
    return c


def _never_fails(cell: Cell) -> Cell:
    """A cell that resolves to None when ``cell`` resolves, whatever the outcome
    (stopping something already dead is not an error)."""
    out = Cell()

    def done() -> None:
        out.set_result(None)

    if not cell.add_callback(done):
        done()
    return out


def _rebuild_actor_mesh(cls: type, name: str, key: str, members: list, region: Region) -> ActorMesh[Any]:
    c = Cell()
    c.set_result(True)
    return ActorMesh(cls, name, key, [_slot_from_ref(m) for m in members], region, None, c, False)
