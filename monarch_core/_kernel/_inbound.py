"""Inbound sessions over plain sockets, as the kernel's poller serves them
(``_poller``): the session fence that makes delivery exactly-once across
reconnects (:class:`SessionFence`), cumulative acknowledgements, and one
session's reading and routing (:class:`InboundSession`).  The poller's
design -- why plain sockets are read off the trio loop -- is told in
``_poller``'s docstring.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import TYPE_CHECKING, Any

from monarch_core._kernel import _wire as W
from monarch_core.errors import AuthenticationError, ConnectionClosed, ProtocolError

if TYPE_CHECKING:
    from monarch_core._kernel._upper import InboundKernel

logger = logging.getLogger("monarch.kernel")

#: Acknowledge at once when this many delivered messages are unacknowledged
#: and the read buffer is drained, or when large messages (those with parts
#: read in place) add up to ``ACK_BYTES``; otherwise after ``ACK_DELAY``.  An
#: acknowledgement wakes the sender's loop thread, which then competes for the
#: GIL with the thread doing the work: a request/reply exchange should not pay
#: for one every few calls, and small unacknowledged messages cost the sender
#: little memory.
ACK_EVERY = 256
ACK_DELAY = 0.2
#: Acknowledge at once once large messages delivered since the last
#: acknowledgement add up to this many bytes (the sender keeps a reference
#: to each until it is acknowledged).
ACK_BYTES = 8 << 20



_NO_LOCK = contextlib.nullcontext()


class SessionFence:
    """The receiving side of one session, shared by its successive connections.

    A session (one sender's stream of sequence-numbered messages to this
    proc) outlives its connections: after a break the sender reconnects and
    resends what was not acknowledged.  Exactly-once, in-order delivery needs
    *one* connection delivering at a time.  The broken one may still hold
    frames in its buffers (they were sent, so the sender counts them as
    unacknowledged and sends them again), and its reader may be a thread
    (the poller's) that is busy with them right now.  So each connection
    holds an ``epoch``; every delivery checks it, advances ``last`` and routes
    the message under ``lock``; and a new connection takes the fence
    (:meth:`take`) -- which moves the epoch on and reads ``last`` under that
    same lock -- *before* it tells the sender where to resume.  From then on
    the old connection cannot deliver anything, and the resume point it
    read is final.
    """

    __slots__ = ("lock", "last", "epoch", "_stop", "sender")

    def __init__(self, sender: str = "") -> None:
        self.lock = threading.Lock()
        self.sender = sender  # the proc whose session it is (forgotten when that proc is dead)
        self.last = 0  # the last sequence number delivered
        self.epoch = 0  # the connection that may deliver
        self._stop: Any = None  # ends that connection's reader

    def take(self, stop: Any) -> tuple[int, int]:
        """Fence the connection that delivers now and hand the session to the
        caller (any thread): returns ``(epoch, last)``.  ``stop()`` ends the
        caller's reader when a later connection takes over."""
        with self.lock:
            self.epoch += 1
            old, self._stop = self._stop, stop
            epoch, last = self.epoch, self.last
        if old is not None:
            old()  # free the superseded connection now, not at its next read
        return epoch, last

    def deliver(self, epoch: int, peer: str, route: Any, kind: int, flags: int, seq: int, header: bytes,
                payload: Any, buffers: list, sender: str) -> bool | None:
        """Route one message that the connection holding ``epoch`` read, if it
        is the next one of the session (any reading thread; both read paths).

        True: routed.  False: a retransmission already delivered (dropped).
        None: the sender ended the session (``K_BYE``).  Raises
        :class:`ConnectionClosed` when a newer connection has taken the fence,
        and :class:`ProtocolError` when the peer skipped a sequence number."""
        with self.lock:
            if self.epoch != epoch:
                raise ConnectionClosed(f"connection from {peer} was superseded by a newer one of its session")
            if kind == W.K_BYE:
                return None
            last = self.last
            if seq <= last:
                return False
            if seq != last + 1:
                raise ProtocolError(f"peer {peer} skipped from seq {last} to {seq}")
            self.last = seq
            route(kind, flags, header, payload, buffers, sender)
            return True


class _Acks:
    """Acknowledgement state of one inbound session, and its ack writes."""

    __slots__ = ("sock", "peer", "last", "acked", "nbytes", "_partial")

    def __init__(self, sock: socket.socket, peer: str, last: int) -> None:
        self.sock = sock
        self.peer = peer
        self.last = last  # last sequence number delivered
        self.acked = last  # last one acknowledged to the sender
        self.nbytes = 0  # bytes of large messages delivered since the last acknowledgement
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
        self.nbytes = 0


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
    """One inbound plain-socket session, served by the kernel's poller (``_poller.Poller``; typed ``Any`` here: ``_poller`` imports this module)."""

    def __init__(
        self,
        kernel: InboundKernel,
        sock: socket.socket,
        reader: W.FrameReader,
        session: str,
        sender: str,
        fence: SessionFence,
        epoch: int,
        last: int,
        done: Any,
    ) -> None:
        self.kernel = kernel
        self.fence = fence
        self.epoch = epoch
        self.sock = sock
        self.fd = sock.fileno()
        self.reader = reader
        self.session = session
        self.sender = sender
        self.acks = _Acks(sock, reader.peer, last)
        #: a record layer's "more plaintext is ready" (``Stream.raw_socket``), None for a socket
        self.more = getattr(sock, "pending", None)
        reader.stream = _NonBlockingSource(sock, reader.peer)  # type: ignore[assignment]
        self._large: Any = None  # the suspended read of a large message, if one is under way
        self.error: BaseException | None = None
        self.bye = False
        self.ack_due = 0.0  # monotonic deadline of a delayed acknowledgement (0: none)
        self.eager = kernel.acks_at_once(sender)  # acknowledge as soon as delivered
        self._done = done  # a trio.Event, set on the loop when the session ends
        self._ended = False

    def start(self) -> None:
        """Deliver what arrived with the handshake (the poller only sees bytes
        still in the socket), acknowledge it, then join the poller."""
        if self.reader.buffered():
            if not self._deliver_buffered(None):
                return
        more = self.more
        while more is not None and more():  # (TLS) decrypted already: the socket will not signal it
            if not self.on_readable(None):
                return
        if self.acks.last > self.acks.acked:  # the poller times only acknowledgements of what it read
            self.ack_now(None)
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
    def on_readable(self, poller: Any) -> bool:
        """Read what is there and deliver every complete message (poller
        thread; ``poller`` None: before the session joins it).  False: the
        session ended (and left the poller)."""
        if self._large is not None:
            return self._step_large(poller)
        try:
            chunk = self.sock.recv(262144)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as e:
            return self._leave(poller, ConnectionClosed(f"connection from {self.reader.peer} broke: {e.strerror or e}"))
        if not chunk:
            return self._leave(poller, ConnectionClosed(f"connection from {self.reader.peer} closed"))
        reader = self.reader
        if reader._pos and reader._pos == len(reader._buf):
            reader._buf = bytearray(chunk)
            reader._pos = 0
        else:
            reader._buf += chunk
        return self._deliver_buffered(poller)

    def _deliver_buffered(self, poller: Any) -> bool:
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
                    return self._leave(poller, None)
        except BaseException as e:
            return self._leave(poller, e)
        if pos:
            del buf[:pos]
            reader._pos = 0
        if acks.last > acks.acked:
            self._acknowledge(poller)
        return True

    def _acknowledge(self, poller: Any) -> None:
        """Acknowledge what was delivered and not yet acknowledged: now when
        ``ACK_EVERY`` messages are waiting or the sender asked for prompt
        acknowledgements (``eager``), else within ``ACK_DELAY`` through
        ``poller`` (unless a delayed one is due already; before the session
        joins the poller, ``start`` acknowledges)."""
        acks = self.acks
        if acks.last - acks.acked >= ACK_EVERY or self.eager:
            self.ack_now(poller)
        if acks.last > acks.acked and poller is not None and not self.ack_due:
            poller.ack_later(self)

    def _leave(self, poller: Any, error: BaseException | None) -> bool:
        """The session is over: leave ``poller`` (None: not joined yet) and
        end, orderly (``error`` None: the peer said BYE) or with ``error``
        (logged unless it is a protocol, authentication or connection
        error).  Returns False, a reader's answer for an ended session."""
        if poller is not None:
            poller.remove(self)
        if error is None:
            self.end(None)
        else:
            self._failed(error)
        return False

    def ack_now(self, poller: Any) -> None:
        """Acknowledge everything delivered, now (``poller``: the one this
        session is in, whose lock keeps this write apart from a delayed
        acknowledgement another reader may be sending; None before it joins)."""
        with poller._ack_lock if poller is not None else _NO_LOCK:
            try:
                self.acks.send_ack()
            except ConnectionClosed:
                pass  # the next read sees it

    def _deliver(self, kind: int, flags: int, seq: int, header: bytes, payload: Any, buffers: list) -> bool:
        """Route one message; True at the end of the session (BYE)."""
        routed = self.fence.deliver(self.epoch, self.reader.peer, self.kernel.route, kind, flags, seq, header,
                                    payload, buffers, self.sender)
        if routed:
            self.acks.last = seq
        elif routed is None:
            self.kernel.end_session(self.session, self.fence)
            self.bye = True
            return True
        return False

    def _failed(self, e: BaseException) -> None:
        if not isinstance(e, (ProtocolError, AuthenticationError, ConnectionClosed)):
            logger.error("inbound session from %s failed", self.sender, exc_info=e)
        self.end(e)

    def _step_large(self, poller: Any) -> bool:
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
                return self._leave(poller, e)
            if bye:
                return self._leave(poller, None)
            acks = self.acks
            acks.nbytes += len(payload) + sum(memoryview(b).nbytes for b in buffers)
            if acks.nbytes >= ACK_BYTES and acks.last > acks.acked:  # free the sender's copies soon
                self.ack_now(poller)
            return self._deliver_buffered(poller)
        except BaseException as e:
            self._large = None
            return self._leave(poller, e)
        return True  # waiting for more bytes
