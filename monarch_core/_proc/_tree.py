"""Cast trees: how a message reaches the members of a large actor mesh.

A sender does not write to every member of a mesh of ``TREE_MIN`` or more
actors.  The members (indices ``0..n-1`` of the sender's view of the mesh)
form a fixed ``FANOUT``-ary tree in heap order: the sender writes to the
roots ``0..fanout-1``; member ``r`` forwards to ``fanout*(r+1) .. fanout*(r+1)+fanout-1``.
A cast to the whole mesh is therefore ``fanout`` messages from the sender,
and at most ``fanout`` from any member, whatever the mesh's size.

*Every* endpoint message from a sender to such a mesh, a ``call_one`` to a
single member included, travels the member's fixed path from its root.  The
order of messages from one sender to one actor is what the transport gives
one connection, hop by hop, so it holds through the tree with no sequence
numbers: two messages to the same actor never take different routes.  The
price is a hop per tree level for point-to-point calls into large meshes.

The forwarding is done by the proc that hosts a member, on the thread that
read the message (no actor code, no extra wake-up); the message carries the
(proc, address) of every member it still has to reach below that point, so
a member needs no table of its own.  A member known to be dead is skipped:
its children are reached from its parent.  The sender waits for a reply from
every proc a message touches, so the loss of a forwarder fails the call that
went through it (as the loss of a member fails a flat call).

The replies of a ``call()`` are gathered on the way back: each forwarder
collects those of its subtree (:class:`SubtreeGather`) and sends them up as
one batch, so the sender receives at most ``fanout`` messages too.  Other
replies (``call_one``, ``stream``, ports) come straight back.
"""

from __future__ import annotations

import logging
import marshal
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from monarch_core import settings
from monarch_core._kernel import _wire as W
from monarch_core._proc import _portmsg, _serial
from monarch_core._proc._portmsg import decode_batch, encode_batch
from monarch_core.errors import ProtocolError, SupervisionError

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.actor")

#: Children per node of a cast tree (``MONARCH_CAST_FANOUT``).
FANOUT: int = settings.get("MONARCH_CAST_FANOUT")
#: Meshes of at least this many actors are reached through the tree
#: (``MONARCH_CAST_TREE_MIN``); smaller ones get one message per member.
TREE_MIN: int = settings.get("MONARCH_CAST_TREE_MIN")

_ALL = None  # "every member of the subtree", in place of an explicit target list
#: The address a message's table gives a member its sender knows to be dead.
DEAD = ""
#: The "endpoint" of a stop sent through the tree (its payload: the reason).
STOP_METHOD = "__monarch_stop__"


# ---------------------------------------------------------------- the layout
def children(r: int, n: int, fanout: int) -> range:
    """Members that member ``r`` forwards to (``-1``: the sender)."""
    start = fanout * (r + 1)
    return range(min(start, n), min(start + fanout, n))


def path(x: int, fanout: int) -> list[int]:
    """Members a message to ``x`` passes through, root first, ``x`` last."""
    chain = [x]
    while x >= fanout:
        x = x // fanout - 1
        chain.append(x)
    chain.reverse()
    return chain


def subtree(r: int, n: int, fanout: int) -> list[int]:
    """``r`` and every member below it, in index order."""
    out: list[int] = []
    level = range(r, r + 1)
    while level:
        out.extend(level)
        lo, hi = fanout * (level.start + 1), fanout * (level.stop - 1 + 1) + fanout
        level = range(min(lo, n), min(hi, n))
    return out


def split(members: Sequence[Any], fanout: int) -> list[tuple[Any, list[Any]]]:
    """One level of a cast to ``members`` (a whole subtree in index order, as
    :func:`subtree` lists it below its top): ``(head, rest)`` pairs, at most
    ``fanout``; the sender writes to each head, which forwards to ``rest``
    the same way.  (``bench/scaling.py`` models the tree with this.)"""
    n = len(members)
    out = []
    for head in range(min(fanout, n)):
        below = subtree(head, n, fanout)[1:]
        out.append((members[head], [members[i] for i in below]))
    return out


def next_hop(x: int, at: int, fanout: int, dead: Callable[[int], bool]) -> int:
    """Where a message at ``at`` (``-1``: the sender) goes next on its way to
    ``x``: the first member on ``x``'s path below ``at`` that is not known to
    be dead (``x`` itself at the latest)."""
    chain = path(x, fanout)
    i = 0 if at < 0 else chain.index(at) + 1
    while i < len(chain) - 1 and dead(chain[i]):
        i += 1
    return chain[i]


def _below(r: int, n: int, fanout: int, dead: Callable[[int], bool]) -> tuple[list[int], list[int]]:
    """The first members not known to be dead below ``r`` (``-1``: the
    sender), looking through dead ones to their children; and those dead ones."""
    live: list[int] = []
    passed: list[int] = []
    stack = list(reversed(children(r, n, fanout) if r >= 0 else range(min(fanout, n))))
    while stack:
        c = stack.pop()
        if dead(c):
            passed.append(c)
            stack.extend(reversed(children(c, n, fanout)))
        else:
            live.append(c)
    return live, passed


def live_children(r: int, n: int, fanout: int, dead: Callable[[int], bool]) -> list[int]:
    """The first members not known to be dead below ``r`` (``-1``: the
    sender), looking through dead ones to their children."""
    return _below(r, n, fanout, dead)[0]


def skipped_dead(at: int, n: int, fanout: int, targets: list | None, dead: Callable[[int], bool]) -> list[int]:
    """Members of ``at``'s whole subtree (``targets`` None) that are known
    dead and that this node routes around: nobody else answers for them."""
    return _below(at, n, fanout, dead)[1] if targets is _ALL else []


# ---------------------------------------------------------------- planning (the sender, and every forwarder)
def plan(
    at: int,
    n: int,
    fanout: int,
    targets: list | None,
    dead: Callable[[int], bool],
) -> tuple[bool, int | None, dict[int, list | None]]:
    """What a message at ``at`` does: ``(deliver_here, rank_in_msg, {hop: targets})``.
    ``targets``: ``[(member, rank_in_msg), ...]`` below (or at) ``at``, or
    None for ``at``'s whole subtree (rank in message = member index)."""
    if targets is _ALL:
        here = at >= 0
        return here, (at if here else None), {c: _ALL for c in live_children(at, n, fanout, dead)}
    here = False
    rank_here = None
    groups: dict[int, list | None] = {}
    for member, rank_in_msg in targets:
        if member == at:
            here, rank_here = True, rank_in_msg
            continue
        hop = next_hop(member, at, fanout, dead)
        g = groups.get(hop)
        if g is None:
            groups[hop] = [(member, rank_in_msg)]
        else:
            g.append((member, rank_in_msg))  # type: ignore[union-attr]
    return here, rank_here, groups


def touched(hop: int, targets: list | None, n: int, fanout: int) -> list[int]:
    """Members a message sent to ``hop`` (for ``targets``) reaches or passes."""
    if targets is _ALL:
        return subtree(hop, n, fanout)
    seen = {hop}
    for member, _rank in targets:
        chain = path(member, fanout)
        seen.update(chain[chain.index(hop):] if hop in chain else (member,))
    return sorted(seen)


def count(hop: int, sub: list | None, n: int, fanout: int) -> int:
    """Replies a message sent to ``hop`` for ``sub`` brings back."""
    return len(subtree(hop, n, fanout)) if sub is _ALL else len(sub)


# ---------------------------------------------------------------- gathered replies
# (one port message of status ``W.S_BATCH``: ``_portmsg.encode_batch`` / ``_portmsg.decode_batch``)


class SubtreeGather:
    """A forwarder's port for the replies of its subtree to one ``call``: they
    go up in one batch once all are in; an error goes up at once (it fails
    the call), and so does the loss of a proc below (its replies never come)."""

    def __init__(self, kernel: Kernel, up: tuple, expected: int) -> None:
        import threading

        self.kernel = kernel
        self.up = up
        self.expected = expected
        self.count = 0
        self.items: list = []
        self.procs: list[str] = []
        #: proc of a hop below -> the rank (in the message) its loss is reported for
        self.rank_of: dict[str, int] = {}
        self.closed = False
        self.lock = threading.Lock()
        self.port_id = kernel.add_port(self)

    def ref(self) -> tuple:
        return (self.kernel.proc_id, self.kernel.address, self.port_id)

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        if status == W.S_BATCH:
            items = decode_batch(self.up[0], payload, buffers)
        else:
            items = [(rank, status, payload, buffers)]
        errors = [it for it in items if it[1] != W.S_VALUE]
        with self.lock:
            if self.closed:
                return
            self.count += len(items)
            if not errors:
                self.items.extend(items)
            done = bool(errors) or self.count >= self.expected
            if not done:
                return
            self.closed = True
            batch, self.items = (errors[:1] if errors else self.items), []
        self._close()
        self._send_up(batch)

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        """A proc below was lost (its replies never come): the call fails,
        reported for that hop's rank -- not for every rank of the call, as a
        ``-1`` would read -- when the proc is one this port waits on."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.items = []
        self._close()
        rank = self.rank_of.get(proc_id, -1) if proc_id is not None else -1
        self._send_up([(rank, W.S_ERROR, *_serial.dumps(exc))])

    def _close(self) -> None:
        self.kernel.remove_port(self.port_id)
        for p in self.procs:
            self.kernel.reply_done(p, self.port_id)

    def _send_up(self, items: list) -> None:
        payload, bufs = encode_batch(items)
        _portmsg.send(self.kernel, self.up, -1, W.S_BATCH, payload, bufs)
        self.kernel.tree_batches += 1


# ---------------------------------------------------------------- the wire form
def encode(msg: tuple, n: int, fanout: int, at: int, targets: list | None, table: dict | None, view: str,
           gather: bool) -> bytes:
    """The header of a message on its way to member ``at``: ``msg`` is the
    message as every member gets it, ``(key, method, reply, labels, sizes,
    sender, ret, explicit, trace)`` (``trace``: a traced call's trace context,
    or None); ``targets``: ``[(member, rank_in_msg), ...]`` at or below
    ``at``, or None for its whole subtree; ``table``: member -> (proc_id,
    address) for every member the message reaches or passes below ``at``, or
    None: the receiving procs kept it from an earlier message of the same
    sender for the same ``view`` (an id of the sender's list of members).
    ``gather``: each forwarder collects the replies of its subtree and sends
    them up as one batch (``call``)."""
    return marshal.dumps(
        (msg, n, fanout, at, None if targets is None else [tuple(t) for t in targets], table, view, bool(gather))
    )


def decode(peer: str, header: bytes) -> tuple:
    """The fields :func:`encode` took; a header of another shape raises :class:`ProtocolError`."""
    h = W.decode_header(peer, header)
    try:
        msg, n, fanout, at, targets, table, view, gather = h
        ok = (
            type(gather) is bool and isinstance(view, str) and type(n) is int and type(fanout) is int
            and type(at) is int and 0 <= at < n and fanout >= 2
            and _message_ok(msg) and _targets_ok(targets, n) and _table_ok(table)
        )
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ProtocolError(f"peer {peer} sent a malformed cast-tree message header")
    return h


def _message_ok(msg: Any) -> bool:
    """``msg`` is the message part of a header, ``(key, method, reply, labels,
    sizes, sender, ret, explicit, trace)`` with fields of the right types (one
    of another length raises ``ValueError``, which :func:`decode` turns into a
    ``ProtocolError``)."""
    key, method, reply, labels, sizes, _sender, ret, _explicit, trace = msg
    return (
        type(msg) is tuple and (trace is None or type(trace) is bytes) and isinstance(key, str)
        and isinstance(method, str) and isinstance(labels, tuple) and isinstance(sizes, tuple)
        and _port_ref_ok(reply) and _port_ref_ok(ret)
    )


def _port_ref_ok(ref: Any) -> bool:
    """``ref`` is None or a port reference's shape, a 3-tuple (its fields are
    checked where a message is sent to it: ``_portmsg.send``)."""
    return ref is None or (isinstance(ref, tuple) and len(ref) == 3)


def _targets_ok(targets: Any, n: int) -> bool:
    """``targets`` is None (a whole subtree) or a list of ``(member, rank)``
    int pairs naming members of a mesh of ``n``."""
    return targets is None or (isinstance(targets, list) and all(
        isinstance(t, tuple) and len(t) == 2 and type(t[0]) is int and type(t[1]) is int and 0 <= t[0] < n
        for t in targets))


def _table_ok(table: Any) -> bool:
    """``table`` is None (the receiver keeps one) or a dict member -> ``(proc_id, address)``."""
    return table is None or (isinstance(table, dict) and all(
        type(k) is int and isinstance(v, tuple) and len(v) == 2 for k, v in table.items()))


# ---------------------------------------------------------------- a member's proc
def forward(kernel: Kernel, header: bytes, payload: Any, buffers: list, sender_proc: str) -> None:
    """A tree message arrived at this proc (the thread that read it): deliver
    it to the local member if it is a target, and send it on below.

    The steps: the member table (:func:`_member_table`), the plan
    (:func:`plan`), the subtree's reply gatherer of a ``call``
    (:func:`_gather_subtree`), the messages below (:func:`_send_below`),
    then the local member's delivery."""
    msg, n, fanout, at, targets, table, view, gather = decode(sender_proc, header)
    carried = table is not None
    table = _member_table(kernel, (msg[0], view), table)
    if table is None:  # never sent, or forgotten: the sender must not wait for nothing
        logger.error("cast-tree message from %s for %s.%s without a member table this proc knows; "
                     "its targets are answered with an error", sender_proc, msg[0], msg[1])
        _fail_targets(kernel, at, n, fanout, targets, msg[2], msg[1])
        return
    dead_procs = kernel.dead

    def dead(member: int) -> bool:
        entry = table.get(member)
        return entry is not None and (entry[1] == DEAD or entry[0] in dead_procs)

    here, rank_here, groups = plan(at, n, fanout, targets, dead)
    for hop in groups:
        if hop not in table:
            raise ProtocolError(f"peer {sender_proc} sent a cast-tree message without the address of member {hop}")
    g: SubtreeGather | None = None
    passed: list[int] = []
    if gather and msg[2] is not None and groups:
        g, passed = _gather_subtree(kernel, tuple(msg[2]), here, at, n, fanout, targets, groups, dead)
        msg = (msg[0], msg[1], g.ref(), *msg[3:])
    _send_below(kernel, msg, n, fanout, groups, table, carried, view, gather, payload, buffers, g)
    if g is not None:
        for m in passed:  # nobody below answers for a dead member
            g.deliver(m, W.S_ERROR, *_serial.dumps(kernel._dead_error(table[m][0])))
    if here:
        key, method, reply, labels, sizes, sender, ret, explicit, trace = msg
        h = (key, method, reply, rank_here, labels, sizes, sender, ret, int(explicit))
        kernel.route_actor(h if trace is None else (*h, trace), payload, buffers, sender_proc)


def _member_table(kernel: Kernel, cache_key: tuple, carried: dict | None) -> dict | None:
    """The member table for ``cache_key`` (``(key, view)``): the one the
    message ``carried`` (merged into what this proc keeps for the next
    messages, which may come without it), else the one this proc kept; None
    when it has none."""
    tables = kernel.tree_tables
    if carried is None:
        return tables.get(cache_key)
    known = tables.get(cache_key)
    if known is None:
        tables[cache_key] = dict(carried)
    else:
        known.update(carried)
    return carried


def _gather_subtree(kernel: Kernel, up: tuple, here: bool, at: int, n: int, fanout: int, targets: list | None,
                    groups: dict[int, list | None], dead: Callable[[int], bool]) -> tuple[SubtreeGather, list[int]]:
    """The port the replies of this subtree to a ``call`` come to, to go ``up``
    as one batch (it expects one from the local member if it is a target,
    one per dead member it routes around, and those of every hop below); and
    those dead members (their errors are delivered once the message went on)."""
    passed = skipped_dead(at, n, fanout, targets, dead)
    expected = int(here) + len(passed) + sum(count(hop, sub, n, fanout) for hop, sub in groups.items())
    return SubtreeGather(kernel, up, expected), passed


def _send_below(kernel: Kernel, msg: tuple, n: int, fanout: int, groups: dict[int, list | None], table: dict,
                carried: bool, view: str, gather: bool, payload: Any, buffers: list, g: SubtreeGather | None) -> None:
    """Send the message on to each hop of ``groups`` (hop -> its targets),
    with the part of the member table below it when the message ``carried``
    one; ``g``: the subtree's gatherer, which then waits on each hop's proc."""
    for hop, sub in groups.items():
        entry = table[hop]
        sub_table = {m: table[m] for m in touched(hop, sub, n, fanout) if m in table} if carried else None
        out = encode(msg, n, fanout, hop, sub, sub_table, view, gather)
        if g is not None:
            g.procs.append(entry[0])
            g.rank_of.setdefault(entry[0], _hop_rank(hop, sub))
            kernel.send(entry[0], entry[1], W.K_ACTOR, W.F_TREE, out, payload, buffers, g.port_id)
        else:
            kernel.send(entry[0], entry[1], W.K_ACTOR, W.F_TREE, out, payload, buffers)
        kernel.tree_forwarded += 1


def _hop_rank(hop: int, sub: list | None) -> int:
    """The rank (in the message) a lost ``hop`` is reported for: its own when
    it is a target, else its subtree's first target's."""
    if sub is _ALL:
        return hop
    for member, rank in sub:
        if member == hop:
            return int(rank)
    return int(sub[0][1]) if sub else -1


def _fail_targets(kernel: Kernel, at: int, n: int, fanout: int, targets: list | None, reply: tuple | None,
                  method: str) -> None:
    """Answer every target below ``at`` with an error (a message this proc
    cannot route)."""
    if reply is None:
        return
    err = SupervisionError(
        f"{method} could not be routed through the cast tree at proc {kernel.proc_id}: it has no member table "
        "for this mesh (send the call again; a new table goes with the next cast)"
    )
    ranks = subtree(at, n, fanout) if targets is _ALL else [r for _m, r in targets]
    for r in ranks:
        try:
            _portmsg.send(kernel, reply, r, W.S_ERROR, *_serial.dumps(err))
        except Exception:  # noqa: BLE001 - best effort: the sender may be gone
            logger.debug("could not report an unroutable cast to %s", reply, exc_info=True)
