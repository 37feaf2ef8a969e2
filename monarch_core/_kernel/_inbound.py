"""Inbound sessions over plain sockets, read off the trio loop.

The trio loop is a fine place to *manage* connections but a costly place to
*read* them: every message it reads costs a pass through trio's scheduler
before the loop thread gives the GIL back, and the thread that consumes the
message (an actor's thread, a caller blocked in ``Future.get``) waits for it.
On a two-core machine that was ~80 µs per hop, twice per call.

So once an inbound session over a plain socket has shaken hands, the kernel's
*poller* thread reads it: one ``epoll`` over every such session (a reply from
each of 64 procs wakes one thread, not 64), small messages parsed straight
from the receive buffer and routed, cumulative acknowledgements sent from
here too (the socket's only writer, never blocking).  A message with large
or out-of-band parts is read in place, straight into its destination
buffers, by the same :class:`~monarch_core._kernel._wire.FrameReader`
coroutine the trio path uses, driven by the poller: when the socket has no
more bytes the coroutine is suspended, and the next readable event resumes
it, while the poller serves the other sessions.  Every limit of the wire
format is enforced by the same code either way.  TLS and third-party streams
keep the trio path.

The trio task that owns a connection waits until the session ends; when it
is cancelled (kernel shutdown) it shuts the socket down, which ends the
session, and only then lets the connection be closed (no descriptor reuse).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from monarch_core._kernel import _wire as W
from monarch_core.errors import AuthenticationError, ConnectionClosed, ProtocolError

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.kernel")

#: Acknowledge at once when this many delivered messages are unacknowledged
#: and the read buffer is drained; otherwise after ``ACK_DELAY`` seconds idle.
ACK_EVERY = 256
ACK_DELAY = 0.005

_EPOLLIN = select.EPOLLIN | select.EPOLLRDHUP


class _Acks:
    """Acknowledgement state of one inbound session, and its ack writes."""

    __slots__ = ("sock", "peer", "last", "acked", "_partial")

    def __init__(self, sock: socket.socket, peer: str, last: int) -> None:
        self.sock = sock
        self.peer = peer
        self.last = last  # last sequence number delivered
        self.acked = last  # last one acknowledged to the sender
        self._partial: memoryview | None = None  # the unsent tail of an ack frame

    def send_ack(self) -> None:
        """Acknowledge everything delivered, if the socket takes it now (the
        poller's only write, never blocking it: a full socket means the peer
        is not reading, and a later ack covers this one)."""
        sock = self.sock
        try:
            if self._partial is not None:  # a frame must be finished before another starts
                n = sock.send(self._partial)
                self._partial = self._partial[n:] if n < len(self._partial) else None
                if self._partial is not None:
                    return
            last = self.last
            data = W.FIXED.pack(W.K_ACK, 0, 0, 0, 0, last)
            n = sock.send(data)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            raise ConnectionClosed(f"connection from {self.peer} broke: {e.strerror or e}") from None
        if n < len(data):
            self._partial = memoryview(data)[n:]
        self.acked = last


class _Suspend:
    """Awaited by a reader coroutine that has to wait for more bytes: the
    coroutine yields to whoever drives it (the poller), which resumes it when
    the socket is readable again."""

    def __await__(self) -> Any:
        yield


_SUSPEND = _Suspend()


class _NonBlockingSource:
    """``receive_some``/``receive_into`` that suspend the calling coroutine
    instead of blocking."""

    __slots__ = ("sock", "peer")

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer

    def _closed(self, e: BaseException) -> ConnectionClosed:
        return ConnectionClosed(f"connection from {self.peer} broke: {getattr(e, 'strerror', None) or e}")

    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        while True:
            try:
                return self.sock.recv(max_bytes)
            except (BlockingIOError, InterruptedError):
                await _SUSPEND
            except OSError as e:
                raise self._closed(e) from None

    async def receive_into(self, buffer: memoryview) -> int:
        while True:
            try:
                return self.sock.recv_into(buffer)
            except (BlockingIOError, InterruptedError):
                await _SUSPEND
            except OSError as e:
                raise self._closed(e) from None


class InboundSession:
    """One inbound plain-socket session, served by the kernel's :class:`Poller`."""

    def __init__(
        self,
        kernel: Kernel,
        sock: socket.socket,
        reader: W.FrameReader,
        session: str,
        sender: str,
        last: int,
        done: Any,
    ) -> None:
        self.kernel = kernel
        self.sock = sock
        self.fd = sock.fileno()
        self.reader = reader
        self.session = session
        self.sender = sender
        self.acks = _Acks(sock, reader.peer, last)
        reader.stream = _NonBlockingSource(sock, reader.peer)  # type: ignore[assignment]
        self._large: Any = None  # the suspended read of a large message, if one is under way
        self.error: BaseException | None = None
        self.bye = False
        self.ack_due = 0.0  # monotonic deadline of a delayed acknowledgement (0: none)
        self._done = done  # a trio.Event, set on the loop when the session ends
        self._ended = False

    def start(self) -> None:
        """Deliver what arrived with the handshake (the poller only sees bytes
        still in the socket), acknowledge it, then join the poller."""
        if self.reader.buffered():
            if not self._deliver_buffered(None):
                return
            src = self.acks
            if src.last > src.acked:  # the poller times only acknowledgements of what it read
                try:
                    src.send_ack()
                except ConnectionClosed:
                    pass  # the next read sees it
        self.kernel.inbound_poller().add(self)

    def stop(self) -> None:
        """End the session soon (any thread): its next read fails."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def end(self, error: BaseException | None) -> None:
        """The session is over (its reader's thread): tell the loop."""
        if self._ended:
            return
        self._ended = True
        self.error = error
        try:
            self.kernel.call_soon(self._done.set)
        except RuntimeError:  # the loop is gone: nobody waits any more
            pass

    # ------------------------------------------------------------ reading
    def on_readable(self, poller: Poller) -> bool:
        """Read what is there and deliver every complete message (poller
        thread).  False: the session ended (and left the poller)."""
        if self._large is not None:
            return self._step_large(poller)
        try:
            chunk = self.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as e:
            poller.remove(self)
            self.end(ConnectionClosed(f"connection from {self.reader.peer} broke: {e.strerror or e}"))
            return False
        if not chunk:
            poller.remove(self)
            self.end(ConnectionClosed(f"connection from {self.reader.peer} closed"))
            return False
        reader = self.reader
        if reader._pos and reader._pos == len(reader._buf):
            reader._buf = bytearray(chunk)
            reader._pos = 0
        else:
            reader._buf += chunk
        return self._deliver_buffered(poller)

    def _deliver_buffered(self, poller: Poller | None) -> bool:
        """Deliver the complete messages in the buffer.  A large one (or one
        with out-of-band parts) is read in place, as far as the socket has
        its bytes, by a suspended :class:`FrameReader` coroutine that later
        readable events resume.  ``poller`` is None before the session joins
        the poller."""
        reader = self.reader
        acks = self.acks
        buf = reader._buf
        pos = reader._pos
        fixed = W.FIXED_SIZE
        unpack_fixed = W.FIXED.unpack_from
        big, max_header, k_bye = W._BIG, W.MAX_HEADER, W.K_BYE
        try:
            while len(buf) - pos >= fixed:
                kind, flags, nbufs, hlen, plen, seq = unpack_fixed(buf, pos)
                if not (nbufs == 0 and plen < big and hlen <= max_header and 1 <= kind <= k_bye):
                    reader._pos = pos
                    self._large = reader.read_message()
                    return self._step_large(poller)
                end = pos + fixed + hlen + plen
                if len(buf) < end:
                    break
                mid = pos + fixed + hlen
                header = bytes(buf[pos + fixed : mid])
                payload = bytes(buf[mid:end])
                pos = end
                reader._pos = pos
                if self._deliver(kind, flags, seq, header, payload, []):
                    if poller is not None:
                        poller.remove(self)
                    self.end(None)
                    return False
        except BaseException as e:
            if poller is not None:
                poller.remove(self)
            self._failed(e)
            return False
        if pos:
            del buf[:pos]
            reader._pos = 0
        if acks.last > acks.acked:
            if acks.last - acks.acked >= ACK_EVERY:
                try:
                    acks.send_ack()
                except ConnectionClosed:
                    pass  # the next read sees it
            if acks.last > acks.acked and poller is not None and not self.ack_due:
                self.ack_due = time.monotonic() + ACK_DELAY
                poller.ack_later(self)
        return True

    def _deliver(self, kind: int, flags: int, seq: int, header: bytes, payload: Any, buffers: list) -> bool:
        """Route one message; True at the end of the session (BYE)."""
        acks = self.acks
        if kind == W.K_BYE:
            self.kernel._inbound_last.pop(self.session, None)
            self.bye = True
            return True
        last = acks.last
        if seq <= last:
            return False  # a retransmission we already delivered
        if seq != last + 1:
            raise ProtocolError(f"peer {self.reader.peer} skipped from seq {last} to {seq}")
        self.kernel._inbound_last[self.session] = seq
        acks.last = seq
        self.kernel.route(kind, flags, header, payload, buffers, self.sender)
        return False

    def _failed(self, e: BaseException) -> None:
        if not isinstance(e, (ProtocolError, AuthenticationError, ConnectionClosed)):
            logger.error("inbound session from %s failed", self.sender, exc_info=e)
        self.end(e)

    def _step_large(self, poller: Poller | None) -> bool:
        """Resume the read of a large message; deliver it once complete and
        go on with what is buffered behind it."""
        try:
            self._large.send(None)
        except StopIteration as done:
            self._large = None
            kind, flags, seq, header, payload, buffers = done.value
            try:
                bye = self._deliver(kind, flags, seq, header, payload, buffers)
            except BaseException as e:
                if poller is not None:
                    poller.remove(self)
                self._failed(e)
                return False
            if bye:
                if poller is not None:
                    poller.remove(self)
                self.end(None)
                return False
            return self._deliver_buffered(poller)
        except BaseException as e:
            self._large = None
            if poller is not None:
                poller.remove(self)
            self._failed(e)
            return False
        return True  # waiting for more bytes


class Poller:
    """The thread that reads every plain-socket inbound session of a kernel."""

    def __init__(self) -> None:
        self._ep = select.epoll()
        self._sessions: dict[int, InboundSession] = {}
        self._acks: list[InboundSession] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._ep.register(self._wake_r, select.EPOLLIN)
        self._closed = False
        self._thread = threading.Thread(target=self._main, name="monarch-inbound", daemon=True)
        self._thread.start()


    def add(self, s: InboundSession) -> None:
        """Serve ``s`` (any thread)."""
        self._sessions[s.fd] = s
        try:
            self._ep.register(s.fd, _EPOLLIN)
        except (OSError, ValueError) as e:  # the socket is already gone
            self._sessions.pop(s.fd, None)
            s.end(ConnectionClosed(f"connection from {s.reader.peer} broke: {e}"))

    def remove(self, s: InboundSession) -> None:
        """Stop serving ``s`` (poller thread, or the thread that owns it)."""
        if self._sessions.get(s.fd) is s:
            del self._sessions[s.fd]
            try:
                self._ep.unregister(s.fd)
            except (OSError, ValueError):
                pass

    def ack_later(self, s: InboundSession) -> None:
        self._acks.append(s)

    def close(self) -> None:
        """End the thread (any thread); sessions still registered end too."""
        self._closed = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _main(self) -> None:
        ep = self._ep
        sessions = self._sessions
        wake = self._wake_r
        try:
            while not self._closed:
                timeout = -1.0
                if self._acks:
                    timeout = max(0.0, min(s.ack_due for s in self._acks) - time.monotonic())
                try:
                    events = ep.poll(timeout)
                except InterruptedError:  # pragma: no cover
                    continue
                for fd, _ev in events:
                    if fd == wake:
                        continue
                    s = sessions.get(fd)
                    if s is not None:
                        s.on_readable(self)
                if self._acks:
                    self._send_due_acks()
        finally:
            for s in list(sessions.values()):
                self.remove(s)
                s.end(ConnectionClosed("the kernel is shutting down"))
            ep.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _send_due_acks(self) -> None:
        now = time.monotonic()
        keep = []
        for s in self._acks:
            if s.ack_due > now:
                keep.append(s)
                continue
            s.ack_due = 0.0
            src = s.acks
            if src.last > src.acked and self._sessions.get(s.fd) is s:
                try:
                    src.send_ack()
                except ConnectionClosed:
                    continue  # the next read sees it
                if src.last > src.acked:  # the socket was full: try again later
                    s.ack_due = now + ACK_DELAY
                    keep.append(s)
        self._acks = keep
