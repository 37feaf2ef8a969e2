"""A port message on the wire: the one way one is sent, and the batch of
gathered replies (one port message carrying the replies a cast tree's
forwarder collected).

:func:`send` builds and sends the frame of every port message of the
process -- a reply (``_port.send_raw_to_port``, ``_port.send_to_port``), a
channel's message, a plugin's (``monarch_core.runtime.send_to_port``), a
forwarder's batch or error (``_tree``).  It takes the kernel to send through,
so that the cast tree (which ``_port`` sits above) uses it too; it imports
nothing of the runtime but the wire format.
"""

from __future__ import annotations

import marshal
from typing import TYPE_CHECKING, Any

from monarch_core._kernel import _wire as W
from monarch_core.errors import ProtocolError

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel


def send(kernel: Kernel, ref: tuple, rank: int | None, status: int, payload: Any, bufs: list,
         reply_port: int | None = None) -> None:
    """Send ``payload`` and ``bufs`` (already serialized), as ``rank`` (None:
    -1) with ``status`` (``W.S_VALUE``, ``S_ERROR``, ``S_BATCH``), to the port
    ``ref = (proc_id, address, port_id)`` (address None: where ``kernel``
    learns the proc is) through ``kernel``.  ``reply_port``: a local port
    that also waits on that proc (it fails if the proc dies first).  A
    malformed ``ref`` raises ``ValueError``.  Any thread, as ``Kernel.send``
    (it may wait for room in the destination's send window)."""
    proc_id, address, port_id = ref
    if not isinstance(proc_id, str) or not isinstance(port_id, int) or not (address is None or isinstance(address, str)):
        raise ValueError(f"malformed port reference {ref!r}")
    header = W.port_header(port_id, -1 if rank is None else rank, status)
    kernel.send(proc_id, address, W.K_PORT, W.F_PACKED, header, payload, bufs, reply_port)


def encode_batch(items: list) -> tuple[bytes, list]:
    """``[(rank, status, payload, buffers), ...]`` as one port message (status
    ``W.S_BATCH``: the replies a cast tree's forwarder gathered): a marshal
    list of ``(rank, status, payload bytes, number of buffers)`` and every
    item's buffers, in order, as the message's out-of-band parts."""
    rows, flat = [], []
    for rank, status, payload, buffers in items:
        rows.append((rank, status, bytes(payload), len(buffers)))
        flat.extend(buffers)
    return marshal.dumps(rows), flat


def decode_batch(peer: str, payload: Any, buffers: list) -> list:
    """The items :func:`encode_batch` took, from a message ``peer`` sent; a
    malformed batch raises :class:`~monarch_core.errors.ProtocolError`."""
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
