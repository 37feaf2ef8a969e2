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

import contextlib
import logging
import os
import select
import selectors
import _signal
import socket
import threading
import time
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

_EPOLLIN = select.EPOLLIN | select.EPOLLRDHUP
_ONESHOT = _EPOLLIN | select.EPOLLONESHOT

#: Seconds the poller's thread keeps standing by after a leader last waited
#: (a client between two ``get`` calls, an actor between two messages), while
#: nothing else waits for a message (see :meth:`Poller.follow`).
LINGER = 0.05
#: Seconds the poller's thread sleeps between checks while a leader waits.
STANDBY = 0.1
#: Longest single wait of a leader before it looks at its future again.
LEAD_SLICE = 0.25

_tls = threading.local()
_NO_LOCK = contextlib.nullcontext()
_MAIN_IDENT = threading.main_thread().ident
_sigint_pending: list[int] = []
_SIGINT = _signal.SIGINT
_default_int_handler = _signal.default_int_handler


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

    __slots__ = ("lock", "last", "epoch", "_stop")

    def __init__(self) -> None:
        self.lock = threading.Lock()
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
    """One inbound plain-socket session, served by the kernel's :class:`Poller`."""

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
            if acks.last - acks.acked >= ACK_EVERY or self.eager:
                self.ack_now(poller)
            if acks.last > acks.acked and poller is not None and not self.ack_due:
                poller.ack_later(self)
        return True

    def ack_now(self, poller: Poller | None) -> None:
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
            acks = self.acks
            acks.nbytes += len(payload) + sum(memoryview(b).nbytes for b in buffers)
            if acks.nbytes >= ACK_BYTES and acks.last > acks.acked:  # free the sender's copies soon
                self.ack_now(poller)
            return self._deliver_buffered(poller)
        except BaseException as e:
            self._large = None
            if poller is not None:
                poller.remove(self)
            self._failed(e)
            return False
        return True  # waiting for more bytes


class Poller:
    """Reads every plain-socket inbound session of a kernel: one ``epoll``
    shared by its own thread and by *leaders*.

    A thread blocked in ``Future.get`` (:meth:`lead`) and the loop of the
    proc's first actor (:meth:`attach`) read the sessions themselves while
    they wait, so a reply or a request is parsed by the thread that consumes
    it: no hand-over, no second wake-up.  The poller's own thread stands by
    while some leader waits, or waited less than ``LINGER`` seconds ago, and
    reads otherwise (an actor busy in a long handler, a client doing its own
    work): control messages and acknowledgements never depend on a leader.

    Sessions are registered one-shot, so whichever thread takes an event
    owns that session until it re-arms it: two threads never read one
    socket, and a session's messages stay in order.
    """

    #: The poller of the most recent kernel of this process (what
    #: ``Future.get`` leads), or None.
    current: Poller | None = None

    def __init__(self) -> None:
        self._ep = select.epoll()
        self._fd = self._ep.fileno()
        self._sessions: dict[int, InboundSession] = {}
        self._acks: list[InboundSession] = []
        self._ack_due = 0.0  # earliest delayed acknowledgement (0: none)
        self._ack_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._ep.register(self._wake_r, _ONESHOT)
        self._standby = threading.Lock()
        self._standby.acquire()  # released only by close(): an interruptible sleep
        self._waiting: set[int] = set()  # leaders blocked in a wait right now
        self._followers = 0  # waits that do not read (asyncio/trio awaits, plain waits)
        self._followers_lock = threading.Lock()
        self._left = 0.0  # monotonic time a leader last stopped waiting
        self._attached: Any = None  # the actor loop that reads while idle
        self._ep_lock = threading.Lock()
        self._ep_closed = False
        self._closed = False
        self._ident = 0
        self._thread = threading.Thread(target=self._main, name="monarch-inbound", daemon=True)
        self._thread.start()
        Poller.current = self

    def add(self, s: InboundSession) -> None:
        """Serve ``s`` (any thread)."""
        self._sessions[s.fd] = s
        try:
            self._ep.register(s.fd, _ONESHOT)
        except (OSError, ValueError) as e:  # the socket is already gone
            self._sessions.pop(s.fd, None)
            s.end(ConnectionClosed(f"connection from {s.reader.peer} broke: {e}"))

    def remove(self, s: InboundSession) -> None:
        """Stop serving ``s`` (the thread that holds its event)."""
        if self._sessions.get(s.fd) is s:
            del self._sessions[s.fd]
            try:
                self._ep.unregister(s.fd)
            except (OSError, ValueError):
                pass

    def ack_later(self, s: InboundSession) -> None:
        """Acknowledge what ``s`` delivered within ``ACK_DELAY`` (any reader)."""
        with self._ack_lock:
            if s.ack_due:
                return
            s.ack_due = due = time.monotonic() + ACK_DELAY
            self._acks.append(s)
            if not self._ack_due or due < self._ack_due:
                self._ack_due = due

    def close(self) -> None:
        """End the thread (any thread); sessions still registered end too."""
        self._closed = True
        if Poller.current is self:
            Poller.current = None
        self._wake_standby()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def follow(self, delta: int) -> None:
        """A wait that does not read starts (+1) or ends (-1), any thread.
        While one is under way and no leader waits, the poller's thread reads
        at once instead of lingering: a client that leaves ``get()`` for an
        ``await`` is not left unread."""
        with self._followers_lock:
            self._followers += delta
            wake = delta > 0 and not self._waiting
        if wake:
            self._wake_standby()

    def ack_sender_now(self, sender: str | None) -> None:
        """Acknowledge what the sessions from ``sender`` (None: every session)
        delivered, now and from now on as soon as it is delivered (any thread)."""
        for s in list(self._sessions.values()):
            if sender is not None and s.sender != sender:
                continue
            s.eager = True
            if s.acks.last > s.acks.acked:
                s.ack_now(self)

    def ack_sender_soon(self, sender: str) -> None:
        """Acknowledge what the sessions from ``sender`` delivered as soon as
        the read under way is done, once, without ``ACK_DELAY`` (the reading
        thread, while it routes a message flagged ``F_ACK_SOON``: the sender is
        near its send window and may be waiting for this acknowledgement).
        Every reader sends due acknowledgements right after its read."""
        now = time.monotonic()
        with self._ack_lock:
            for s in list(self._sessions.values()):
                if s.sender != sender:
                    continue
                if not s.ack_due:
                    self._acks.append(s)
                if not s.ack_due or s.ack_due > now:
                    s.ack_due = now
                if not self._ack_due or self._ack_due > now:
                    self._ack_due = now

    def _wake_standby(self) -> None:
        try:
            self._standby.release()
        except RuntimeError:  # already released: the thread is awake
            pass

    # ------------------------------------------------------------ reading
    def _handle(self, events: list) -> None:
        """Serve ready sessions (whichever thread took the events), then
        re-arm each one that is still open."""
        sessions = self._sessions
        _tls.handling = True
        try:
            for fd, _ev in events:
                s = sessions.get(fd)
                if s is None:
                    if fd == self._wake_r and threading.get_ident() != self._ident:
                        self._rearm(fd)  # only the poller's thread consumes the wake-up
                    continue
                if s.on_readable(self) and sessions.get(fd) is s:
                    self._rearm(fd)
        finally:
            _tls.handling = False

    def _rearm(self, fd: int) -> None:
        try:
            self._ep.modify(fd, _ONESHOT)
        except (OSError, ValueError):  # pragma: no cover - closed meanwhile
            pass

    def service(self) -> None:
        """Serve whatever is ready now, and acknowledgements that are due (a
        leader's thread; the attached actor loop's reader callback)."""
        if self._closed:
            return
        try:
            events = self._ep.poll(0)
        except (OSError, ValueError):  # closed
            return
        if events:
            self._handle(events)
        if self._ack_due:
            self._send_due_acks()

    def lead(self, cell: Any, timeout: float | None) -> bool | None:
        """Wait until ``cell`` is resolved or ``timeout`` passes, reading the
        sessions meanwhile (the calling thread is the one the reply wakes).
        Returns ``cell``'s state, or None when this thread cannot lead (the
        poller's own thread, a thread already serving an event, a closed
        poller): the caller then waits the plain way."""
        if self._closed or getattr(_tls, "handling", False):
            return None
        ident = threading.get_ident()
        if ident == self._ident:
            return None
        st = getattr(_tls, "lead", None)
        if st is None or st.poller is not self:
            try:
                st = _tls.lead = _Leader(self)
            except (OSError, ValueError):  # out of descriptors, or closed meanwhile
                return None
        with cell._lock:
            if cell._done:
                return True
            if cell._waiters is None:
                cell._waiters = [st]
            else:
                cell._waiters.append(st)
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        waiting = self._waiting
        guard = ident == _MAIN_IDENT and _signal.getsignal(_SIGINT) is _default_int_handler
        if guard:
            _signal.signal(_SIGINT, _deferred_sigint)
        try:
            lep, efd = st.ep, st.efd
            while not cell._done:
                if self._closed:
                    return None
                t = LEAD_SLICE
                now = time.monotonic()
                if deadline is not None:
                    t = min(t, deadline - now)
                    if t <= 0:
                        return False
                if self._ack_due:
                    t = max(0.0, min(t, self._ack_due - now))
                waiting.add(ident)
                try:
                    ready = lep.poll(t)
                finally:
                    waiting.discard(ident)
                    self._left = time.monotonic()
                for fd, _ev in ready:
                    if fd == efd:
                        try:
                            os.eventfd_read(efd)
                        except OSError:  # pragma: no cover - drained already
                            pass
                self.service()
                if guard and _sigint_pending:
                    _sigint_pending.clear()
                    raise KeyboardInterrupt
            return True
        except (OSError, ValueError):  # the poller closed under us
            return None
        finally:
            if guard:
                _signal.signal(_SIGINT, _default_int_handler)
                if _sigint_pending:
                    _sigint_pending.clear()
                    raise KeyboardInterrupt
            with cell._lock:
                if cell._waiters is not None and st in cell._waiters:
                    cell._waiters.remove(st)
            if self._followers and not self._waiting:
                self._wake_standby()  # someone else waits for a message: read for them now

    # ------------------------------------------------------------ attached actor loop
    def attach(self) -> Any:
        """A selector for the asyncio loop of an actor that reads this
        poller's sessions while it is idle, or None when another loop
        already does.  Register :meth:`service` as the loop's reader
        of :meth:`fileno` and call :meth:`detach` before the loop closes."""
        with self._ep_lock:
            if self._attached is not None or self._closed:
                return None
            self._attached = sel = _AttachedSelector(self)
        return sel

    def fileno(self) -> int:
        return self._fd

    def detach(self, loop: Any) -> None:
        """The attached loop stops reading (its own thread)."""
        try:
            loop.remove_reader(self._fd)
        except (OSError, ValueError, RuntimeError):  # pragma: no cover
            pass
        with self._ep_lock:
            sel, self._attached = self._attached, None
            if sel is not None:
                self._waiting.discard(sel.ident)
            if self._ep_closed:
                self._ep.close()

    # ------------------------------------------------------------ the poller's thread
    def _main(self) -> None:
        self._ident = threading.get_ident()
        ep = self._ep
        sessions = self._sessions
        try:
            while not self._closed:
                now = time.monotonic()
                if self._waiting or (now - self._left < LINGER and not self._followers):
                    # A leader reads: stand by.  While one waits, check back
                    # rarely (an idle actor may wait for hours); otherwise as
                    # soon as the last one has been gone ``LINGER`` seconds.
                    t = STANDBY if self._waiting else max(0.0, self._left + LINGER - now)
                    if self._ack_due:
                        t = max(0.0, min(t, self._ack_due - now))
                    self._standby.acquire(True, t)
                    if self._ack_due:
                        self._send_due_acks()
                    continue
                timeout = -1.0
                if self._ack_due:
                    timeout = max(0.0, self._ack_due - now)
                try:
                    events = ep.poll(timeout)
                except InterruptedError:  # pragma: no cover
                    continue
                if events:
                    self._handle(events)
                if self._ack_due:
                    self._send_due_acks()
        finally:
            for s in list(sessions.values()):
                self.remove(s)
                s.end(ConnectionClosed("the kernel is shutting down"))
            with self._ep_lock:
                self._ep_closed = True
                if self._attached is None:
                    ep.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _send_due_acks(self) -> None:
        due = self._ack_due
        if not due or time.monotonic() < due:
            return
        if not self._ack_lock.acquire(False):
            return  # another reader is at it
        try:
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
            self._ack_due = min((s.ack_due for s in keep), default=0.0)
        finally:
            self._ack_lock.release()


class _Leader:
    """A thread's means to lead a poller: its own epoll over the poller's
    epoll and an eventfd that a resolved future writes (when another thread
    resolved it) to wake it."""

    __slots__ = ("poller", "ep", "efd", "ident", "__weakref__")

    def __init__(self, poller: Poller) -> None:
        self.poller = poller
        self.ident = threading.get_ident()
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            self.ep = select.epoll()
            self.ep.register(poller.fileno(), select.EPOLLIN)
            self.ep.register(self.efd, select.EPOLLIN)
        except BaseException:
            os.close(self.efd)
            raise

    def release(self) -> None:
        """The future resolved (``Cell`` calls this like a waiter's lock)."""
        if threading.get_ident() != self.ident:
            try:
                os.eventfd_write(self.efd, 1)
            except OSError:  # pragma: no cover - closed
                pass

    def __del__(self) -> None:
        try:
            self.ep.close()
            os.close(self.efd)
        except (AttributeError, OSError):  # pragma: no cover
            pass


class _AttachedSelector(selectors.EpollSelector):
    """The selector of the attached actor loop: counts the loop as a waiting
    leader while it blocks, and bounds the wait by the next acknowledgement."""

    def __init__(self, poller: Poller) -> None:
        super().__init__()
        self._poller = poller
        self.ident = 0

    def select(self, timeout: float | None = None) -> list:
        p = self._poller
        ident = self.ident
        if not ident:
            ident = self.ident = threading.get_ident()
        if p._ack_due and (timeout is None or timeout > 0):
            t = max(0.0, p._ack_due - time.monotonic())
            timeout = t if timeout is None or timeout < 0 else min(timeout, t)
        waiting = p._waiting
        waiting.add(ident)
        try:
            return super().select(timeout)
        finally:
            waiting.discard(ident)
            p._left = time.monotonic()
            if p._ack_due:
                p._send_due_acks()


def reading() -> bool:
    """Whether the calling thread is serving inbound sessions right now (the
    poller's thread, or a leader in the middle of an event): it must never
    wait for a send window, since the acknowledgements other procs wait for
    are what it is busy sending."""
    return getattr(_tls, "handling", False)


def _deferred_sigint(signum: int, frame: Any) -> None:
    """SIGINT while the main thread leads: raised at once while it waits,
    after the event at hand while it serves one (never mid-message)."""
    if getattr(_tls, "handling", False):
        _sigint_pending.append(signum)
        return
    raise KeyboardInterrupt
