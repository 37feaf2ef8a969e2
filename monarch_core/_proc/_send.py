"""The send path: how the mesh API's messages become frames (the API builds none).

The mesh API describes an endpoint message (:class:`Call`) and whom it goes
to (:class:`Recipients`, an actor mesh view); these functions encode the
routing headers and hand the frames to the kernel:

* :meth:`Recipients.send_one` -- one call to one member (``call_one``, ``choose``);
* :meth:`Recipients.cast` -- one message to many members, one frame each, or
  through the cast tree for a mesh of ``_tree.TREE_MIN`` members or more;
* :meth:`Recipients.stop` -- the owner's stop of every member;
* :func:`control` -- a control message (``_control``) to a proc's agent.

A port message (a reply, a channel's message) goes out through
``_port.send_raw_to_port``, the one way to send one.

Any thread, as ``Kernel.send``: FIFO per calling thread and destination, and
the calling thread waits for room when a destination's send window is full.
A traced call's context travels as the packed actor header's extension (or
in the cast tree's header), which the kernel forwards without reading.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from monarch_core._kernel import _wire as W
from monarch_core._proc import _control as C
from monarch_core._proc import _serial, _tree

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel
    from monarch_core._mesh._shape import Region

_NONE_PAYLOAD = _serial.dumps(None)[0]


class Call:
    """One endpoint message, as every member it goes to receives it.

    ``method``: the endpoint's name; ``payload``, ``bufs``: the pickled
    arguments; ``reply``: the port ``(proc_id, address, port_id)`` its
    replies go to (None: none); ``reply_port``: the local port that waits
    for them (it fails when a proc it waits on dies or the message cannot be
    delivered; None: nothing waits); ``ret``: the return port of a message
    without replies (it hears only of an undeliverable message); ``explicit``:
    the endpoint takes its response port as an argument; ``sender``: who
    sends, in words (an actor's name, ``"client"``); ``trace``: the trace
    context of a traced call, or None."""

    __slots__ = ("method", "payload", "bufs", "reply", "reply_port", "ret", "explicit", "sender", "trace")

    def __init__(self, method: str, payload: Any, bufs: list, reply: tuple | None, reply_port: int | None,
                 ret: tuple | None, explicit: bool, sender: str, trace: bytes | None) -> None:
        self.method = method
        self.payload = payload
        self.bufs = bufs
        self.reply = reply
        self.reply_port = reply_port
        self.ret = ret
        self.explicit = explicit
        self.sender = sender
        self.trace = trace


class Recipients:
    """An actor mesh view as its senders reach it: the actors' ``key``, the
    mesh's ``members`` (``ProcSlot`` s, by root rank) and the view's
    ``region`` over them; and what the cast tree keeps of the view between
    casts.  Indices are the view's ranks."""

    __slots__ = ("key", "members", "region", "_whole", "_view", "_tree_sent", "_headers", "_roots", "_rank_procs")

    def __init__(self, key: str, members: list, region: Region) -> None:
        self.key = key
        self.members = members
        self.region = region
        self._whole: bool | None = None
        self._view: str | None = None
        self._tree_sent: tuple | None = None  # (kernel, deaths known) when the member table last went out
        self._headers: dict = {}  # the marshal parts of the actor headers sent to them (``W.actor_header``)
        self._roots: list[int] | None = None  # the view's rank -> member index (below TREE_MIN: at most that many)
        self._rank_procs: list[str] | None = None  # the view's rank -> its proc id (``rank_procs``)

    def send_one(self, kernel: Kernel, index: int, call: Call) -> str | tuple[str, ...]:
        """Send ``call`` to rank ``index``; the proc its reply comes from
        (through the cast tree: every proc on the way, a tuple)."""
        members = self.members
        if len(members) >= _tree.TREE_MIN:
            return tuple(self.cast(kernel, (index,), call))
        region = self.region
        roots = self._roots
        if roots is None:
            roots = self._roots = region.root_ranks()
        slot = members[roots[index]]
        ret = call.ret
        header = W.actor_header(self.key, call.method, call.reply, index, region.labels, region.sizes, call.sender,
                                ret, call.explicit, call.trace, self._headers)
        addr = slot.address if slot.ready.is_set() else None
        if ret is not None:  # fire-and-forget: the return port hears only of undeliverable messages
            kernel.send(slot.proc_id, addr, W.K_ACTOR, W.F_PACKED, header, call.payload, call.bufs, ret[2],
                        track=False)
        else:
            kernel.send(slot.proc_id, addr, W.K_ACTOR, W.F_PACKED, header, call.payload, call.bufs, call.reply_port)
        return slot.proc_id

    def rank_procs(self) -> list[str] | None:
        """The proc of each rank of the view when a cast to all of it goes
        straight to the members (a mesh below ``_tree.TREE_MIN``); None when
        it goes through the cast tree, whose forwarders carry other ranks'
        replies."""
        members = self.members
        if len(members) >= _tree.TREE_MIN:
            return None
        procs = self._rank_procs
        if procs is None:
            roots = self._roots
            if roots is None:
                roots = self._roots = self.region.root_ranks()
            procs = self._rank_procs = [members[roots[i]].proc_id for i in range(self.region.nelements)]
        return procs

    def cast(self, kernel: Kernel, indices: Sequence[int] | None, call: Call, gather: Any = None) -> list[str]:
        """Send ``call`` to the ranks ``indices`` (None: all of them), through
        the cast tree for a mesh of ``_tree.TREE_MIN`` members or more; the
        procs a reply to ``call.reply_port`` now waits on.  ``gather``: the
        port handler of a ``call()``, whose replies the tree's forwarders
        gather into one batch per subtree (it hears of members known dead at once).

        Through the tree: the targets (:meth:`_tree_targets`), the plan
        (``_tree.plan``), then one message per hop (:meth:`_send_hop`)."""
        region = self.region
        members = self.members
        n = len(members)
        if n < _tree.TREE_MIN:
            send = self.send_one  # (below TREE_MIN: one frame each, the proc's id back)
            # (below TREE_MIN ``send_one`` sends directly and returns a proc id, never a tuple)
            return [send(kernel, i, call)  # type: ignore[misc]
                    for i in (range(region.nelements) if indices is None else indices)]
        fanout = _tree.FANOUT
        targets = self._tree_targets(indices)
        dead_procs = kernel.dead

        def dead(m: int) -> bool:
            return members[m].proc_id in dead_procs

        _here, _rank, groups = _tree.plan(-1, n, fanout, targets, dead)
        # A cast to every member carries the member table only the first time (and after
        # a death): the forwarders keep it, so the next ones cost this process fanout
        # small messages whatever the size of the mesh.
        carry = targets is not None or self._tree_sent != (kernel, len(dead_procs))
        if gather is not None:
            for m in _tree.skipped_dead(-1, n, fanout, targets, dead):
                gather.deliver(m, W.S_ERROR, *_serial.dumps(kernel._dead_error(members[m].proc_id)))
        msg = (self.key, call.method, call.reply, region.labels, region.sizes, call.sender, call.ret,
               bool(call.explicit), call.trace)
        view = self._view_id()
        procs: list[str] = []
        for hop, sub in groups.items():
            self._send_hop(kernel, call, msg, hop, sub, carry, view, gather is not None, dead, procs)
        if targets is None:
            self._tree_sent = (kernel, len(dead_procs))
        return procs

    def _tree_targets(self, indices: Sequence[int] | None) -> list[tuple[int, int]] | None:
        """The cast tree's targets for the view's ranks ``indices`` (None:
        all): ``[(member, rank), ...]``, or None for every member of a whole
        view (each forwarder then works out its children)."""
        region = self.region
        if indices is None and self._whole_view():
            return None
        return [(region.root_rank(i), i) for i in (range(region.nelements) if indices is None else indices)]

    def _send_hop(self, kernel: Kernel, call: Call, msg: tuple, hop: int, sub: list | None, carry: bool, view: str,
                  gather: bool, dead: Callable[[int], bool], procs: list[str]) -> None:
        """Send ``call`` (its header part ``msg``) to member ``hop`` of the tree
        for its targets ``sub``, with the addresses every forwarder below it
        needs when the message must ``carry`` the member table (waits for
        procs still starting; a member known to be ``dead`` goes without one,
        so that forwarders route around it too).  A call with replies also
        waits on every proc on the way: their ids are added to ``procs``."""
        members = self.members
        n = len(members)
        fanout = _tree.FANOUT
        reply_port, ret = call.reply_port, call.ret
        nodes = _tree.touched(hop, sub, n, fanout) if carry or reply_port is not None else (hop,)
        table = {}
        for m in nodes:
            table[m] = (members[m].proc_id, _tree.DEAD) if dead(m) else members[m].ref()
        header = _tree.encode(msg, n, fanout, hop, sub, table if carry else None, view, gather)
        proc_id, address = table[hop]
        if ret is not None:
            kernel.send(proc_id, address, W.K_ACTOR, W.F_TREE, header, call.payload, call.bufs, ret[2], track=False)
        else:
            kernel.send(proc_id, address, W.K_ACTOR, W.F_TREE, header, call.payload, call.bufs, reply_port)
        if reply_port is not None:
            # The loss of any proc on the way fails the call at once (this process hears of a
            # death first when it spawned the proc; a forwarder only sees a broken connection).
            for m in nodes:
                p, a = table[m]
                if a != _tree.DEAD:
                    kernel.expect_reply(p, reply_port)
                    procs.append(p)

    def stop(self, kernel: Kernel, reason: str, sender: str, replies: Any) -> list[str]:
        """Stop every actor of the view (``reason``: why); ``replies`` (a
        port handler expecting one reply per rank) hears ``None`` from each
        when it has stopped, at once for one on a proc known dead.  Through
        the cast tree, like every message to a large mesh (the stop reaches
        each actor after what was cast to it before); else a ``StopActor``
        control message each.  The procs the replies now wait on."""
        region = self.region
        reply = (kernel.proc_id, kernel.address, replies.port_id)
        live = []
        for i in range(region.nelements):
            if self.members[region.root_rank(i)].proc_id in kernel.dead:
                replies.deliver(i, W.S_VALUE, _NONE_PAYLOAD, [])
            else:
                live.append(i)
        if len(self.members) >= _tree.TREE_MIN:
            if not live:
                return []
            payload, bufs = _serial.dumps(reason)
            call = Call(_tree.STOP_METHOD, payload, bufs, reply, replies.port_id, None, False, sender, None)
            return self.cast(kernel, live, call)
        procs = []
        for i in live:
            slot = self.members[region.root_rank(i)]
            control(kernel, slot.proc_id, slot.address if slot.ready.is_set() else None,
                    C.StopActor(self.key, reply, reason), reply_port=replies.port_id)
            procs.append(slot.proc_id)
        return procs

    def _view_id(self) -> str:
        """An id of the mesh's member list (forwarders key the member tables they keep by it)."""
        v = self._view
        if v is None:
            ids = "\0".join(slot.proc_id for slot in self.members).encode()
            v = self._view = hashlib.blake2b(ids, digest_size=12).hexdigest()
        return v

    def _whole_view(self) -> bool:
        """The view is the whole mesh, rank i being member i."""
        w = self._whole
        if w is None:
            region = self.region
            n = len(self.members)
            w = self._whole = region.nelements == n and all(region.root_rank(i) == i for i in range(n))
        return w


def control(kernel: Kernel, proc_id: str, address: str | None, msg: Any, payload: Any = b"", bufs: list | None = None,
            reply_port: int | None = None) -> None:
    """Send the control message ``msg`` (a ``_control`` type) to the agent
    of proc ``proc_id`` (at ``address``, None: where the kernel learns it is),
    with ``payload`` and ``bufs``; ``reply_port``: a local port that waits on
    that proc (failed if it dies first or the message is undeliverable).
    Control messages never wait for room in a send window."""
    kernel.send(proc_id, address, W.K_CONTROL, 0, C.encode(msg), payload, bufs or [], reply_port)
