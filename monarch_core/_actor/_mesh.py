"""HostMesh, ProcMesh and ActorMesh: the mesh objects of the public API."""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Generic, TypeVar

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel
    from monarch_core.hookspecs import Allocation, HostHandle


from monarch_core import settings
from monarch_core._actor import _serial, _state, _tree
from monarch_core._launch._bootstrap import (
    BootstrapCommand,
    default_bootstrap_cmd,
    validate_proc_bind,
)
from monarch_core._launch._spawn import ProcStatus, host_proc_id, spawn_local, spawn_remote
from monarch_core._launch._spec import ProcSpec
from monarch_core._actor._endpoint import Endpoint, EndpointProperty, NotAnEndpoint
from monarch_core._actor._future import Cell, Future
from monarch_core._actor._port import GatherReplies, OneReply, StreamIterator, StreamReplies
from monarch_core._kernel import _control as C
from monarch_core._kernel import _wire as W
from monarch_core._kernel._ports import PortHandler
from monarch_core._mesh._shape import Extent, MeshTrait, Point, Region
from monarch_core._mesh._value_mesh import ValueMesh
from monarch_core.errors import SupervisionError

logger = logging.getLogger("monarch.mesh")

T = TypeVar("T")
#: Seconds to wait for a proc to report its address when a reference to it
#: must be serialized before it has started.
START_TIMEOUT: float = settings.get("MONARCH_PROC_START_TIMEOUT")
_names = itertools.count()
_EMPTY_REGION = Extent([], []).region


class _ProcSlot:
    """One proc: its id, its address once known, and whether it said hello."""

    __slots__ = ("proc_id", "address", "ready", "pid", "failed", "host", "host_name", "describe")

    def __init__(self, proc_id: str, address: str | None = None) -> None:
        self.proc_id = proc_id
        self.address = address
        self.describe: str | None = None  # "proc <name>{coords}", for reports
        self.host: str | None = None  # worker-loop address for procs on remote hosts
        self.host_name: str | None = None  # HostHandle.name of the host it runs on
        self.ready = threading.Event()
        if address is not None:
            self.ready.set()
        self.pid: int | None = None
        self.failed: str | None = None

    def ref(self) -> tuple[str, str]:
        """``(proc_id, address)``, waiting for the proc to start if needed."""
        if self.address is None:
            if not self.ready.wait(START_TIMEOUT) or self.address is None:
                raise SupervisionError(
                    f"proc {self.proc_id} never reported its address"
                    + (f" ({self.failed})" if self.failed else f" within {START_TIMEOUT:.0f}s")
                )
        return (self.proc_id, self.address)


def _slot_from_ref(ref: tuple) -> _ProcSlot:
    return _ProcSlot(ref[0], ref[1])


def _sender_name() -> str:
    host = _state.current_actor.get()
    return host.display_name if host is not None else "client"


def _owner_check(mesh: Any, what: str) -> None:
    if not mesh._owner:
        kind = type(mesh).__name__
        raise RuntimeError(
            f"cannot {what} {kind} {mesh._name!r}: this object is a reference (a slice, or received from "
            f"another actor), not the owner. Only the owner can {what} it: call {what}() on the "
            f"{kind} returned by the spawn call."
        )


# ====================================================================== ActorMesh


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
        for r in self._region_.root_ranks():
            report = health.get(r)
            if report is not None:
                from monarch_core._actor._supervision import MeshFailure

                return SupervisionError(
                    f"cannot call {ep._describe()}: actor mesh {self._name!r} has failed ranks; "
                    f"{MeshFailure(None, report).report()}"
                )
        return None

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
              ret: tuple | None = None) -> str:
        slot = self._members[region.root_rank(index)]
        header = W.actor_header(self._key, method, reply, rank_in_msg, region.labels, region.sizes, sender, ret,
                                explicit)
        addr = slot.address if slot.ready.is_set() else None
        if ret is not None:  # fire-and-forget: the return port hears only of undeliverable messages
            kernel.send(slot.proc_id, addr, W.K_ACTOR, W.F_PACKED, header, payload, bufs, ret[2], track=False)
        else:
            kernel.send(slot.proc_id, addr, W.K_ACTOR, W.F_PACKED, header, payload, bufs, reply_port)
        return slot.proc_id

    def _send_many(self, indices: Any, method: str, reply: tuple | None, region: Region, explicit: bool,
                   payload: Any, bufs: list, reply_port: int | None, kernel: Kernel, sender: str,
                   ret: tuple | None = None, gather: Any = None) -> list[str]:
        """Send to the region indices ``indices`` (None: all of them), through
        the cast tree for a mesh of ``_tree.TREE_MIN`` actors or more; the procs
        a reply to ``reply_port`` now waits on.  ``gather``: the port handler
        of a ``call()``, whose replies the tree's forwarders gather into one
        batch per subtree."""
        if len(self._members) < _tree.TREE_MIN:
            idx = range(region.nelements) if indices is None else indices
            return [self._send(i, method, reply, i, region, explicit, payload, bufs, reply_port, kernel, sender, ret)
                    for i in idx]
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
            if ret is not None:
                kernel.send(proc_id, address, W.K_ACTOR, W.F_TREE, header, payload, bufs, ret[2], track=False)
            else:
                kernel.send(proc_id, address, W.K_ACTOR, W.F_TREE, header, payload, bufs, reply_port)
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

    def _call_one(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict, index: int) -> Cell:
        err = self._failed_error(ep)
        if err is not None:
            return _failed_cell(err)
        payload, bufs = self._pack(ep, args, kwargs)
        rt = _state.runtime()
        kernel = rt.kernel
        h = OneReply(kernel, "")
        reply = (rt.proc_id, kernel.address, h.port_id)
        if len(self._members) < _tree.TREE_MIN:
            h.proc_id = self._send(index, ep._name, reply, index, self._region_, ep._prop._explicit_response_port,
                                   payload, bufs, h.port_id, kernel, _sender_name())
        else:
            h.proc_id = tuple(self._send_many((index,), ep._name, reply, self._region_,
                                              ep._prop._explicit_response_port, payload, bufs, h.port_id, kernel,
                                              _sender_name()))
        return h.cell

    def _call_all(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict) -> Cell:
        err = self._failed_error(ep)
        if err is not None:
            return _failed_cell(err)
        payload, bufs = self._pack(ep, args, kwargs)
        rt = _state.runtime()
        kernel = rt.kernel
        region = self._region_
        h = GatherReplies(kernel, region.extent, "", ValueMesh)
        reply = (rt.proc_id, kernel.address, h.port_id)
        h.procs = self._send_many(None, ep._name, reply, region, ep._prop._explicit_response_port, payload, bufs,
                                  h.port_id, kernel, _sender_name(), gather=h)
        return h.cell

    def _call_stream(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict) -> StreamIterator[Any]:
        err = self._failed_error(ep)
        payload, bufs = self._pack(ep, args, kwargs)
        rt = _state.runtime()
        kernel = rt.kernel
        region = self._region_
        h = StreamReplies(kernel, region.nelements, "")
        if err is not None:
            h.fail(err)
            return StreamIterator(h)
        reply = (rt.proc_id, kernel.address, h.port_id)
        h.procs = self._send_many(None, ep._name, reply, region, ep._prop._explicit_response_port, payload, bufs,
                                  h.port_id, kernel, _sender_name())
        return StreamIterator(h)

    def _cast(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict, port: Any, only: int | None) -> None:
        err = self._failed_error(ep)
        if err is not None:
            raise err
        payload, bufs = self._pack(ep, args, kwargs)
        rt = _state.runtime()
        kernel = rt.kernel
        region = self._region_
        reply = port._ref if port is not None else None
        host = _state.current_actor.get()
        ret = None
        if reply is None:
            ret = host.return_ref() if host is not None else rt.agent.return_ref()
        sender = host.display_name if host is not None else "client"
        self._send_many(None if only is None else (only,), ep._name, reply, region,
                        ep._prop._explicit_response_port, payload, bufs, None, kernel, sender, ret)

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
        rt = _state.runtime()
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
            rt.agent.unregister_owned(self)
            rt.agent.unregister_supervised(self._key)
            return Future._of(_never_fails(h.cell))
        for i in range(region.nelements):
            slot = self._members[region.root_rank(i)]
            if slot.proc_id in kernel.dead:
                h.deliver(i, W.S_VALUE, _NONE_PAYLOAD, [])
                continue
            header = C.encode(C.StopActor(self._key, reply, reason))
            kernel.send(slot.proc_id, slot.address if slot.ready.is_set() else None, W.K_CONTROL, 0, header, b"", [],
                        h.port_id)
            h.procs.append(slot.proc_id)
        rt.agent.unregister_owned(self)
        rt.agent.unregister_supervised(self._key)
        return Future._of(_never_fails(h.cell))

    def __reduce__(self) -> Any:
        members = [self._members[r].ref() for r in self._region_.root_ranks()]
        region = Extent(self._region_.labels, self._region_.sizes).region
        return (_rebuild_actor_mesh, (self._class, self._name, self._key, members, region))

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name!r} of {self._class.__qualname__} {self._region_.extent}>"


_NONE_PAYLOAD = _serial.dumps(None)[0]


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


# ====================================================================== ProcMesh


class ProcMesh(MeshTrait):
    """A mesh of processes that can spawn actor meshes."""

    def __init__(
        self,
        name: str,
        slots: list[_ProcSlot],
        region: Region,
        host_mesh: HostMesh | None,
        init_cell: Cell,
        owner: bool,
    ) -> None:
        self._name = name
        self._slots = slots
        self._region_ = region
        self._host_mesh = host_mesh
        self._init_cell = init_cell
        self._owner = owner
        self._stopped: Cell | None = None

    @property
    def _region(self) -> Region:
        return self._region_

    def _with_region(self, region: Region) -> ProcMesh:
        return ProcMesh(self._name, self._slots, region, self._host_mesh, self._init_cell, False)

    @property
    def initialized(self) -> Future[bool]:
        """Resolves to True once every proc has started and run its bootstrap."""
        return Future._of(self._init_cell)

    @property
    def host_mesh(self) -> HostMesh | None:
        return self._host_mesh

    @property
    def name(self) -> str:
        return self._name

    def spawn(self, name: str, Class: type[T], *args: Any, **kwargs: Any) -> T:
        """Spawn an actor mesh of ``Class`` on every proc of this mesh.

        Returns immediately; each actor's ``__init__`` runs before its first
        endpoint call.  ``ValueError`` if ``Class`` is not an ``Actor``
        subclass."""
        from monarch_core._actor._actor import Actor

        if not isinstance(name, str) or not name:
            raise TypeError(f"spawn(name, Class, ...): name must be a non-empty str, got {name!r}")
        if not (isinstance(Class, type) and issubclass(Class, Actor)):
            raise ValueError(
                f"spawn({name!r}, {getattr(Class, '__name__', Class)!r}): the class must subclass "
                "monarch_core.actor.Actor"
            )
        if self._stopped is not None:
            raise RuntimeError(f"proc mesh {self._name!r} has been stopped; spawn procs again")
        try:
            payload, bufs = _serial.dumps((Class, args, kwargs))
        except Exception as e:
            raise TypeError(f"constructor arguments of {Class.__qualname__} could not be pickled: {e}") from e
        rt = _state.runtime()
        kernel = rt.kernel
        region = self._region_
        key = f"{name}-{uuid.uuid4().hex[:10]}"
        gather = GatherReplies(kernel, region.extent, "", lambda e, v: True)
        reply = (rt.proc_id, kernel.address, gather.port_id)
        owner_host = _state.current_actor.get()
        owner = (rt.proc_id, kernel.address, owner_host.key if owner_host is not None else "")
        members = [self._slots[root] for root in region.root_ranks()]
        mesh: ActorMesh[Any] = ActorMesh(
            Class, name, key, members, Extent(region.labels, region.sizes).region, self, gather.cell, True
        )
        from monarch_core._actor._agent import Supervised

        # Register before sending: a failing __init__ reports back at once.
        rt.agent.register_supervised(
            Supervised(key, name, Class.__qualname__, mesh, owner_host, mesh._health, members)
        )
        procs = []
        for i, slot in enumerate(members):
            header = C.encode(C.Spawn(key, name, i, region.labels, region.sizes, reply, Class.__qualname__, owner))
            kernel.send(slot.proc_id, slot.address if slot.ready.is_set() else None, W.K_CONTROL, 0, header,
                        payload, bufs, gather.port_id)
            procs.append(slot.proc_id)
        gather.procs = procs
        rt.agent.register_owned(mesh)
        return mesh  # type: ignore[return-value]

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every proc (and actor) of this mesh and release it.  Only the
        owner may stop it."""
        _owner_check(self, "stop")
        return self._stop_owned(reason)

    def _stop_owned(self, reason: str, grace: float | None = None) -> Future[None]:
        if self._stopped is not None:
            return Future._of(self._stopped)
        from monarch_core._actor._agent import STOP_GRACE

        cell = self._stopped = Cell()
        rt = _state.runtime()
        rt.agent.unregister_owned(self)
        slots = [s for s in self._slots if s.proc_id != rt.proc_id]
        if not slots:
            cell.set_result(None)
            return Future._of(cell)
        rt.kernel.call_soon(
            rt.kernel.start_task, _stop_procs, rt.kernel, slots, reason, cell, STOP_GRACE if grace is None else grace
        )
        return Future._of(cell)

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._owner:
            await self.stop()

    def activate(self) -> Any:
        raise NotImplementedError("ProcMesh.activate() needs the distributed tensor engine, which monarch-core does not provide yet")

    def rank_tensor(self, dim: str) -> Any:
        raise NotImplementedError("ProcMesh.rank_tensor() needs the distributed tensor engine, which monarch-core does not provide yet")

    def rank_tensors(self) -> Any:
        raise NotImplementedError("ProcMesh.rank_tensors() needs the distributed tensor engine, which monarch-core does not provide yet")

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
        return (_rebuild_proc_mesh, (self._name, refs, Extent(self._region_.labels, self._region_.sizes).region))

    def __repr__(self) -> str:
        return f"<ProcMesh {self._name!r} {self._region_.extent}>"


def _rebuild_proc_mesh(name: str, refs: list, region: Region) -> ProcMesh:
    c = Cell()
    c.set_result(True)
    return ProcMesh(name, [_slot_from_ref(r) for r in refs], region, None, c, False)


async def _stop_procs(kernel: Kernel, slots: list[_ProcSlot], reason: str, cell: Cell, grace: float) -> None:
    """Ask procs to stop (they get ``grace`` seconds to run ``__cleanup__``),
    escalate to SIGTERM then SIGKILL (through their worker loop for procs on
    remote hosts), resolve ``cell`` when all are gone."""
    import trio
    header = C.encode(C.StopProc(reason, max(0.5, grace - 0.5)))
    for s in slots:
        kernel.expect_exit(s.proc_id)
        if s.proc_id not in kernel.dead:
            kernel.send(s.proc_id, None, W.K_CONTROL, 0, header, b"", [], None)

    async def all_gone() -> None:
        for s in slots:
            await kernel.wait_dead(s.proc_id)

    with trio.move_on_after(grace):
        await all_gone()
    for sig_name in ("terminate", "kill"):
        alive = [s for s in slots if s.proc_id not in kernel.dead]
        if not alive:
            break
        for s in alive:
            logger.warning("%s did not stop within the grace period; sending %s", s.proc_id, sig_name)
            child = kernel.child(s.proc_id)
            if child is not None:
                getattr(child, sig_name)()
            elif s.host is not None:
                kernel.send(host_proc_id(s.host), s.host, W.K_CONTROL, 0,
                            C.encode(C.HostKill([s.proc_id], sig_name)), b"", [], None)
        with trio.move_on_after(1.0):
            await all_gone()
    cell.set_result(None)


# ====================================================================== HostMesh


class HostMesh(MeshTrait):
    """A mesh of hosts that can spawn proc meshes.

    As an async context manager it shuts the hosts down on exit."""

    def __init__(
        self,
        hosts: list[HostHandle],
        region: Region,
        *,
        owner: bool,
        allocation: Allocation | None = None,
        python_executable: str | None = None,
        name: str = "hosts",
        shared: dict | None = None,
    ) -> None:
        self._hosts = hosts
        self._region_ = region
        self._owner = owner
        self._allocation = allocation
        self._python = python_executable
        self._name = name
        # state shared by views of the same host mesh
        self._shared = shared if shared is not None else {"procs": [], "shutdown": False, "lost": {}}

    @property
    def _region(self) -> Region:
        return self._region_

    def _with_region(self, region: Region) -> HostMesh:
        return HostMesh(self._hosts, region, owner=False, allocation=self._allocation, python_executable=self._python,
                        name=self._name, shared=self._shared)

    @property
    def region(self) -> Region:
        return self._region_

    @property
    def stream_logs(self) -> bool:
        """Worker output goes to the client's stdout/stderr (always true here)."""
        return True

    @property
    def is_fake_in_process(self) -> bool:
        return False

    @property
    def initialized(self) -> Future[bool]:
        return Future._resolved(True)

    @property
    def hosts(self) -> list[HostHandle]:
        """The hosts of this view, in rank order (name, worker address, labels)."""
        return [self._hosts[r] for r in self._region_.root_ranks()]

    def to_table(self) -> str:
        """A text table: rank, coordinates, host name, worker-loop address, labels."""
        rows = [f"{'rank':>4}  {'coords':<28} {'host':<20} {'address':<40} labels"]
        ext = self._region_.extent
        lost = self._shared["lost"]
        for i, root in enumerate(self._region_.root_ranks()):
            h = self._hosts[root]
            labels = " ".join(f"{k}={v}" for k, v in h.labels.items())
            if h.name in lost:
                labels = (labels + " " if labels else "") + f"LOST ({lost[h.name]})"
            rows.append(f"{i:>4}  {str(Point(i, ext)):<28} {h.name:<20} {h.address or '(this process)':<40} {labels}")
        return "\n".join(rows)

    def _host_lost(self, host_name: str, reason: str) -> None:
        """A scheduler reported ``host_name`` lost (any thread): every proc on
        it fails, nothing else does."""
        self._shared["lost"][host_name] = reason
        rt = _state.current_runtime_or_none()
        if rt is not None:
            rt.kernel.call_soon(_procs_of_host_lost, rt.kernel, self._shared, self._hosts, host_name, reason)

    def with_python_executable(self, python_executable: str) -> HostMesh:
        """A view of these hosts that starts procs with ``python_executable``."""
        if not isinstance(python_executable, str) or not python_executable:
            raise TypeError("with_python_executable() needs the path of a Python executable")
        return HostMesh(self._hosts, self._region_, owner=False, allocation=self._allocation,
                        python_executable=python_executable, name=self._name, shared=self._shared)

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
        """
        if self._shared["shutdown"]:
            raise RuntimeError(f"host mesh {self._name!r} has been shut down; allocate hosts again")
        per_host = _check_per_host(per_host, self._region_.labels)
        if bootstrap is not None and not callable(bootstrap):
            raise TypeError(f"bootstrap must be a callable run on each new proc, got {type(bootstrap).__name__}")
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        if bootstrap_command is not None and not (
            isinstance(bootstrap_command, BootstrapCommand) or callable(bootstrap_command)
        ):
            raise TypeError("bootstrap_command must be a BootstrapCommand or a callable Point -> BootstrapCommand")
        nper = math.prod(per_host.values()) if per_host else 1
        binds = validate_proc_bind(proc_bind, nper)
        try:
            boot_payload = _serial.dumps(bootstrap)
        except Exception as e:
            raise TypeError(f"bootstrap callable could not be pickled: {e}") from e
        name = name or f"procs{next(_names)}"
        rt = _state.runtime()
        host_region = self._region_
        labels = host_region.labels + tuple(per_host)
        sizes = host_region.sizes + tuple(per_host.values())
        extent = Extent(labels, sizes)
        host_roots = host_region.root_ranks()

        kernel = rt.kernel
        level = settings.get("MONARCH_LOG_LEVEL") or logging.getLevelName(
            logging.getLogger("monarch").getEffectiveLevel()
        )
        slots: list[_ProcSlot] = []
        per_host_entries: list[tuple[HostHandle, list]] = []
        for hi, hroot in enumerate(host_roots):
            host = self._hosts[hroot]
            entries = []
            for j in range(nper):
                rank = hi * nper + j
                point = Point(rank, extent)
                default = False
                if callable(bootstrap_command) and not isinstance(bootstrap_command, BootstrapCommand):
                    cmd = bootstrap_command(point)
                    if not isinstance(cmd, BootstrapCommand):
                        raise TypeError(f"bootstrap_command({point}) returned {type(cmd).__name__}, not a BootstrapCommand")
                elif bootstrap_command is not None:
                    cmd = bootstrap_command
                else:
                    cmd = default_bootstrap_cmd(self._python or rt.python_executable)
                    default = self._python is None and host.address is not None
                slot = _ProcSlot(f"{name}-{rank}-{uuid.uuid4().hex[:8]}")
                slot.host = host.address
                slot.host_name = host.name
                slot.describe = f"proc {name}{point if len(extent) else ''}"
                if host.address is not None:
                    slot.describe += f" on host {host.name}"
                slots.append(slot)
                entries.append((slot, dict(
                    proc_id=slot.proc_id,
                    name=name,
                    rank=rank,
                    labels=labels,
                    sizes=sizes,
                    describe=slot.describe,
                    command=cmd,
                    default_program=default,
                    bind=binds[j] if binds else None,
                    parent=(rt.proc_id, kernel.address),
                    root=tuple(rt.root),
                    transport=rt.transport,
                    log_level=level,
                )))
            per_host_entries.append((host, entries))
        status = ProcStatus(kernel, slots, lambda r: f"{name}{Point(r, extent)}")
        sref = (rt.proc_id, kernel.address, status.port_id)
        per_host_entries = [
            (host, [(slot, ProcSpec(status=sref, **fields)) for slot, fields in entries])
            for host, entries in per_host_entries
        ]
        pm = ProcMesh(name, slots, extent.region, self, status.cell, True)
        self._shared["procs"].append(pm)
        rt.agent.register_owned(pm)
        lost = self._shared["lost"]
        for host, entries in per_host_entries:
            if host.name in lost:
                kernel.call_soon(_fail_lost, kernel, [slot for slot, _ in entries], host.name, lost[host.name], status)
            elif host.address is None:
                kernel.call_soon(kernel.start_task, spawn_local, rt, entries, status, boot_payload)
            else:
                kernel.call_soon(spawn_remote, rt, host.address, entries, status, boot_payload)
        return pm

    def stop(self) -> Future[None]:
        """Stop every proc spawned on these hosts; keep the hosts for reuse."""
        _owner_check(self, "stop")
        return self._stop_procs()

    def _stop_procs(self, grace: float | None = None) -> Future[None]:
        procs = list(self._shared["procs"])
        self._shared["procs"].clear()
        futs = [p._stop_owned("its host mesh was stopped", grace) for p in procs]
        return _all_done(futs)

    def shutdown(self) -> Future[None]:
        """Stop every proc and give the hosts back; the mesh is unusable after."""
        _owner_check(self, "shut down")
        fut = self._stop_procs()
        self._shared["shutdown"] = True
        alloc = self._allocation
        if alloc is not None:
            alloc.closing = True  # worker loops ending from now on are not lost hosts
        remote = [h.address for h in self._hosts if h.address is not None]
        if alloc is None and not remote:
            return fut
        rt = _state.runtime()
        out = Cell()

        async def release() -> None:
            kernel = rt.kernel
            for a in remote:  # worker loops exit (and kill anything left)
                kernel.send(host_proc_id(a), a, W.K_CONTROL, 0, C.encode(C.HostShutdown()), b"", [], None)
            await kernel.flush(2.0)
            if alloc is not None:  # off the loop: a scheduler's release may block
                import trio

                await trio.to_thread.run_sync(alloc.release, abandon_on_cancel=True)
            out.set_result(None)

        def after() -> None:
            rt.kernel.call_soon(rt.kernel.start_task, release)

        c = fut._ensure()
        if not c.add_callback(after):
            after()
        return Future._of(out)

    async def sync_workspace(self, workspace: Any, conda: bool = False, auto_reload: bool = False) -> None:
        raise NotImplementedError("sync_workspace is not supported by monarch-core; install your code on every host")

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._owner and not self._shared["shutdown"]:
            await self.shutdown()

    def __reduce__(self) -> Any:
        return (_rebuild_host_mesh, (self._hosts, self._region_, self._python, self._name))

    def __repr__(self) -> str:
        return f"<HostMesh {self._name!r} {self._region_.extent}>"


def _rebuild_host_mesh(hosts: list, region: Region, python: str | None, name: str) -> HostMesh:
    return HostMesh(hosts, region, owner=False, python_executable=python, name=name)


def _all_done(futs: list[Future[Any]]) -> Future[None]:
    out = Cell()
    if not futs:
        out.set_result(None)
        return Future._of(out)
    remaining = [len(futs)]
    lock = threading.Lock()

    def one() -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            out.set_result(None)

    for f in futs:
        if not f._ensure().add_callback(one):
            one()
    return Future._of(out)


def _fail_lost(kernel: Kernel, slots: list, host_name: str, reason: str, status: ProcStatus) -> None:
    """Procs asked for on a host already lost fail at once (kernel loop)."""
    for slot in slots:
        msg = f"{slot.describe} could not start: its host {host_name} was lost ({reason})"
        slot.failed = msg
        kernel.proc_failed(slot.proc_id, msg)
        status.fail(SupervisionError(msg), slot.proc_id)


def _procs_of_host_lost(kernel: Kernel, shared: dict, hosts: list, host_name: str, reason: str) -> None:
    """Fail every proc of the host meshes sharing ``shared`` that runs on
    ``host_name``, and the session to its worker loop (kernel loop)."""
    for pm in list(shared["procs"]):
        for slot in pm._slots:
            if slot.host_name == host_name and slot.proc_id not in kernel.dead:
                kernel.proc_failed(slot.proc_id, f"{slot.describe}: its host {host_name} was lost: {reason}")
    for h in hosts:
        if h.name == host_name and h.address is not None:
            kernel.proc_failed(host_proc_id(h.address), f"host {host_name} was lost: {reason}")


def _check_per_host(per_host: Any, host_labels: tuple) -> dict[str, int]:
    if per_host is None:
        return {}
    if not isinstance(per_host, dict):
        raise TypeError(f"per_host must be a dict like {{'gpus': 4}}, got {type(per_host).__name__}")
    out = {}
    for k, v in per_host.items():
        if not isinstance(k, str) or not k:
            raise TypeError(f"per_host keys must be dimension names (str), got {k!r}")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"per_host[{k!r}] must be an int >= 1, got {v!r}")
        if k in host_labels:
            raise ValueError(f"per_host dimension {k!r} clashes with a host mesh dimension {list(host_labels)}")
        out[k] = v
    return out


# ====================================================================== entry points


def this_proc() -> ProcMesh:
    """The proc this code runs in (the client's own process on the client)."""
    rt = _state.runtime()
    pm = rt.caches.get("this_proc")
    if pm is None:
        c = Cell()
        c.set_result(True)
        pm = ProcMesh(rt.proc_mesh_name, [_ProcSlot(rt.proc_id, rt.kernel.address)], _EMPTY_REGION, None, c, False)
        rt.caches["this_proc"] = pm
    return pm


#: What the fork server imports above the proc runtime (see ``_zygote.warm_modules``).
_FORK_SERVER_WARM = ("monarch_core.actor", "monarch_core._actor._endpoint")


def this_host() -> HostMesh:
    """The machine this code runs on, as a one-host ``HostMesh`` (no
    dimensions).  Procs spawned from it are started by this process: forked
    from its fork server (``_zygote``), or exec'd as its children, and they
    die with it."""
    from monarch_core._launch import _zygote

    # The fork server's imports overlap with the runtime's start and the
    # caller's work before its first spawn.
    _zygote.warm_modules = _FORK_SERVER_WARM
    _zygote.start_early()
    try:
        rt = _state.runtime()
    except BaseException:
        _zygote.discard_early()
        raise
    _zygote.prestart(rt.kernel)
    from monarch_core.hookspecs import HostHandle

    return HostMesh([HostHandle("localhost")], _EMPTY_REGION, owner=True, name="this_host")


def hosts_from_config(name: str, *, timeout: float | None = None) -> HostMesh:
    """The host mesh ``name`` from the project's configuration.

    Looks up ``[hosts.<name>]`` in ``monarch.toml`` (or ``[tool.monarch.hosts.<name>]``
    in ``pyproject.toml``; ``MONARCH_CONFIG`` overrides the path), resolves its
    ``scheduler`` through the installed plugins, allocates the hosts (off the
    kernel loop) and waits until every worker loop answers, all within
    ``timeout`` seconds (default ``MONARCH_ALLOCATE_TIMEOUT`` or 300).
    See ``docs/configuration.md``.  Errors name the file and list what is
    configured and installed; ``AllocationError`` when the scheduler fails or
    a host does not answer (naming it).
    """
    from monarch_core._config import lookup_host_mesh
    from monarch_core._launch import _alloc
    from monarch_core._plugins import registry
    from monarch_core.hookspecs import AllocationRequest

    if not isinstance(name, str) or not name:
        raise TypeError(f"hosts_from_config(name): name must be a non-empty str, got {name!r}")
    reg = registry()
    cfg = lookup_host_mesh(name, installed_schedulers=sorted(reg.scheduler_specs()))
    scheduler = reg.scheduler(cfg.scheduler)
    params = _scheduler_params(scheduler, cfg)
    request = AllocationRequest(name=name, params=params, source=cfg.source)
    scheduler.validate(request)
    _check_params(scheduler, request)
    rt = _state.runtime()
    record = _alloc.allocate(scheduler, request, rt, timeout)
    return host_mesh_of(record, name)


def host_mesh_of(record: Any, name: str) -> HostMesh:
    """The owning ``HostMesh`` over an allocation (``_launch._alloc.allocate``)."""
    region = Extent(list(record.labels), list(record.sizes)).region
    hm = HostMesh(list(record.hosts), region, owner=True, allocation=record, name=name)
    record.on_lost = hm._host_lost
    for host_name, reason in list(record.lost.items()):  # reported while allocating
        hm._host_lost(host_name, reason)
    _state.runtime().agent.register_owned(_HostMeshOwnership(hm))
    return hm


def _scheduler_params(scheduler: Any, cfg: Any) -> dict[str, Any]:
    """The ``[defaults]`` policy: a scheduler that declares ``params`` does not
    get ``[defaults]`` keys outside them (logged at DEBUG); the entry's own
    keys all reach it (its ``validate`` names the unknown ones, or
    :func:`_check_params` does)."""
    accepted = getattr(scheduler, "params", None)
    params = dict(cfg.params)
    if accepted is None:
        return params
    from_defaults = getattr(cfg, "defaults_keys", frozenset())
    dropped = sorted(k for k in params if k not in accepted and k in from_defaults)
    if dropped:
        logger.debug("%s: [defaults] key(s) %s are not parameters of scheduler %r; not passed to it",
                     cfg.source, dropped, cfg.scheduler)
    return {k: v for k, v in params.items() if k not in dropped}


def _check_params(scheduler: Any, request: Any) -> None:
    from monarch_core.errors import ConfigError

    accepted = getattr(scheduler, "params", None)
    unknown = sorted(k for k in request.params if accepted is not None and k not in accepted)
    if unknown:
        raise ConfigError(
            f"{request.source}: unknown parameter(s) {unknown} for scheduler {scheduler.name!r}; "
            f"it accepts {sorted(accepted)}"
        )


class _HostMeshOwnership:
    """Lets the agent shut a configured host mesh down at exit."""

    def __init__(self, hm: HostMesh) -> None:
        self.hm = hm

    def _stop_owned(self, reason: str, grace: float | None = None) -> Future[None]:
        if self.hm._shared["shutdown"]:
            return Future._resolved(None)
        if self.hm._allocation is None:  # attached worker loops outlive their clients
            return self.hm._stop_procs(grace)
        return self.hm.shutdown()


# ====================================================================== controllers


def get_or_spawn_controller(name: str, Class: type[T], *args: Any, **kwargs: Any) -> Future[T]:
    """The singleton actor ``name`` for the whole program, spawned (on the
    root client's process) from ``Class(*args, **kwargs)`` the first time.
    Works from the client and from inside actors."""
    from monarch_core._actor._actor import Actor

    if not isinstance(name, str) or not name:
        raise TypeError(f"get_or_spawn_controller(name, ...): name must be a non-empty str, got {name!r}")
    if not (isinstance(Class, type) and issubclass(Class, Actor)):
        raise ValueError(
            f"get_or_spawn_controller({name!r}, {getattr(Class, '__name__', Class)!r}): the class must subclass Actor"
        )
    payload, bufs = _serial.dumps((Class, args, kwargs))
    rt = _state.runtime()
    kernel = rt.kernel
    h = OneReply(kernel, "")
    reply = (rt.proc_id, kernel.address, h.port_id)
    header = C.encode(C.Controller(name, reply))
    root_id, root_addr = rt.root
    h.proc_id = root_id
    kernel.send(root_id, root_addr, W.K_CONTROL, 0, header, payload, bufs, h.port_id)

    def build(ref: Any) -> Any:
        key, proc_id, address = ref
        c = Cell()
        c.set_result(True)
        return ActorMesh(Class, name, key, [_ProcSlot(proc_id, address)], _EMPTY_REGION, None, c, False)

    from monarch_core._actor._endpoint import _map_future

    return _map_future(Future._of(h.cell), build)


def spawn_local_controller(agent: Any, name: str, payload: Any, buffers: list) -> None:
    """On the root proc (kernel loop): spawn controller ``name`` here."""
    kernel = agent.kernel
    key = f"controller-{name}-{uuid.uuid4().hex[:8]}"

    class _Init(PortHandler):
        def deliver(self, rank: int, status: int, p: Any, b: list) -> None:
            kernel.remove_port(port_id)
            err = None
            if status != W.S_VALUE:
                try:
                    err = _serial.loads(p, b)
                except Exception as e:  # noqa: BLE001
                    err = e
            agent.controller_ready(name, (key, kernel.proc_id, kernel.address), err)

        def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
            agent.controller_ready(name, None, exc)

    port_id = kernel.add_port(_Init())
    owner = (kernel.proc_id, kernel.address, "")
    spawn = C.Spawn(key, name, 0, (), (), (kernel.proc_id, kernel.address, port_id), "controller", owner)
    from monarch_core._actor._agent import Supervised

    agent.register_supervised(
        Supervised(key, name, "controller", None, None, {}, [_ProcSlot(kernel.proc_id, kernel.address)])
    )
    agent._on_spawn(spawn, payload, buffers, kernel.proc_id)


# ====================================================================== worker loops

ATTACH_TIMEOUT: float = settings.get("MONARCH_ATTACH_TIMEOUT")


def _live_session(kernel: Kernel, proc_id: str) -> Any:
    """The kernel's outbound session to ``proc_id`` if one runs (loop thread)."""
    out = kernel._outbound.get(proc_id)
    return out if out is not None and out.failed is None else None


def _close_sessions(kernel: Kernel, proc_ids: set[str], why: str) -> None:
    """End the outbound sessions to ``proc_ids``: no more connection attempts,
    and whatever they still carry fails with ``ConnectError(why)``."""
    from monarch_core.errors import ConnectError

    async def close() -> None:
        for pid in proc_ids:
            out = _live_session(kernel, pid)
            if out is not None:
                out.fail(ConnectError(why))

    if proc_ids:
        try:
            kernel.run(close)
        except RuntimeError:  # the kernel is gone, and its sessions with it
            pass


def attach(
    workers: Any, *, ca: str | None, private_key: str | None, cert: str | None, timeout: float | None
) -> HostMesh:
    """See :func:`monarch_core.worker.attach_to_workers`."""
    from monarch_core._actor import _transport
    from monarch_core.errors import ConnectError

    if isinstance(workers, str) or not workers:
        raise TypeError(
            "attach_to_workers(workers=[...]) takes a non-empty list of worker addresses such as "
            "['tls://h1:29500', 'tls://h2:29500']"
        )
    addrs = list(workers)
    schemes = set()
    for a in addrs:
        if not isinstance(a, str) or "://" not in a:
            raise ValueError(f"attach_to_workers: {a!r} is not a worker address such as 'tls://h1:29500'")
        schemes.add(a.split("://", 1)[0])
    if len(schemes) != 1:
        raise ValueError(f"attach_to_workers: all workers must use one transport, got {sorted(schemes)}")
    scheme = schemes.pop()
    from monarch_core._plugins import registry

    transport = registry().transport(scheme)
    if (ca, private_key, cert) != (None, None, None):
        transport.set_credentials(ca=ca, cert=cert, key=private_key)
    for a in addrs:
        transport.normalize(a)
    if _state.current_runtime_or_none() is None and _transport.enabled_choice() is None:
        _transport.enable_transport(scheme)
    rt = _state.runtime()
    if rt.transport != transport.name:
        raise RuntimeError(
            f"attach_to_workers: the workers speak {transport.name!r} but this process enabled {rt.transport!r}; "
            f"call enable_transport('{transport.name}://<this host's address>:0') first"
        )
    kernel = rt.kernel
    limit = ATTACH_TIMEOUT if timeout is None else float(timeout)
    waits = []
    for a in addrs:
        h = OneReply(kernel, "")
        h.proc_id = host_proc_id(a)
        waits.append((a, h.proc_id, h))

    async def say_hello() -> set[str]:
        # on the loop, so that the sessions the hellos open are known exactly
        opened = {hid for _a, hid, _h in waits if _live_session(kernel, hid) is None}
        for a, hid, h in waits:
            kernel.send(hid, a, W.K_CONTROL, 0,
                        C.encode(C.HostHello((rt.proc_id, kernel.address, h.port_id))), b"", [], h.port_id)
        return opened

    opened = kernel.run(say_hello)
    deadline = time.monotonic() + limit
    hosts = []
    try:
        for a, hid, h in waits:
            if not h.cell.wait(max(0.0, deadline - time.monotonic())):
                last = kernel.last_error(hid)
                raise ConnectError(
                    f"worker {a} did not answer within {limit:.0f}s"
                    + (f" (last error: {last})" if last is not None else "")
                    + ". Is `python -m monarch_core.worker --address "
                    + a
                    + "` running there, and reachable from this host? (MONARCH_ATTACH_TIMEOUT sets the wait)"
                )
            try:
                info = h.cell.result()
            except Exception as e:
                raise ConnectError(f"worker {a} could not be reached: {e}") from None
            from monarch_core.hookspecs import HostHandle

            hosts.append(HostHandle(name=str(info.get("hostname", a)), address=a))
    except BaseException as e:
        # Nothing of a failed attach may live on: a session to a worker that
        # rejects this client (or is not there) would keep reconnecting.
        _close_sessions(kernel, opened, f"attach_to_workers gave up: {e}")
        raise
    region = Extent(["hosts"], [len(hosts)]).region
    hm = HostMesh(hosts, region, owner=True, name="workers")
    rt.agent.register_owned(_HostMeshOwnership(hm))
    return hm


def _client_agent(kernel: Kernel) -> Any:
    from monarch_core._actor._agent import ProcAgent  # lazily: it imports the kernel (trio)

    return ProcAgent(kernel)


# The proc runtime calls up into this layer through these (it never imports it).
_state.upper.client_agent = _client_agent
_state.upper.this_proc = this_proc
_state.upper.spawn_local_controller = spawn_local_controller
