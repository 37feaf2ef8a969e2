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
from monarch_core.errors import ProtocolError

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
def encode_batch(items: list) -> tuple[bytes, list]:
    """``[(rank, status, payload, buffers), ...]`` as one port message: a
    marshal list of ``(rank, status, payload bytes, number of buffers)`` and
    every item's buffers, in order, as the message's out-of-band parts."""
    rows, flat = [], []
    for rank, status, payload, buffers in items:
        rows.append((rank, status, bytes(payload), len(buffers)))
        flat.extend(buffers)
    return marshal.dumps(rows), flat


def decode_batch(peer: str, payload: Any, buffers: list) -> list:
    data = bytes(payload)
    W.check_marshal(data, peer, "batch of replies")
    try:
        rows = marshal.loads(data)
    except (ValueError, EOFError, TypeError) as e:
        raise ProtocolError(f"peer {peer} sent a malformed batch of replies: {e}") from None
    if not isinstance(rows, list) or not all(
        isinstance(r, tuple) and len(r) == 4 and type(r[0]) is int and type(r[1]) is int
        and isinstance(r[2], bytes) and type(r[3]) is int and r[3] >= 0 for r in rows
    ) or sum(r[3] for r in rows) != len(buffers):
        raise ProtocolError(f"peer {peer} sent a malformed batch of replies")
    out, i = [], 0
    for rank, status, p, nb in rows:
        out.append((rank, status, p, list(buffers[i:i + nb])))
        i += nb
    return out


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
        from monarch_core._proc import _serial

        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.items = []
        self._close()
        self._send_up([(-1, W.S_ERROR, *_serial.dumps(exc))])

    def _close(self) -> None:
        self.kernel.remove_port(self.port_id)
        for p in self.procs:
            self.kernel.reply_done(p, self.port_id)

    def _send_up(self, items: list) -> None:
        payload, bufs = encode_batch(items)
        proc_id, address, port_id = self.up
        self.kernel.send(proc_id, address, W.K_PORT, W.F_PACKED, W.port_header(port_id, -1, W.S_BATCH), payload, bufs)
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
        key, method, reply, labels, sizes, _sender, ret, _explicit, trace = msg
        ok = (
            type(msg) is tuple and type(gather) is bool and (trace is None or type(trace) is bytes) and
            isinstance(key, str) and isinstance(method, str) and isinstance(labels, tuple)
            and isinstance(sizes, tuple) and type(n) is int and type(fanout) is int and type(at) is int
            and 0 <= at < n and fanout >= 2 and (table is None or isinstance(table, dict)) and isinstance(view, str)
            and (reply is None or (isinstance(reply, tuple) and len(reply) == 3))
            and (ret is None or (isinstance(ret, tuple) and len(ret) == 3))
            and (targets is None or (isinstance(targets, list) and all(
                isinstance(t, tuple) and len(t) == 2 and type(t[0]) is int and type(t[1]) is int
                and 0 <= t[0] < n for t in targets)))
            and (table is None or all(type(k) is int and isinstance(v, tuple) and len(v) == 2
                                      for k, v in table.items()))
        )
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ProtocolError(f"peer {peer} sent a malformed cast-tree message header")
    return h


# ---------------------------------------------------------------- a member's proc
def forward(kernel: Kernel, header: bytes, payload: Any, buffers: list, sender_proc: str) -> None:
    """A tree message arrived at this proc (the thread that read it): deliver
    it to the local member if it is a target, and send it on below."""
    msg, n, fanout, at, targets, table, view, gather = decode(sender_proc, header)
    key, method, reply, labels, sizes, sender, ret, explicit, trace = msg
    dead_procs = kernel.dead
    cache_key = (key, view)
    carried = table is not None
    if carried:
        known = kernel.tree_tables.get(cache_key)
        if known is None:
            kernel.tree_tables[cache_key] = dict(table)
        else:
            known.update(table)
    else:
        table = kernel.tree_tables.get(cache_key)
        if table is None:  # never sent, or forgotten: the sender must not wait for nothing
            logger.error("cast-tree message from %s for %s.%s without a member table this proc knows; "
                         "its targets are answered with an error", sender_proc, key, method)
            _fail_targets(kernel, at, n, fanout, targets, reply, method)
            return

    def dead(member: int) -> bool:
        entry = table.get(member)
        return entry is not None and (entry[1] == DEAD or entry[0] in dead_procs)

    here, rank_here, groups = plan(at, n, fanout, targets, dead)
    for hop in groups:
        if hop not in table:
            raise ProtocolError(f"peer {sender_proc} sent a cast-tree message without the address of member {hop}")
    g = None
    passed: list[int] = []
    if gather and reply is not None and groups:
        # Replies of this subtree come here and go up as one batch.
        passed = skipped_dead(at, n, fanout, targets, dead)
        expected = int(here) + len(passed) + sum(count(hop, sub, n, fanout) for hop, sub in groups.items())
        g = SubtreeGather(kernel, tuple(reply), expected)
        reply = g.ref()
        msg = (key, method, reply, *msg[3:])
    for hop, sub in groups.items():
        entry = table[hop]
        sub_table = {m: table[m] for m in touched(hop, sub, n, fanout) if m in table} if carried else None
        out = encode(msg, n, fanout, hop, sub, sub_table, view, gather)
        if g is not None:
            g.procs.append(entry[0])
            kernel.send(entry[0], entry[1], W.K_ACTOR, W.F_TREE, out, payload, buffers, g.port_id)
        else:
            kernel.send(entry[0], entry[1], W.K_ACTOR, W.F_TREE, out, payload, buffers)
        kernel.tree_forwarded += 1
    if g is not None:
        from monarch_core._proc import _serial

        for m in passed:  # nobody below answers for a dead member
            g.deliver(m, W.S_ERROR, *_serial.dumps(kernel._dead_error(table[m][0])))
    if here:
        h = (key, method, reply, rank_here, labels, sizes, sender, ret, int(explicit))
        kernel.route_actor(h if trace is None else (*h, trace), payload, buffers, sender_proc)


def _fail_targets(kernel: Kernel, at: int, n: int, fanout: int, targets: list | None, reply: tuple | None,
                  method: str) -> None:
    """Answer every target below ``at`` with an error (a message this proc
    cannot route)."""
    if reply is None:
        return
    from monarch_core._proc import _serial
    from monarch_core.errors import SupervisionError

    err = SupervisionError(
        f"{method} could not be routed through the cast tree at proc {kernel.proc_id}: it has no member table "
        "for this mesh (send the call again; a new table goes with the next cast)"
    )
    ranks = subtree(at, n, fanout) if targets is _ALL else [r for _m, r in targets]
    for r in ranks:
        try:  # what ``_port.send_to_port`` does (that module imports this one)
            proc_id, address, port_id = reply
            if not isinstance(proc_id, str) or not isinstance(port_id, int) or not (
                    address is None or isinstance(address, str)):
                raise ValueError(f"malformed port reference {reply!r}")
            payload, bufs = _serial.dumps(err)
            kernel.send(proc_id, address, W.K_PORT, W.F_PACKED, W.port_header(port_id, r, W.S_ERROR), payload, bufs)
        except Exception:  # noqa: BLE001 - best effort: the sender may be gone
            logger.debug("could not report an unroutable cast to %s", reply, exc_info=True)
