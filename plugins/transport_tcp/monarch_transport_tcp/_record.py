"""TLS on the kernel's fast path: a TLS connection with the interface of a
non-blocking socket, safe to use from several threads.

The kernel reads plain-socket sessions on its poller thread and writes small
messages straight from the caller's thread (``Stream.raw_socket``).  A TLS
connection can take the same path when its record layer is a plain
:class:`ssl.SSLObject` over memory BIOs that the kernel's threads drive
themselves: :class:`TlsSocket` holds one, the connected non-blocking stdlib
socket under it, and one lock that every use of the SSL object takes (OpenSSL
allows one thread at a time per connection).

Socket semantics, with two additions the kernel asks for
(``hookspecs.Stream.raw_socket``):

* ``recv``/``recv_into`` return plaintext; ``BlockingIOError`` when none can
  be had without waiting; ``0``/``b""`` at the end of the connection.
  :meth:`TlsSocket.pending` is true when a read stopped because the caller's
  buffer was full: more plaintext may be ready although the socket itself is
  not readable any more (already received and decrypted), so the reader must
  read again before it waits on the descriptor.
* ``send``/``sendmsg`` encrypt and write; they return how much plaintext
  they took.  Encrypted bytes the socket did not take yet stay queued
  (at most one chunk of records) and go out first at the next write;
  :meth:`TlsSocket.pending_output` says how many, so that whoever wrote
  last makes sure they are flushed (the stream's ``send_all`` waits for
  that).

:class:`TlsSocket` also does the handshake (:meth:`TlsSocket.handshake`, on
the trio loop) and serves the trio side of the stream
(:meth:`receive_into`, :meth:`send_all`): a connection is driven by one
implementation whichever thread uses it.
"""

from __future__ import annotations

import socket
import ssl
import threading
from typing import Any

import trio

#: Plaintext encrypted per ``SSLObject.write`` (four full records).
_CHUNK = 4 * 16384
#: Bytes asked of the socket per read.
_RECV = 262144


def _bytes_view(obj: Any) -> memoryview:
    """``obj`` as a flat memoryview of bytes."""
    mv = memoryview(obj)
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


class TlsSocket:
    """A TLS connection over ``sock`` (a connected stdlib socket, made
    non-blocking here); see the module docstring."""

    __slots__ = ("_sock", "_ssl", "_in", "_out", "_lock", "_backlog", "_more", "_fd")

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext, *, server_side: bool,
                 server_hostname: str | None = None) -> None:
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._fd = sock.fileno()
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._ssl = ctx.wrap_bio(self._in, self._out, server_side=server_side, server_hostname=server_hostname)
        self._lock = threading.Lock()
        self._backlog = bytearray()  # encrypted bytes taken from a writer, not yet on the wire
        self._more = False  # the last read stopped with the caller's buffer full

    # ------------------------------------------------------------ the socket's interface
    def fileno(self) -> int:
        return self._fd

    def getsockopt(self, *args: Any) -> Any:
        return self._sock.getsockopt(*args)

    def setsockopt(self, *args: Any) -> None:
        self._sock.setsockopt(*args)

    def shutdown(self, how: int) -> None:
        self._sock.shutdown(how)

    def pending(self) -> bool:
        """More plaintext may be ready without the socket being readable."""
        return self._more

    def pending_output(self) -> int:
        """Encrypted bytes accepted from a writer and not yet sent."""
        return len(self._backlog)

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        mv = _bytes_view(buffer)
        with self._lock:
            return self._read(nbytes or len(mv), mv)[0]

    def recv(self, bufsize: int) -> bytes:
        """Up to ``bufsize`` bytes of plaintext, as many as are ready (no
        buffer of ``bufsize`` is allocated: a small message costs its size)."""
        with self._lock:
            parts = self._read(bufsize, None)[1]
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read(self, want: int, into: memoryview | None) -> tuple[int, list[bytes]]:
        """Under the lock: up to ``want`` bytes of plaintext, decrypted into
        ``into`` or, without it, as the list of ``bytes`` the records gave;
        the count either way.  Reads the socket only when nothing was had
        yet (``BlockingIOError`` when it has nothing); ``0`` at the end."""
        parts: list[bytes] = []
        got = 0
        ssl_read = self._ssl.read
        self._more = False
        try:
            while got < want:
                try:
                    if into is None:
                        data = ssl_read(want - got)
                        n = len(data)
                        if n:
                            parts.append(data)
                    else:
                        n = ssl_read(want - got, into[got:want])  # type: ignore[assignment]  # (with a buffer, read returns the count; typeshed says bytes)
                except ssl.SSLWantReadError:
                    if got:
                        break
                    raw = self._sock.recv(_RECV)  # BlockingIOError: nothing to be had now
                    if not raw:
                        break  # the peer closed (without close_notify)
                    self._in.write(raw)
                    continue
                except ssl.SSLZeroReturnError:
                    break  # close_notify: the end, after what was read
                if not n:
                    break
                got += n
            else:
                self._more = True
        finally:
            if self._out.pending:  # a post-handshake message (key update, ticket) to answer
                self._backlog += self._out.read()
                self._flush()
        return got, parts

    def send(self, data: Any) -> int:
        mv = _bytes_view(data)
        with self._lock:
            return self._send(mv)

    def sendmsg(self, parts: Any) -> int:
        total = 0
        with self._lock:
            for p in parts:
                mv = _bytes_view(p)
                try:
                    n = self._send(mv)
                except BlockingIOError:
                    if total:
                        return total
                    raise
                total += n
                if n < len(mv) or self._backlog:
                    break
        return total

    def _send(self, mv: memoryview) -> int:
        """Under the lock: flush the backlog, then encrypt and write ``mv``
        chunk by chunk while the socket takes it."""
        if not self._flush():
            raise BlockingIOError("the socket takes nothing now")
        done = 0
        total = len(mv)
        write = self._ssl.write
        while done < total:
            chunk = mv[done : done + _CHUNK]
            write(chunk)
            done += len(chunk)
            self._backlog += self._out.read()
            if not self._flush():
                break
        return done

    def _flush(self) -> bool:
        """Under the lock: send the backlog; True when nothing is left."""
        b = self._backlog
        while b:
            try:
                n = self._sock.send(b)
            except (BlockingIOError, InterruptedError):
                return False
            del b[:n]
        return True

    # ------------------------------------------------------------ the trio side
    async def handshake(self) -> None:
        """The TLS handshake (trio loop); ``ssl.SSLError`` or ``OSError`` on
        failure, ``ssl.SSLEOFError`` when the peer closed meanwhile."""
        while True:
            with self._lock:
                try:
                    self._ssl.do_handshake()
                    done = True
                except ssl.SSLWantReadError:
                    done = False
                finally:
                    self._backlog += self._out.read()
            await self.flush()
            if done:
                return
            await trio.lowlevel.wait_readable(self._sock)
            try:
                data = self._sock.recv(_RECV)
            except (BlockingIOError, InterruptedError):
                continue
            if not data:
                raise ssl.SSLEOFError("the peer closed the connection during the TLS handshake")
            self._in.write(data)

    async def flush(self) -> None:
        """Send the backlog, waiting for the socket as needed (trio loop)."""
        while True:
            with self._lock:
                if self._flush():
                    return
            await trio.lowlevel.wait_writable(self._sock)

    async def send_all(self, data: Any) -> None:
        mv = _bytes_view(data)
        sent = 0
        total = len(mv)
        while sent < total:
            try:
                sent += self.send(mv[sent:])
            except (BlockingIOError, InterruptedError):
                pass
            else:
                if sent == total:
                    break
            await trio.lowlevel.wait_writable(self._sock)
        await self.flush()

    async def receive_into(self, buffer: Any) -> int:
        while True:
            try:
                return self.recv_into(buffer)
            except (BlockingIOError, InterruptedError):
                await trio.lowlevel.wait_readable(self._sock)

    async def receive_some(self, max_bytes: int) -> bytes:
        buf = bytearray(max_bytes)
        n = await self.receive_into(buf)
        del buf[n:]
        return bytes(buf)

    def pending_alert(self) -> bytes:
        """What the SSL object queued after a failed handshake (its alert)."""
        with self._lock:
            return bytes(self._backlog) + self._out.read()

    def close_notify(self) -> None:
        """Queue and try to send the TLS close_notify (best effort, never waits)."""
        with self._lock:
            try:
                self._ssl.unwrap()
            except (ssl.SSLError, OSError, ValueError):
                pass
            self._backlog += self._out.read()
            try:
                self._flush()
            except OSError:  # the peer is gone already
                pass

    def getpeercert(self) -> Any:
        return self._ssl.getpeercert()
