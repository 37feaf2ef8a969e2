"""The wire: reading handshakes and frames off a stream, with limits; and the
format's vocabulary, re-exported from :mod:`._frames`.

The format (handshake, the fixed frame header, routing headers, kinds, flags,
statuses) and its codec are :mod:`._frames`'s.  Every other module names them
through this one (``from monarch_core._kernel import _wire as W``;
``W.K_ACTOR``, ``W.encode_message``, ...), so a constant or codec function is
the same object here and there.

Receiving: every length is checked against limits before anything is
allocated; a violation raises :class:`~monarch_core.errors.ProtocolError` and
the connection is dropped.

A length is only a claim.  Until a peer is *proven* (see
:meth:`FrameReader.proven`: an authenticated stream, or a session that has
delivered a message) its large parts are received into buffers that grow as
the bytes arrive, and what such peers hold in partly received messages is
bounded per connection (``MONARCH_UNPROVEN_CONN_BYTES_MAX``) and per process
(``MONARCH_UNPROVEN_BYTES_MAX``).  A proven peer's parts are allocated (or
taken from the pool) at their announced size, so they land in place.  When a
read fails, the buffers of the message under way are released at once.
"""

from __future__ import annotations

import marshal
import mmap
import os
import socket
import struct
import sys as _sys
import threading
import traceback
import weakref
from typing import TYPE_CHECKING, Any, Callable

from monarch_core import settings
from monarch_core._compat import BaseExceptionGroup
# The format, re-exported (see the docstring); the reader below uses some of these names too.
from monarch_core._kernel._frames import (  # noqa: F401
    _ACTOR_P,
    _COALESCE,
    _HS,
    BYTES_BIT,
    F_ACK_SOON,
    F_PACKED,
    F_TREE,
    FIXED,
    FIXED_SIZE,
    K_ACK,
    K_ACTOR,
    K_BYE,
    K_CONTROL,
    K_PORT,
    MAGIC,
    S_BATCH,
    S_ERROR,
    S_VALUE,
    VERSION,
    actor_header,
    check_marshal,
    coalesce,
    decode_header,
    decode_packed,
    encode_handshake,
    encode_message,
    port_header,
    skip_bytes,
    total_size,
    write_parts,
)
from monarch_core.errors import ConnectionClosed, ProtocolError

if TYPE_CHECKING:
    from monarch_core.hookspecs import Stream

MAX_HEADER = 1 << 20
MAX_HANDSHAKE = 1 << 16
MAX_BUFS = 1 << 14
MAX_MESSAGE: int = settings.get("MONARCH_MAX_MESSAGE_BYTES")
_BIG = 1 << 16  # parts at least this large are read straight into their own buffer
_EAGER = (64 << 20) + 4096  # a proven peer's parts up to this size are allocated before their bytes arrive
POOL_MIN = 1 << 20  # parts at least this large are received into pooled buffers
_ANON = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
_GROW_FROM = 1 << 20  # first size of a buffer that grows as its bytes arrive


#: Bytes one connection whose peer is not yet proven may hold in buffers of a
#: message still arriving (they grow with the bytes received, so at most about
#: twice those); beyond, the connection is dropped.
UNPROVEN_CONN_MAX: int = settings.get("MONARCH_UNPROVEN_CONN_BYTES_MAX")
#: The same for all such connections of this process together.
UNPROVEN_MAX: int = settings.get("MONARCH_UNPROVEN_BYTES_MAX")
_unproven = 0  # bytes held now by readers of unproven peers (all of this process)
_unproven_lock = threading.Lock()
_maps = [0, 0]  # anonymous mappings made here for received parts still alive, and their bytes
_maps_lock = threading.RLock()  # a finalizer may run while it is held (GC)


def _new_map(n: int, flags: int) -> tuple[mmap.mmap, list]:
    """An ``n``-byte anonymous mapping, counted in :func:`receive_stats` while it lives."""
    m = mmap.mmap(-1, n, flags=flags)
    cell = [n]
    with _maps_lock:
        _maps[0] += 1
        _maps[1] += n
    weakref.finalize(m, _map_gone, cell)
    return m, cell


def _map_gone(cell: list) -> None:
    with _maps_lock:
        _maps[0] -= 1
        _maps[1] -= cell[0]


def _resize_map(m: mmap.mmap, cell: list, n: int) -> None:
    m.resize(n)  # mremap: the pages move, nothing is copied
    with _maps_lock:
        _maps[1] += n - cell[0]
        cell[0] = n


def receive_stats() -> dict[str, int]:
    """What the receive path holds now (tests, diagnostics): ``unproven``,
    bytes in buffers of partly received messages from peers not yet proven;
    ``maps`` / ``mapped``, anonymous mappings made for received parts that are
    still alive (in use or kept by the pool) and their bytes; ``pooled``,
    bytes the pool keeps for reuse."""
    with _maps_lock:
        maps, mapped = _maps
    return {"unproven": _unproven, "maps": maps, "mapped": mapped, "pooled": _POOL._kept if _POOL else 0}


def peer_uid(stream: Any) -> int | None:
    """The uid of the process at the other end of ``stream`` when it is a
    Unix-domain socket (``SO_PEERCRED``: the ``ipc`` and ``inproc``
    transports, or a plugin's), else None.  Read once per connection."""
    sock = getattr(stream, "_sock", None)
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        get = getattr(stream, "raw_socket", None)
        sock = get() if get is not None else None
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX or not hasattr(socket, "SO_PEERCRED"):
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError, TypeError):
        return None
    return int(struct.unpack("3i", creds)[1])


def foreign_peer_uid(stream: Any) -> int | None:
    """The uid of ``stream``'s peer if it is a Unix-socket peer running as
    another user than this process (who must not be served: a Unix socket,
    abstract ones above all, has no other permission check); else None."""
    uid = peer_uid(stream)
    return uid if uid is not None and uid != os.getuid() else None


def _authenticated(stream: Any) -> bool:
    """Whether ``stream`` says who its peer is: it declares it (``authenticated``,
    e.g. TLS with client certificates), or it is a Unix socket whose peer runs
    as this user (``SO_PEERCRED``: the ``ipc`` and ``inproc`` transports)."""
    declared = getattr(stream, "authenticated", None)
    if declared is not None:
        return bool(declared)
    return peer_uid(stream) == os.getuid()


def drop_frames(e: BaseException | None, outer: BaseException | None = None) -> None:
    """Release the locals of the finished frames in ``e``'s traceback (and
    those of the members of an exception group): a traceback kept for a log
    message or by a session's error must not keep a partly received buffer
    alive.  ``e``'s context is cut at ``outer`` (the exception the caller was
    handling when the read began), which is neither cleared nor kept.

    Only the tracebacks of ``e`` and its group members are cleared: their
    frames below the handler have all been unwound.  Those of its causes and
    contexts are not, since a frame there may belong to a coroutine that is
    suspended, not finished (clearing it would finalize that coroutine)."""
    seen: set[int] = set()
    todo = [e]
    while todo:
        x = todo.pop()
        if x is None or x is outer or id(x) in seen:
            continue
        seen.add(id(x))
        traceback.clear_frames(x.__traceback__)  # skips the frames still running (the handler's)
        if outer is not None and x.__context__ is outer:
            x.__context__ = None  # nor kept through the chain (the poller's StopIteration holds a message)
        if isinstance(x, BaseExceptionGroup):
            todo += x.exceptions


def _release(x: Any) -> None:
    """Give a received buffer back now (a pooled one returns to the pool)."""
    if isinstance(x, memoryview):
        try:
            x.release()
        except BufferError:  # exported (pragma: no cover - nothing here exports them)
            pass


def _new_bytes_writable(n: int) -> tuple[bytes, memoryview] | None:
    """A fresh, uninitialised ``bytes`` of length ``n`` and a writable view of
    its storage, to receive into before anyone else sees the object (saves
    the copy a bytearray-to-bytes conversion would cost).  None where this
    CPython detail is unavailable."""
    if _PyBytes_New is None:
        return None
    b = _PyBytes_New(None, n)
    arr = (ctypes.c_char * n).from_address(id(b) + _BYTES_DATA_OFFSET)
    arr.owner = b  # type: ignore[attr-defined]  # (a ctypes instance takes any attribute) the view keeps the memory alive
    return b, memoryview(arr).cast("B")


class _BufferPool:
    """Large receive buffers, kept for reuse once their consumer drops them.

    A fresh 64 MiB buffer costs ~16k page faults (~30-45 ms on a VM, several
    times the copy into it); a reused one costs none.  Buffers are anonymous
    mappings handed out as writable views; when the last reference to a view
    goes (the tensor or array built on it is freed), the mapping returns here,
    to be reused for a message of the same size.  At most ``limit`` bytes are
    kept (``MONARCH_BUFFER_POOL_MB``, default 256; 0 disables).  A fresh
    mapping is not populated up front: its pages come as the bytes arrive, so
    a size a peer only announces costs address space, not memory."""

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
            m = _new_map(n, _ANON)[0]
        return self.lend(m, n)

    def lend(self, m: Any, n: int) -> memoryview:
        """A writable view of the ``n``-byte mapping ``m``, which comes back
        here when the view's last user drops it."""
        arr = (ctypes.c_char * n).from_buffer(m)
        weakref.finalize(arr, self._give_back, m, n)
        return memoryview(arr).cast("B")

    def _give_back(self, m: Any, n: int) -> None:
        with self._lock:
            if self._kept + n <= self.limit:
                self._free.setdefault(n, []).append(m)
                self._kept += n
        # else: dropped; the mapping goes when the view's last export does


#: CPython's ``PyBytes_FromStringAndSize(NULL, n)``: a new, uninitialised ``bytes`` (None elsewhere)
_PyBytes_New: Callable[[None, int], bytes] | None
try:
    import ctypes

    if _sys.implementation.name != "cpython":  # pragma: no cover
        raise ImportError
    _new = ctypes.pythonapi.PyBytes_FromStringAndSize
    _new.restype = ctypes.py_object
    _new.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    _PyBytes_New = _new
    _BYTES_DATA_OFFSET = bytes.__basicsize__ - 1  # PyBytesObject.ob_sval
except (ImportError, AttributeError):  # pragma: no cover
    _PyBytes_New = None
    _BYTES_DATA_OFFSET = 0


def _pool_limit() -> int:
    return settings.get("MONARCH_BUFFER_POOL_MB") << 20


_POOL: _BufferPool | None = _BufferPool(_pool_limit()) if _pool_limit() > 0 else None


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


class FrameReader:
    """Reads handshakes and messages from a :class:`Stream`, with limits.

    ``trusted``: whether the peer is proven from the start; by default it is
    when the stream is authenticated (see :func:`_authenticated`), and
    otherwise once :meth:`prove_by`'s session has delivered a message."""

    __slots__ = ("stream", "peer", "_buf", "_pos", "_proven", "_proof", "_trust", "_held")

    def __init__(self, stream: Stream, trusted: bool | None = None) -> None:
        self.stream = stream
        self.peer = getattr(stream, "peer", "?")
        self._buf = bytearray()
        self._pos = 0
        self._proven = _authenticated(stream) if trusted is None else trusted
        self._proof: Callable[[], bool] | None = None
        self._trust = self._proven  # of the message under way
        self._held = 0  # bytes charged to the unproven limits for the message under way

    def prove_by(self, delivered: Callable[[], bool]) -> None:
        """The peer counts as proven once ``delivered()`` is true (its session
        has delivered a message, on this connection or an earlier one)."""
        self._proof = delivered

    @property
    def proven(self) -> bool:
        """Whether the peer has shown it is one of ours: its stream is
        authenticated, or its session has delivered a message (a valid first
        message, or an earlier connection's).  Until then its large parts are
        received into buffers that grow as bytes arrive, within the limits."""
        if not self._proven:
            p = self._proof
            if (p is not None and p()) or getattr(self.stream, "authenticated", None):
                self._proven = True  # (TLS declares it once its handshake is done)
        return self._proven

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

    # ------------------------------------------------------------ unproven peers
    def _charge(self, n: int) -> None:
        """Count ``n`` more bytes of buffers for the message under way against
        the limits on unproven peers; over either, the connection is dropped."""
        global _unproven
        held = self._held + n
        if held > UNPROVEN_CONN_MAX:
            raise ProtocolError(
                f"peer {self.peer} has not delivered a message yet and its message under way needs more than "
                f"{UNPROVEN_CONN_MAX} bytes of buffers (MONARCH_UNPROVEN_CONN_BYTES_MAX); raise it if this "
                "peer is legitimate and its first message is that large"
            )
        with _unproven_lock:
            total = _unproven + n
            if total > UNPROVEN_MAX:
                raise ProtocolError(
                    f"peer {self.peer} has not delivered a message yet and peers like it would hold more than "
                    f"{UNPROVEN_MAX} bytes of buffers in this process (MONARCH_UNPROVEN_BYTES_MAX)"
                )
            _unproven = total
        self._held = held

    def _uncharge(self) -> None:
        global _unproven
        with _unproven_lock:
            _unproven -= self._held
        self._held = 0

    async def _read_growing(self, n: int) -> tuple[mmap.mmap, list]:
        """Receive ``n`` bytes into an anonymous mapping that starts small and
        doubles (``mremap``: no copy) as the bytes arrive; from an unproven
        peer each growth is charged to the limits.  On failure the mapping is
        unmapped at once."""
        have = min(n, len(self._buf) - self._pos)
        size = min(n, max(_GROW_FROM, have))
        charge = not self._trust
        if charge:
            self._charge(size)
        m, cell = _new_map(size, _ANON)
        try:
            if have:
                m[:have] = self._buf[self._pos : self._pos + have]
                self._pos += have
            recv_into = self.stream.receive_into
            while have < n:
                if have == size:
                    new = min(n, 2 * size)
                    if charge:
                        self._charge(new - size)
                    _resize_map(m, cell, new)
                    size = new
                view = memoryview(m)
                part = view[have:size]
                try:
                    got = await recv_into(part)
                finally:
                    part.release()
                    view.release()
                if not got:
                    raise ConnectionClosed(f"connection from {self.peer} closed mid-message")
                have += got
        except BaseException:
            try:
                m.close()
            except BufferError:  # pragma: no cover - a view escaped; the GC unmaps it
                pass
            raise
        return m, cell

    # ------------------------------------------------------------ large parts
    async def _read_big(self, n: int) -> Any:
        # Every part lands in place (no copy) and takes memory as its bytes
        # arrive, whatever was announced.  A proven peer's part up to _EAGER
        # gets a buffer of its size up front (a pooled mapping, or a fresh one
        # whose pages come as the data is written; below POOL_MIN a writable
        # view of a fresh, not zero-filled ``bytes``).  An unproven peer's
        # part, and any part over _EAGER, goes into a mapping that grows as
        # the bytes arrive (_read_growing), so announcing gigabytes reserves
        # nothing.
        if n >= POOL_MIN and (not self._trust or n > _EAGER):
            m, _cell = await self._read_growing(n)
            if _POOL is not None and n <= _EAGER:
                return _POOL.lend(m, n)  # complete: reusable like a pooled one
            return memoryview((ctypes.c_char * n).from_buffer(m)).cast("B")
        if not self._trust:
            self._charge(n)  # under POOL_MIN: allocated up front, charged as such
        if n >= POOL_MIN and _POOL is not None:
            mv = _POOL.take(n)
        else:
            made = _new_bytes_writable(n)
            if made is None:  # pragma: no cover - not CPython
                mv = memoryview(bytearray(n))
            else:
                mv = made[1]
                made = None
        try:
            await self._read_into(mv)
        except BaseException:
            mv.release()  # back to the pool (or freed) now, whoever keeps the traceback
            raise
        return mv

    async def _read_bytes(self, n: int) -> bytes:
        """Read ``n`` bytes into a new ``bytes`` object (in place when it can
        be allocated up front: a proven peer's part up to _EAGER)."""
        if n < _BIG:
            return await self.read_exactly(n)
        if n >= POOL_MIN and (not self._trust or n > _EAGER):
            m, _cell = await self._read_growing(n)
            try:
                return m[:]  # one copy: a ``bytes`` cannot grow
            finally:
                m.close()
        if not self._trust:
            self._charge(n)
        made = _new_bytes_writable(n)
        if made is None:  # pragma: no cover
            return bytes(await self._read_big(n))
        out: bytes | None
        out, mv = made
        made = None
        try:
            await self._read_into(mv)
        except BaseException:
            out = None
            raise
        finally:
            mv.release()
        assert out is not None  # (set to None only on the way out with an exception)
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
            part = mv[have:]
            try:
                got = await recv_into(part)
            finally:
                part.release()  # a traceback through recv_into must not pin the buffer
            if not got:
                raise ConnectionClosed(f"connection from {self.peer} closed mid-message")
            have += got

    async def _read_lengths(self, nbufs: int, plen: int) -> list[int]:
        """Read the ``nbufs`` buffer lengths of a message whose payload is
        ``plen`` bytes; raise ``ProtocolError`` when the whole would exceed
        ``MAX_MESSAGE``.  Each length keeps its ``BYTES_BIT`` (the buffer is
        delivered as ``bytes``) for :meth:`_read_buffers`."""
        lens = struct.unpack(f"<{nbufs}Q", await self.read_exactly(8 * nbufs))
        total = sum(n & ~BYTES_BIT for n in lens) + plen
        if total > MAX_MESSAGE:
            raise ProtocolError(
                f"peer {self.peer} announced a {total}-byte message (limit {MAX_MESSAGE}); "
                "raise MONARCH_MAX_MESSAGE_BYTES if this is intended"
            )
        return list(lens)

    async def _read_buffers(self, lens: list[int], bufs: list) -> None:
        """Read a message's out-of-band buffers, of the lengths ``lens`` (as
        :meth:`_read_lengths` returned them), appending each to ``bufs`` as it
        completes (so that the caller releases what was read when a later
        one fails): ``bytes`` where ``BYTES_BIT`` is set, else a writable
        buffer (a ``bytearray`` when small, else received in place)."""
        for n in lens:
            if n & BYTES_BIT:
                bufs.append(await self._read_bytes(n & ~BYTES_BIT))
            else:
                bufs.append(await self._read_big(n) if n >= _BIG else bytearray(await self.read_exactly(n)))

    async def read_message(self) -> tuple[int, int, int, bytes, Any, list]:
        """Return ``(kind, flags, seq, header, payload, buffers)``.

        If the read fails, what was received of the message is released before
        the exception leaves: neither this frame nor the finished frames of
        its traceback keep any of it."""
        self._trust = self.proven
        outer = _sys.exc_info()[1]  # what the caller was handling: not this read's business
        payload: Any = b""
        bufs: list = []
        x: Any  # (declared: the except clause drops what it refers to)
        try:
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
            lens: list[int] = []
            if nbufs:
                lens = await self._read_lengths(nbufs, plen)
            header = await self.read_exactly(hlen) if hlen else b""
            if plen >= _BIG:
                payload = await self._read_big(plen)
            elif plen:
                payload = await self.read_exactly(plen)
            if lens:
                await self._read_buffers(lens, bufs)
            return kind, flags, seq, header, payload, bufs
        except BaseException as e:
            _release(payload)
            for x in bufs:
                _release(x)
            payload = x = None
            bufs = []
            drop_frames(e, outer)
            outer = None
            raise
        finally:
            if self._held:
                self._uncharge()
