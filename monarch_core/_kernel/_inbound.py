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
here too (the socket's only writer).  A message with large or out-of-band
parts is read by a short-lived thread of its own with the blocking
:class:`~monarch_core._kernel._wire.FrameReader` path, in place, while the
poller serves the other sessions; then the session returns to the poller.
Every limit of the wire format is enforced by the same code either way.  TLS
and third-party streams keep the trio path.

The trio task that owns a connection waits until the session ends; when it
is cancelled (kernel shutdown) it shuts the socket down, which ends the
session, and only then lets the connection be closed (no descriptor reuse).
"""

from __future__ import annotations

import logging
import os
import queue
import select
import socket
import threading
import time
from collections.abc import Coroutine
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

_POLLIN = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_EPOLLIN = select.EPOLLIN | select.EPOLLRDHUP


def drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (its awaits all block instead)."""
    try:
        coro.send(None)
    except StopIteration as e:
        return e.value
    coro.close()
    raise RuntimeError("a blocking reader suspended")  # pragma: no cover - a bug


class _BlockingSource:
    """The ``receive_some``/``receive_into`` half of a stream, blocking on a
    non-blocking socket with ``poll``; sends delayed acknowledgements while
    it would otherwise sit idle."""

    __slots__ = ("sock", "peer", "poller", "last", "acked", "_ack_ms")

    def __init__(self, sock: socket.socket, peer: str, last: int) -> None:
        self.sock = sock
        self.peer = peer
        self.poller = select.poll()
        self.poller.register(sock.fileno(), _POLLIN)
        self.last = last
        self.acked = last
        self._ack_ms = max(1, int(ACK_DELAY * 1000))

    def _closed(self, e: BaseException | None = None) -> ConnectionClosed:
        if e is None:
            return ConnectionClosed(f"connection from {self.peer} closed")
        return ConnectionClosed(f"connection from {self.peer} broke: {getattr(e, 'strerror', None) or e}")

    def wait_readable(self) -> None:
        poll = self.poller.poll
        while True:
            if self.last > self.acked:
                if poll(self._ack_ms):
                    return
                self.send_ack()
            else:
                poll()
                return

    def send_ack(self) -> None:
        last = self.last
        data = memoryview(W.FIXED.pack(W.K_ACK, 0, 0, 0, 0, last))
        sock = self.sock
        while data:
            try:
                n = sock.send(data)
            except (BlockingIOError, InterruptedError):
                select.select([], [sock], [], 1.0)
                continue
            except OSError as e:
                raise self._closed(e) from None
            data = data[n:]
        self.acked = last

    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        return self.recv(max_bytes)

    def recv(self, max_bytes: int) -> bytes:
        sock = self.sock
        while True:
            try:
                data = sock.recv(max_bytes)
            except (BlockingIOError, InterruptedError):
                self.wait_readable()
                continue
            except OSError as e:
                raise self._closed(e) from None
            return data

    async def receive_into(self, buffer: memoryview) -> int:
        sock = self.sock
        while True:
            try:
                return sock.recv_into(buffer)
            except (BlockingIOError, InterruptedError):
                self.wait_readable()
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
        self.source = _BlockingSource(sock, reader.peer, last)
        reader.stream = self.source  # type: ignore[assignment]
        self.error: BaseException | None = None
        self.bye = False
        self.ack_due = 0.0  # monotonic deadline of a delayed acknowledgement (0: none)
        self._done = done  # a trio.Event, set on the loop when the session ends
        self._ended = False

    def start(self) -> None:
        """Deliver what arrived with the handshake, then join the poller."""
        if self.reader.buffered():
            self._resume()
        else:
            self.kernel.inbound_poller().add(self)

    def _resume(self) -> None:
        """Deliver the messages already buffered, acknowledge them, and return
        to the poller (which only sees bytes still in the socket)."""
        if not self._deliver_buffered(None):
            return
        src = self.source
        if src.last > src.acked:  # the poller only times acknowledgements of what it read itself
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
        thread).  False: the session left the poller (ended, or handed to a
        thread for a large message)."""
        try:
            chunk = self.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as e:
            poller.remove(self)
            self.end(self.source._closed(e))
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
        """Deliver the complete small messages in the buffer; hand the session
        to a thread at the first large one.  ``poller`` is None when called
        from such a thread (the session is not registered then)."""
        reader = self.reader
        source = self.source
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
                    if poller is not None:
                        poller.remove(self)
                    self.kernel.inbound_poller().run_large(self._read_large)
                    return False
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
        if source.last > source.acked:
            if source.last - source.acked >= ACK_EVERY:
                try:
                    source.send_ack()
                except ConnectionClosed:
                    pass  # the next read sees it
            elif poller is not None and not self.ack_due:
                self.ack_due = time.monotonic() + ACK_DELAY
                poller.ack_later(self)
        return True

    def _deliver(self, kind: int, flags: int, seq: int, header: bytes, payload: Any, buffers: list) -> bool:
        """Route one message; True at the end of the session (BYE)."""
        source = self.source
        if kind == W.K_BYE:
            self.kernel._inbound_last.pop(self.session, None)
            self.bye = True
            return True
        last = source.last
        if seq <= last:
            return False  # a retransmission we already delivered
        if seq != last + 1:
            raise ProtocolError(f"peer {self.reader.peer} skipped from seq {last} to {seq}")
        self.kernel._inbound_last[self.session] = seq
        source.last = seq
        self.kernel.route(kind, flags, header, payload, buffers, self.sender)
        return False

    def _failed(self, e: BaseException) -> None:
        if not isinstance(e, (ProtocolError, AuthenticationError, ConnectionClosed)):
            logger.error("inbound session from %s failed", self.sender, exc_info=e)
        self.end(e)

    def _read_large(self) -> None:
        """Read one large message in place (blocking, this thread only), then
        the small ones buffered behind it, then return to the poller."""
        try:
            kind, flags, seq, header, payload, buffers = drive(self.reader.read_message())
            if self._deliver(kind, flags, seq, header, payload, buffers):
                self.end(None)
                return
        except BaseException as e:
            self._failed(e)
            return
        self._resume()


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
        # threads that read large messages, kept for the next one (starting a
        # thread costs more than a 1 MiB message takes to arrive)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle_readers = 0
        self._pool_lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="monarch-inbound", daemon=True)
        self._thread.start()

    def run_large(self, fn: Any) -> None:
        """Run ``fn`` (reading one session's large message) on a reader thread
        of the pool, starting one if none is idle (any thread)."""
        with self._pool_lock:
            if self._idle_readers:
                self._idle_readers -= 1
                self._jobs.put(fn)
                return
        threading.Thread(target=self._reader, args=(fn,), name="monarch-in-large", daemon=True).start()

    def _reader(self, fn: Any) -> None:
        while fn is not None:
            fn()
            with self._pool_lock:
                self._idle_readers += 1
            fn = self._jobs.get()

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
        with self._pool_lock:
            idle, self._idle_readers = self._idle_readers, 0
        for _ in range(idle):
            self._jobs.put(None)
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
            src = s.source
            if src.last > src.acked and self._sessions.get(s.fd) is s:
                try:
                    src.send_ack()
                except ConnectionClosed:
                    pass  # the next read sees it
        self._acks = keep
