"""The wire format: handshake, frame layout and routing headers, and their codec.

A connection starts with a handshake in each direction::

    b"MONARCH\\0" | u16 version | u32 length | marshal(dict)

then carries messages.  A message is one fixed header followed by its parts::

    u8 kind | u8 flags | u16 nbufs | u32 hlen | u32 plen | u64 seq     (20 bytes)
    u64 buffer length * nbufs   (top bit set: the buffer is an immutable ``bytes``)
    header  (hlen bytes, ``marshal`` of a tuple of primitives: routing only)
    payload (plen bytes, cloudpickle protocol 5 of the user's objects)
    buffer 0, buffer 1, ...   (pickle-5 out-of-band buffers, never copied
                               into the payload)

The header is ``marshal`` rather than pickle: it holds only strings, ints and
tuples, decodes several times faster, and cannot run code when a peer sends
garbage (:func:`check_marshal` rejects what monarch never sends before
``marshal.loads`` sees it).  With ``F_PACKED`` a header is packed instead
(:func:`port_header`, :func:`actor_header`; :func:`decode_packed`); a packed
actor header may carry an *extension*, bytes the kernel does not read and the
receiving actor gets as its header's tenth field (a traced call's trace
context: the kernel routes traced and plain calls alike).  A malformed
header raises :class:`~monarch_core.errors.ProtocolError`.

This module encodes and decodes; reading frames off a stream, with the limits
on what a peer may announce, is :mod:`._wire`'s, which re-exports everything
here: the rest of monarch names the format ``_wire`` (``W.K_ACTOR``, ...).
"""

from __future__ import annotations

import marshal
import struct
from typing import TYPE_CHECKING, Any

from monarch_core.errors import ProtocolError

if TYPE_CHECKING:
    from monarch_core.hookspecs import Stream

MAGIC = b"MONARCH\0"
VERSION = 2  # (2: packed actor headers carry an extension length)
_HS = struct.Struct("<8sHI")
FIXED = struct.Struct("<BBHIIQ")
FIXED_SIZE = FIXED.size

# message kinds
K_ACTOR = 1  # to an actor: (actor_key, endpoint, reply, rank, labels, sizes, sender)
K_PORT = 2  # to a port: (port_id, rank, status)
K_CONTROL = 3  # to the proc's agent: (op, *fields), the named messages of _control.py
K_ACK = 4  # cumulative acknowledgement: seq field = last delivered seq
K_BYE = 5  # orderly end of a session: receiver forgets it

# frame flags
F_PACKED = 1  # the routing header is packed (see ``port_header``/``actor_header``), not plain marshal
F_TREE = 2  # an actor message on its way through a cast tree (header: see ``monarch_core._proc._tree``)
F_ACK_SOON = 4  # the sender is near its send window: acknowledge this message as soon as it is delivered

# port message status
S_VALUE = 0
S_ERROR = 1  # payload: an exception to raise at the receiver (ActorError ...)
S_BATCH = 3  # replies gathered by a cast tree: see ``monarch_core._proc._tree.encode_batch``

_COALESCE = 1 << 16  # parts smaller than this are joined into one write
BYTES_BIT = 1 << 63  # in a buffer length: deliver this buffer as ``bytes`` (not a bytearray)


def encode_handshake(info: dict[str, Any]) -> bytes:
    body = marshal.dumps(info)
    return _HS.pack(MAGIC, VERSION, len(body)) + body


# marshal type codes a routing header or handshake may use, and how to skip them
_M_FIXED = {ord("N"): 0, ord("T"): 0, ord("F"): 0, ord("i"): 4, ord("g"): 8}
_M_SIZED1 = {ord("z"), ord("Z")}  # short ascii: 1-byte length
_M_SIZED4 = {ord("a"), ord("A"), ord("u"), ord("s"), ord("t")}  # 4-byte length
_M_SEQ1 = {ord(")")}  # small tuple: 1-byte count
_M_SEQ4 = {ord("("), ord("["), ord("<"), ord(">")}  # tuple/list/sets: 4-byte count
_M_DICT = ord("{")
_M_NULL = ord("0")
_M_REF = ord("r")
_M_LONG = ord("l")
_I32 = struct.Struct("<i")


def check_marshal(data: bytes, peer: str, what: str) -> None:
    """Reject marshal data outside the small subset monarch uses, or whose
    announced sizes exceed the bytes present, *before* ``marshal.loads`` can
    allocate for them.

    One pass over the type codes, with a stack of the items still expected
    at each nesting level (-1: inside a dict).  The codes of a routing
    header's every field (fixed-size values, short strings, small tuples,
    back-references) are skipped inline; the others by :func:`_skip_wide`.
    Reading past the end (an index or a ``struct`` read out of range) means
    the data is truncated."""
    n = len(data)
    pos = 0
    stack = [1]  # items still expected at each nesting level
    nrefs = 0
    try:
        while stack:
            top = stack[-1]
            if top == 0:
                stack.pop()
                continue
            if top == -1:  # inside a dict: key/value pairs until the NULL code
                if data[pos] & 0x7F == _M_NULL:
                    pos += 1
                    stack.pop()
                else:
                    stack.append(2)
                continue
            stack[-1] = top - 1
            code = data[pos]
            pos += 1
            if code & 0x80:  # FLAG_REF: the object may be referred to later
                nrefs += 1
                code &= 0x7F
            if code in _M_FIXED:
                pos += _M_FIXED[code]
            elif code in _M_SIZED1:
                pos += 1 + data[pos]
            elif code in _M_SEQ1:
                stack.append(data[pos])
                pos += 1
            elif code == _M_REF:
                idx = _I32.unpack_from(data, pos)[0]
                if idx < 0 or idx >= nrefs:
                    raise ProtocolError(f"peer {peer} sent a malformed {what} (bad reference)")
                pos += 4
            else:
                pos = _skip_wide(data, pos, code, stack, peer, what)
            if pos > n:
                break
        else:
            return
    except (IndexError, struct.error):
        pass
    raise ProtocolError(f"peer {peer} sent a malformed {what} (truncated)")


def _skip_wide(data: bytes, pos: int, code: int, stack: list[int], peer: str, what: str) -> int:
    """For :func:`check_marshal`: the position after the object of type
    ``code`` whose body starts at ``pos`` -- a string, bytes or long with a
    4-byte length (its announced size checked against the data), a tuple,
    list or set with a 4-byte count, or a dict (their items are pushed on
    ``stack``: counted, or -1 for a dict's pairs up to its NULL code).
    Raises ``ProtocolError`` for a type monarch never sends (and
    ``IndexError``/``struct.error`` past the end of ``data``)."""
    if code in _M_SIZED4 or code == _M_LONG:
        size = _I32.unpack_from(data, pos)[0]
        width = 1
        if code == _M_LONG:
            size, width = abs(size), 2
        if size < 0 or pos + 4 + size * width > len(data):
            raise ProtocolError(f"peer {peer} sent a malformed {what} (bad length {size})")
        return pos + 4 + size * width
    if code in _M_SEQ4:
        count = _I32.unpack_from(data, pos)[0]
        if count < 0 or count > len(data) - pos:
            raise ProtocolError(f"peer {peer} sent a malformed {what} (sequence of {count} items)")
        stack.append(count)
        return pos + 4
    if code == _M_DICT:
        stack.append(-1)
        return pos
    raise ProtocolError(f"peer {peer} sent a malformed {what} (unsupported type code {code!r})")


def encode_message(
    kind: int, flags: int, seq: int, header: bytes, payload: bytes | bytearray | memoryview, buffers: list
) -> list:
    """The parts of one message, ready for :func:`write_parts`."""
    nb = len(buffers)
    fixed = FIXED.pack(kind, flags, nb, len(header), len(payload), seq)
    if nb:
        lens = struct.pack(f"<{nb}Q", *[len(b) | BYTES_BIT if type(b) is bytes else memoryview(b).nbytes
                                        for b in buffers])
        return [fixed, lens, header, payload, *buffers]
    return [fixed, header, payload]


def total_size(parts: list) -> int:
    return sum(len(p) if type(p) is bytes else memoryview(p).nbytes for p in parts)


def skip_bytes(parts: list, n: int) -> list:
    """``parts`` without their first ``n`` bytes (views, no copies)."""
    out: list = []
    for p in parts:
        m = memoryview(p)
        if m.ndim != 1 or m.itemsize != 1:
            m = m.cast("B")
        size = m.nbytes
        if n >= size:
            n -= size
            continue
        out.append(m[n:] if n else m)
        n = 0
    return out


def coalesce(parts: list) -> list:
    """Join runs of small parts so that a batch costs few ``send`` calls."""
    out: list = []
    run: list = []
    for p in parts:
        n = p.nbytes if isinstance(p, memoryview) else len(p)
        if n >= _COALESCE:
            if run:
                out.append(b"".join(run))
                run = []
            out.append(p)
        else:
            run.append(p)
    if run:
        out.append(b"".join(run) if len(run) > 1 else run[0])
    return out


_PORT_H = struct.Struct("<qqB")  # port id, rank, status
#: reply port id (-1: none), rank, return port id (-1: none), length of the extension that follows
_ACTOR_P = struct.Struct("<qqqB")
_ACTOR_P_SIZE = _ACTOR_P.size
_unpack_actor = _ACTOR_P.unpack_from
_ACTOR_CACHE: dict[bytes, tuple] = {}
#: actor key -> the keys of its entries in ``_ACTOR_CACHE`` (what ``forget_actor`` drops)
_ACTOR_CACHE_BY_KEY: dict[str, list[bytes]] = {}
_ACTOR_CACHE_MAX = 4096
_REST_CACHE_MAX = 256


def port_header(port_id: int, rank: int, status: int) -> bytes:
    """Packed header of a port message (send with ``flags=F_PACKED``)."""
    return _PORT_H.pack(port_id, rank, status)


def actor_header(key: str, method: str, reply: tuple | None, rank: int, labels: tuple, sizes: tuple,
                 sender: str, ret: tuple | None, explicit: bool, ext: bytes | None = None,
                 cache: dict | None = None) -> bytes:
    """Packed header of an actor message (send with ``flags=F_PACKED``).

    The fields that change from call to call (port ids, rank) are a fixed
    struct, followed by ``ext`` (at most 255 opaque bytes: a traced call's
    trace context, which the receiving actor gets as a tenth header field);
    the rest is marshal, identical across calls from one sender to one
    endpoint, so the receiver validates and decodes it once and reuses it,
    and so does the sender with a ``cache`` (a dict it keeps for the
    recipients, and drops with them).
    """
    fields = (
        key, method, reply[0] if reply else None, reply[1] if reply else None, labels, sizes, sender,
        ret[0] if ret else None, ret[1] if ret else None, bool(explicit),
    )
    rest: bytes | None
    if cache is None:
        rest = marshal.dumps(fields)
    else:
        rest = cache.get(fields)
        if rest is None:
            if len(cache) >= _REST_CACHE_MAX:
                cache.clear()
            rest = cache[fields] = marshal.dumps(fields)
    if ext is not None:
        return _ACTOR_P.pack(reply[2] if reply else -1, rank, ret[2] if ret else -1, len(ext)) + ext + rest
    return _ACTOR_P.pack(reply[2] if reply else -1, rank, ret[2] if ret else -1, 0) + rest


def decode_packed(peer: str, kind: int, header: bytes) -> tuple:
    """Decode a packed header into the same tuple ``decode_header`` gives for
    the marshal form: an actor header's 9 fields, and its extension (bytes)
    as a tenth when it has one.  Malformed input raises :class:`ProtocolError`."""
    if kind == K_PORT:
        if len(header) != _PORT_H.size:
            raise ProtocolError(f"peer {peer} sent a malformed port message header ({len(header)} bytes)")
        return _PORT_H.unpack(header)
    if kind != K_ACTOR or len(header) < _ACTOR_P_SIZE:
        raise ProtocolError(f"peer {peer} sent a malformed packed header (kind {kind}, {len(header)} bytes)")
    reply_port, rank, ret_port, n = _unpack_actor(header)
    start = _ACTOR_P_SIZE + n
    rest = header[start:]
    f = _ACTOR_CACHE.get(rest)
    if f is None:
        f = _actor_fields(peer, rest)
    key, method, rproc, raddr, labels, sizes, sender, tproc, taddr, explicit = f
    reply = (rproc, raddr, reply_port) if reply_port >= 0 and rproc is not None else None
    ret = (tproc, taddr, ret_port) if ret_port >= 0 and tproc is not None else None
    if n:
        return (key, method, reply, rank, labels, sizes, sender, ret, explicit, header[_ACTOR_P_SIZE:start])
    return (key, method, reply, rank, labels, sizes, sender, ret, explicit)


def _actor_fields(peer: str, rest: bytes) -> tuple:
    """The marshal part of a packed actor header, checked, and cached by its bytes."""
    f = decode_header(peer, rest)
    if (
        len(f) != 10
        or not isinstance(f[0], str)
        or not isinstance(f[1], str)
        or not all(isinstance(x, str) or x is None for x in (f[2], f[3], f[6], f[7], f[8]))
        or not isinstance(f[4], tuple)
        or not isinstance(f[5], tuple)
    ):
        raise ProtocolError(f"peer {peer} sent a malformed actor message header")
    if len(_ACTOR_CACHE) >= _ACTOR_CACHE_MAX:
        _ACTOR_CACHE.clear()
        _ACTOR_CACHE_BY_KEY.clear()
    _ACTOR_CACHE[rest] = f
    _ACTOR_CACHE_BY_KEY.setdefault(f[0], []).append(rest)
    return f


def forget_actor(key: str) -> None:
    """Drop the cached headers of messages to actor ``key`` (it stopped: none
    is decoded again, and a stopped actor leaves nothing here)."""
    for rest in _ACTOR_CACHE_BY_KEY.pop(key, ()):  # (its own entries: a proc stopping 20,000 actors
        _ACTOR_CACHE.pop(rest, None)               # scanned the whole cache 20,000 times)


def decode_header(peer: str, header: bytes) -> tuple:
    check_marshal(header, peer, "message header")
    try:
        h = marshal.loads(header)
    except (ValueError, EOFError, TypeError, MemoryError) as e:
        raise ProtocolError(f"peer {peer} sent a malformed message header: {e}") from None
    if not isinstance(h, tuple) or not h:
        raise ProtocolError(f"peer {peer} sent a malformed message header (not a tuple)")
    return h


async def write_parts(stream: Stream, parts: list) -> None:
    for p in coalesce(parts):
        await stream.send_all(p)
