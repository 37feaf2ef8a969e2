"""Wire format: handshake and length-prefixed frames.

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
garbage.  Every length is checked against limits before anything is allocated;
a violation raises :class:`~monarch_core.errors.ProtocolError` and the
connection is dropped.
"""

from __future__ import annotations

import marshal
import mmap
import os
import struct
import threading
import weakref
from typing import Any

from monarch_core.errors import ConnectionClosed, ProtocolError
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from monarch_core.hookspecs import Stream

MAGIC = b"MONARCH\0"
VERSION = 1
_HS = struct.Struct("<8sHI")
FIXED = struct.Struct("<BBHIIQ")
FIXED_SIZE = FIXED.size

# message kinds
K_ACTOR = 1  # to an actor: (actor_key, endpoint, reply, rank, labels, sizes, sender)
K_PORT = 2  # to a port: (port_id, rank, status)
K_CONTROL = 3  # to the proc's agent: (op, *args)
K_ACK = 4  # cumulative acknowledgement: seq field = last delivered seq
K_BYE = 5  # orderly end of a session: receiver forgets it

# frame flags
F_PACKED = 1  # the routing header is packed (see ``port_header``/``actor_header``), not plain marshal
F_TREE = 2  # an actor message on its way through a cast tree (header: see ``monarch_core._actor._tree``)

# port message status
S_VALUE = 0
S_ERROR = 1  # payload: an exception to raise at the receiver (ActorError ...)
S_BATCH = 3  # replies gathered by a cast tree: see ``monarch_core._actor._tree.encode_batch``

MAX_HEADER = 1 << 20
MAX_HANDSHAKE = 1 << 16
MAX_BUFS = 1 << 14
MAX_MESSAGE = int(os.environ.get("MONARCH_MAX_MESSAGE_BYTES", str(1 << 36)))
_BIG = 1 << 16  # parts at least this large are read straight into their own buffer
_EAGER = (64 << 20) + 4096  # parts up to this size are allocated before their bytes arrive
_COALESCE = 1 << 16  # parts smaller than this are joined into one write
BYTES_BIT = 1 << 63  # in a buffer length: deliver this buffer as ``bytes`` (not a bytearray)
POOL_MIN = 1 << 20  # parts at least this large are received into pooled buffers
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _new_bytes_writable(n: int) -> tuple[bytes, memoryview] | None:
    """A fresh, uninitialised ``bytes`` of length ``n`` and a writable view of
    its storage, to receive into before anyone else sees the object (saves
    the copy a bytearray-to-bytes conversion would cost).  None where this
    CPython detail is unavailable."""
    if _PyBytes_New is None:
        return None
    b = _PyBytes_New(None, n)
    arr = (ctypes.c_char * n).from_address(id(b) + _BYTES_DATA_OFFSET)
    arr.owner = b  # the view keeps the memory alive
    return b, memoryview(arr).cast("B")


class _BufferPool:
    """Large receive buffers, kept for reuse once their consumer drops them.

    A fresh 64 MiB buffer costs ~16k page faults (~30-45 ms on a VM, several
    times the copy into it); a reused one costs none.  Buffers are anonymous
    mappings handed out as writable views; when the last reference to a view
    goes (the tensor or array built on it is freed), the mapping returns here,
    to be reused for a message of the same size.  At most ``limit`` bytes are
    kept (``MONARCH_BUFFER_POOL_MB``, default 256; 0 disables)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free: dict[int, list] = {}
        self._kept = 0
        self._lock = threading.RLock()  # a finalizer may run inside take() (GC)

    def take(self, n: int) -> memoryview:
        m = None
        with self._lock:
            free = self._free.get(n)
            if free:
                m = free.pop()
                self._kept -= n
        if m is None:
            m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_POPULATE)
        arr = (ctypes.c_char * n).from_buffer(m)
        weakref.finalize(arr, self._give_back, m, n)
        return memoryview(arr).cast("B")

    def _give_back(self, m: Any, n: int) -> None:
        with self._lock:
            if self._kept + n <= self.limit:
                self._free.setdefault(n, []).append(m)
                self._kept += n
        # else: dropped; the mapping goes when the view's last export does


try:
    import ctypes
    import sys as _sys

    if _sys.implementation.name != "cpython":  # pragma: no cover
        raise ImportError
    _PyBytes_New = ctypes.pythonapi.PyBytes_FromStringAndSize
    _PyBytes_New.restype = ctypes.py_object
    _PyBytes_New.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    _BYTES_DATA_OFFSET = bytes.__basicsize__ - 1  # PyBytesObject.ob_sval
except (ImportError, AttributeError):  # pragma: no cover
    _PyBytes_New = None
    _BYTES_DATA_OFFSET = 0


def _pool_limit() -> int:
    try:
        return int(os.environ.get("MONARCH_BUFFER_POOL_MB", "256")) << 20
    except ValueError:
        return 256 << 20


_POOL: _BufferPool | None = _BufferPool(_pool_limit()) if _pool_limit() > 0 else None


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


def check_marshal(data: bytes, peer: str, what: str) -> None:
    """Reject marshal data outside the small subset monarch uses, or whose
    announced sizes exceed the bytes present, *before* ``marshal.loads`` can
    allocate for them."""
    n = len(data)
    pos = 0
    stack = [1]  # items still expected at each nesting level
    nrefs = 0
    while stack:
        top = stack[-1]
        if top == 0:
            stack.pop()
            continue
        if top == -1:  # inside a dict: key/value pairs until the NULL code
            if pos >= n:
                raise ProtocolError(f"peer {peer} sent a malformed {what} (truncated)")
            if data[pos] & 0x7F == _M_NULL:
                pos += 1
                stack.pop()
            else:
                stack.append(2)
            continue
        stack[-1] -= 1
        if pos >= n:
            raise ProtocolError(f"peer {peer} sent a malformed {what} (truncated)")
        code = data[pos]
        flag = code & 0x80
        code &= 0x7F
        pos += 1
        if flag:
            nrefs += 1
        if code in _M_FIXED:
            pos += _M_FIXED[code]
        elif code in _M_SIZED1:
            if pos >= n:
                raise ProtocolError(f"peer {peer} sent a malformed {what} (truncated)")
            pos += 1 + data[pos]
        elif code in _M_SIZED4 or code == _M_LONG:
            if pos + 4 > n:
                raise ProtocolError(f"peer {peer} sent a malformed {what} (truncated)")
            size = struct.unpack_from("<i", data, pos)[0]
            width = 1
            if code == _M_LONG:
                size, width = abs(size), 2
            if size < 0 or pos + 4 + size * width > n:
                raise ProtocolError(f"peer {peer} sent a malformed {what} (bad length {size})")
            pos += 4 + size * width
        elif code in _M_SEQ1:
            if pos >= n:
                raise ProtocolError(f"peer {peer} sent a malformed {what} (truncated)")
            stack.append(data[pos])
            pos += 1
        elif code in _M_SEQ4:
            if pos + 4 > n:
                raise ProtocolError(f"peer {peer} sent a malformed {what} (truncated)")
            count = struct.unpack_from("<i", data, pos)[0]
            if count < 0 or count > n - pos:
                raise ProtocolError(f"peer {peer} sent a malformed {what} (sequence of {count} items)")
            stack.append(count)
            pos += 4
        elif code == _M_DICT:
            stack.append(-1)
        elif code == _M_REF:
            if pos + 4 > n:
                raise ProtocolError(f"peer {peer} sent a malformed {what} (truncated)")
            idx = struct.unpack_from("<i", data, pos)[0]
            if idx < 0 or idx >= nrefs:
                raise ProtocolError(f"peer {peer} sent a malformed {what} (bad reference)")
            pos += 4
        else:
            raise ProtocolError(f"peer {peer} sent a malformed {what} (unsupported type code {code!r})")
        if pos > n:
            raise ProtocolError(f"peer {peer} sent a malformed {what} (truncated)")


async def read_handshake(reader: "FrameReader") -> dict[str, Any]:
    raw = await reader.read_exactly(_HS.size)
    magic, version, n = _HS.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(
            f"peer {reader.peer} is not speaking the monarch protocol (first bytes {bytes(raw[:8])!r}); "
            "is something else listening on this address, or a TLS port dialled without TLS?"
        )
    if version != VERSION:
        raise ProtocolError(
            f"peer {reader.peer} speaks monarch wire version {version}, this process speaks {VERSION}; "
            "install the same monarch-core version on every host"
        )
    if n > MAX_HANDSHAKE:
        raise ProtocolError(f"peer {reader.peer} sent a {n}-byte handshake (limit {MAX_HANDSHAKE})")
    body = await reader.read_exactly(n)
    check_marshal(body, reader.peer, "handshake")
    try:
        info = marshal.loads(body)
    except (ValueError, EOFError, TypeError, MemoryError) as e:
        raise ProtocolError(f"peer {reader.peer} sent a malformed handshake: {e}") from None
    if not isinstance(info, dict):
        raise ProtocolError(f"peer {reader.peer} sent a malformed handshake (not a mapping)")
    return info


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


class FrameReader:
    """Reads handshakes and messages from a :class:`Stream`, with limits."""

    __slots__ = ("stream", "peer", "_buf", "_pos")

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.peer = getattr(stream, "peer", "?")
        self._buf = bytearray()
        self._pos = 0

    def buffered(self) -> int:
        return len(self._buf) - self._pos

    async def _fill(self, need: int) -> None:
        while len(self._buf) - self._pos < need:
            if self._pos:
                del self._buf[: self._pos]
                self._pos = 0
            chunk = await self.stream.receive_some(max(65536, need - len(self._buf)))
            if not chunk:
                raise ConnectionClosed(f"connection from {self.peer} closed")
            self._buf += chunk

    async def read_exactly(self, n: int) -> bytes:
        await self._fill(n)
        p = self._pos
        out = bytes(self._buf[p : p + n])
        self._pos = p + n
        return out

    async def _read_big(self, n: int) -> Any:
        # Allocate up front (so the bytes land in place, no copy) only up to
        # _EAGER; beyond that grow as data actually arrives, so a peer cannot
        # make us allocate gigabytes by announcing them.  Up front, the memory
        # is not zero-filled first (a writable view of a fresh ``bytes``): the
        # received data is its first write.
        if _POOL is not None and POOL_MIN <= n <= _EAGER:
            mv = _POOL.take(n)
            await self._read_into(mv)
            return mv
        if n <= _EAGER:
            made = _new_bytes_writable(n)
            if made is not None:
                await self._read_into(made[1])
                return made[1]
        size = n if n <= _EAGER else _EAGER
        out = bytearray(size)
        have = min(n, len(self._buf) - self._pos)
        if have:
            out[:have] = self._buf[self._pos : self._pos + have]
            self._pos += have
        recv_into = self.stream.receive_into
        while have < n:
            if have == len(out):
                out.extend(bytes(min(n - len(out), len(out))))
            with memoryview(out) as mv:
                got = await recv_into(mv[have:])
            if not got:
                raise ConnectionClosed(f"connection from {self.peer} closed mid-message")
            have += got
        return out

    async def _read_bytes(self, n: int) -> bytes:
        """Read ``n`` bytes into a new ``bytes`` object (in place when small
        enough to allocate up front)."""
        if n < _BIG or n > _EAGER:
            if n < _BIG:
                return await self.read_exactly(n)
            return bytes(await self._read_big(n))
        made = _new_bytes_writable(n)
        if made is None:  # pragma: no cover
            return bytes(await self._read_big(n))
        out, mv = made
        with mv:
            await self._read_into(mv)
        return out

    async def _read_into(self, mv: memoryview) -> None:
        """Fill ``mv`` (allocated up front): first from the read buffer, then
        straight from the stream."""
        n = len(mv)
        have = min(n, len(self._buf) - self._pos)
        if have:
            mv[:have] = self._buf[self._pos : self._pos + have]
            self._pos += have
        recv_into = self.stream.receive_into
        while have < n:
            got = await recv_into(mv[have:])
            if not got:
                raise ConnectionClosed(f"connection from {self.peer} closed mid-message")
            have += got

    async def read_message(self) -> tuple[int, int, int, bytes, Any, list]:
        """Return ``(kind, flags, seq, header, payload, buffers)``."""
        await self._fill(FIXED_SIZE)
        kind, flags, nbufs, hlen, plen, seq = FIXED.unpack_from(self._buf, self._pos)
        if not 1 <= kind <= K_BYE:
            raise ProtocolError(f"peer {self.peer} sent a frame of unknown kind {kind}")
        if nbufs > MAX_BUFS or hlen > MAX_HEADER or plen > MAX_MESSAGE:
            raise ProtocolError(
                f"peer {self.peer} sent an oversized frame (header {hlen} B, payload {plen} B, "
                f"{nbufs} buffers; limits {MAX_HEADER} B, {MAX_MESSAGE} B, {MAX_BUFS})"
            )
        self._pos += FIXED_SIZE
        lens: tuple[int, ...] = ()
        if nbufs:
            raw = await self.read_exactly(8 * nbufs)
            lens = struct.unpack(f"<{nbufs}Q", raw)
            kinds = [n & BYTES_BIT for n in lens]
            lens = tuple(n & ~BYTES_BIT for n in lens)
            if sum(lens) + plen > MAX_MESSAGE:
                raise ProtocolError(
                    f"peer {self.peer} announced a {sum(lens) + plen}-byte message (limit {MAX_MESSAGE}); "
                    "raise MONARCH_MAX_MESSAGE_BYTES if this is intended"
                )
        header = await self.read_exactly(hlen) if hlen else b""
        if plen >= _BIG:
            payload: Any = await self._read_big(plen)
        else:
            payload = await self.read_exactly(plen) if plen else b""
        bufs = []
        for i, n in enumerate(lens):
            if kinds[i]:
                bufs.append(await self._read_bytes(n))
            else:
                bufs.append(await self._read_big(n) if n >= _BIG else bytearray(await self.read_exactly(n)))
        return kind, flags, seq, header, payload, bufs


_PORT_H = struct.Struct("<qqB")  # port id, rank, status
_ACTOR_P = struct.Struct("<qqq")  # reply port id (-1: none), rank, return port id (-1: none)
_ACTOR_CACHE: dict[bytes, tuple] = {}
_ACTOR_CACHE_MAX = 4096


def port_header(port_id: int, rank: int, status: int) -> bytes:
    """Packed header of a port message (send with ``flags=F_PACKED``)."""
    return _PORT_H.pack(port_id, rank, status)


def actor_header(key: str, method: str, reply: tuple | None, rank: int, labels: tuple, sizes: tuple,
                 sender: str, ret: tuple | None, explicit: bool) -> bytes:
    """Packed header of an actor message (send with ``flags=F_PACKED``).

    The fields that change from call to call (port ids, rank) are a fixed
    struct; the rest is marshal, identical across calls from one sender to one
    endpoint, so the receiver validates and decodes it once and then reuses it.
    """
    rest = marshal.dumps((
        key, method, reply[0] if reply else None, reply[1] if reply else None, labels, sizes, sender,
        ret[0] if ret else None, ret[1] if ret else None, bool(explicit),
    ))
    return _ACTOR_P.pack(reply[2] if reply else -1, rank, ret[2] if ret else -1) + rest


def decode_packed(peer: str, kind: int, header: bytes) -> tuple:
    """Decode a packed header into the same tuple ``decode_header`` gives for
    the marshal form.  Malformed input raises :class:`ProtocolError`."""
    if kind == K_PORT:
        if len(header) != _PORT_H.size:
            raise ProtocolError(f"peer {peer} sent a malformed port message header ({len(header)} bytes)")
        return _PORT_H.unpack(header)
    if kind != K_ACTOR or len(header) < _ACTOR_P.size:
        raise ProtocolError(f"peer {peer} sent a malformed packed header (kind {kind}, {len(header)} bytes)")
    reply_port, rank, ret_port = _ACTOR_P.unpack_from(header)
    rest = header[_ACTOR_P.size:]
    f = _ACTOR_CACHE.get(rest)
    if f is None:
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
        _ACTOR_CACHE[rest] = f
    key, method, rproc, raddr, labels, sizes, sender, tproc, taddr, explicit = f
    reply = (rproc, raddr, reply_port) if reply_port >= 0 and rproc is not None else None
    ret = (tproc, taddr, ret_port) if ret_port >= 0 and tproc is not None else None
    return (key, method, reply, rank, labels, sizes, sender, ret, explicit)


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
