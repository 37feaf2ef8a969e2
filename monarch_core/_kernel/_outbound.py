"""The sending half of sessions: :class:`_Outbound` (one session to one
destination proc: connect, handshake, FIFO queue, sequence numbers,
retransmission after a reconnect, backoff, direct writes from other threads)
and :class:`_Window` (the send window to that proc).  ``Kernel`` (``_runtime``)
owns them; this module does not import it.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import random
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import trio

from monarch_core import settings
from monarch_core._compat import BaseExceptionGroup, first_leaf
from monarch_core._kernel import _wire as W
from monarch_core._kernel._child_watch import ChildProcess
from monarch_core._kernel._poller import reading
from monarch_core.errors import (
    ConnectError,
    ConnectionClosed,
    ProtocolError,
    TransportError,
    UndeliverableMessageError,
)
from monarch_core.hookspecs import Stream, Transport

logger = logging.getLogger("monarch.kernel")


class Kernel(Protocol):
    """The ``_runtime.Kernel`` as a session (:class:`_Outbound`) and a send
    window (:class:`_Window`) see it: what they read and call back.  (That
    module imports this one, so it is not named here; ``Kernel`` satisfies
    this protocol.)"""

    proc_id: str
    address: str | None
    #: proc id -> why it is gone
    dead: dict[str, str]
    delivery_timeout: float
    _closing: bool

    def in_loop(self) -> bool: ...

    def call_soon(self, fn: Callable, *args: Any) -> None: ...

    def child(self, proc_id: str) -> ChildProcess | None: ...

    def transport_for(self, address: str) -> Transport: ...

    async def _wait_address(self, proc_id: str) -> str | None: ...

    def _window(self, proc_id: str) -> _Window: ...

    def _fail_pending(self, proc_id: str, exc: BaseException, ports: set[int]) -> None: ...

    def _dead_error(self, proc_id: str) -> BaseException: ...

    def proc_failed(self, proc_id: str, reason: str, stopped: bool = False) -> None: ...

    async def wait_dead(self, proc_id: str) -> None: ...


#: Refused reconnects (after a broken connection) that declare a proc dead.
REFUSALS_FOR_DEAD = 4
#: Seconds to wait, once a proc looks dead, for its parent's word on how it ended.
DEAD_VERDICT_GRACE = 0.3
#: Messages below this size (and without out-of-band buffers) are joined into
#: one ``send`` when written directly; larger ones go out with ``sendmsg``.
DIRECT_JOIN_MAX = 64 * 1024
#: Seconds since the last direct write under which a session counts as busy
#: (a burst): its messages then go through the loop, which writes them in
#: batches (MONARCH_DIRECT_GAP_US).
DIRECT_GAP = settings.get("MONARCH_DIRECT_GAP_US") / 1e6
_monotonic = time.perf_counter
#: Queued writes of at least this many bytes on a plain socket are done by a
#: worker thread.
THREAD_WRITE_MIN = 1 << 20
#: Seconds to wait for a handshake from a new connection.
HANDSHAKE_TIMEOUT: float = settings.get("MONARCH_HANDSHAKE_TIMEOUT")
#: Reconnect backoff of an outbound session, in seconds: exponential with full
#: jitter -- after the n-th failed attempt in a row it waits a random time in
#: [0, min(BACKOFF_CAP, BACKOFF_BASE * 2**n)], so sessions that broke together
#: do not retry in step.  It starts again from BACKOFF_BASE only once the peer
#: has proved itself on a connection (see ``_Outbound.run``): connecting is no
#: proof, a TLS 1.3 client finishes its handshake before the server has
#: checked the client's certificate.
BACKOFF_BASE = 0.005  # small: refused reconnects to a proc that died add up to REFUSALS_FOR_DEAD fast
BACKOFF_CAP = 2.0  # a peer that stays away is tried about once a second
#: ... and at least this bound when the peer took the connection and dropped it
#: before proving itself (it rejected our certificate, our handshake or our
#: messages): that repeats until someone changes a configuration.
BACKOFF_REJECTED = 0.25
#: Seconds between the checks of a sender waiting for room (a dead destination,
#: a closing kernel, a stall longer than the delivery timeout); room wakes it at once.
WINDOW_POLL = 0.25
class _Window:
    """The send window to one destination proc (any thread).

    Counts the messages and bytes handed to :meth:`Kernel.send` for the proc
    and not yet acknowledged: in ``Kernel._tx``, in its :class:`_Outbound`'s
    ``queue`` or ``unacked``.  Every message is counted; only senders that may
    wait do (:meth:`Kernel.send`).  A session returns what it counted when the
    receiver acknowledges (``_Outbound.trim``) or when it fails
    (``_Outbound.fail``); ``Kernel._push`` returns what it drops.
    """

    __slots__ = ("max_msgs", "max_bytes", "half_msgs", "half_bytes", "ask_msgs", "ask_bytes", "msgs", "nbytes",
                 "lock", "cond", "waiters", "releases")

    def __init__(self, max_msgs: float, max_bytes: float) -> None:
        self.max_msgs = max_msgs
        self.max_bytes = max_bytes
        self.half_msgs = max_msgs / 2
        self.half_bytes = max_bytes / 2
        # The next message that brings the window to these asks for an early
        # acknowledgement; infinite once one has asked, half again on a release.
        self.ask_msgs = self.half_msgs
        self.ask_bytes = self.half_bytes
        self.msgs = 0
        self.nbytes = 0
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.waiters = 0  # senders waiting for room now (tests and benchmarks read it)
        self.releases = 0  # how many times room was returned (a waiter's sign of progress)

    def take(self, size: int, kernel: Kernel, proc_id: str, kind: int) -> bool:
        """Count one message of ``size`` bytes, first waiting for room if the
        window is full and the calling thread may wait (see
        :meth:`Kernel.send`, which inlines the case of a window with room).
        True: the window is half full, the message should ask the receiver
        to acknowledge it at once (``F_ACK_SOON``): the acknowledgements a
        receiver sends on its own (every ``ACK_EVERY`` messages or after
        ``ACK_DELAY``) may come only after a small window has filled."""
        with self.lock:
            if (self.msgs >= self.max_msgs or self.nbytes >= self.max_bytes) and kind != W.K_CONTROL \
                    and not kernel.in_loop() and not reading():
                self._wait(kernel, proc_id)
            self.msgs = msgs = self.msgs + 1
            self.nbytes = nbytes = self.nbytes + size
            if msgs >= self.ask_msgs or nbytes >= self.ask_bytes:
                self.ask_msgs = self.ask_bytes = math.inf
                return True
            return False

    def _wait(self, kernel: Kernel, proc_id: str) -> None:
        """Wait (holding ``lock``) until there is room, or until waiting is
        moot: the destination is dead (the message then fails the usual way,
        in ``_push``), the kernel is closing, or nothing was acknowledged for
        the delivery timeout (the session's own timeout then decides)."""
        self.waiters += 1
        try:
            seen = self.releases
            since = time.monotonic()
            while self.msgs >= self.max_msgs or self.nbytes >= self.max_bytes:
                if proc_id in kernel.dead or kernel._closing:
                    return
                now = time.monotonic()
                if self.releases != seen:
                    seen, since = self.releases, now
                elif now - since > kernel.delivery_timeout:
                    return
                self.cond.wait(WINDOW_POLL)
        finally:
            self.waiters -= 1

    def release(self, msgs: int, nbytes: int) -> None:
        """``msgs`` messages of ``nbytes`` bytes in all are no longer in flight."""
        with self.lock:
            self.msgs -= msgs
            self.nbytes -= nbytes
            self.ask_msgs = self.half_msgs
            self.ask_bytes = self.half_bytes
            self.releases += 1
            if self.waiters:
                self.cond.notify_all()


class _Outbound:
    """The sending half of one session to one destination proc."""

    __slots__ = (
        "kernel",
        "proc_id",
        "session_id",
        "seq",
        "queue",
        "unacked",
        "wake",
        "failed",
        "cancel",
        "last_ack_time",
        "last_error",
        "lock",
        "sock",
        "busy",
        "last_direct",
        "flushed",
        "window",
        "sizes",
    )

    def __init__(self, kernel: Kernel, proc_id: str) -> None:
        self.kernel = kernel
        self.proc_id = proc_id
        self.session_id = uuid.uuid4().hex
        self.seq = 0
        # items: (seq, parts, port_id_or_None)
        self.queue: collections.deque = collections.deque()
        self.unacked: collections.deque = collections.deque()
        self.wake = trio.Event()
        self.failed: BaseException | None = None
        self.cancel = trio.CancelScope()
        self.last_ack_time = time.monotonic()
        self.last_error: BaseException | None = None
        # Direct writes: while the session is connected over a plain socket and
        # idle, other threads write their frames straight to it (no hop onto
        # the loop).  ``lock`` orders them with the loop's writer.
        self.lock = threading.Lock()
        self.sock: Any = None
        self.busy = False
        self.last_direct = 0.0
        #: the direct socket's ``pending_output`` (a TLS record layer), or None
        self.flushed: Any = None
        # Flow control: the proc's send window, and the size each message in
        # ``unacked`` + ``queue`` counted in it (sequence order: ``unacked`` holds
        # the oldest, ``queue`` the newest; partial-write tails count nothing).
        self.window = kernel._window(proc_id)
        self.sizes: collections.deque = collections.deque()

    def push(self, kind: int, flags: int, header: bytes, payload: Any, buffers: list, port_id: int | None,
             size: int = 0) -> None:
        with self.lock:
            self.seq += 1
            parts: Sequence[Any] = W.encode_message(kind, flags, self.seq, header, payload, buffers)
            if not buffers and len(payload) < DIRECT_JOIN_MAX:
                # one bytes in a tuple: an entry the garbage collector stops tracking
                # at its first look (a pipelined burst queues thousands)
                parts = (b"".join(parts),)
            self.queue.append((self.seq, parts, port_id))
            self.sizes.append(size)
        self.wake.set()

    def try_direct(self, kind: int, flags: int, header: bytes, payload: Any, buffers: list,
                   port_id: int | None, size: int = 0) -> bool:
        """Write one message straight to the socket from the calling thread, if
        the session is connected and idle: as much of it as the socket buffer
        takes now (one ``sendmsg``, no copy), the rest goes next through the
        loop, ahead of anything else.  False: nothing was written, use the
        queue."""
        if self.sock is None or self.busy or self.queue or len(buffers) > 512:
            return False
        now = _monotonic()
        if now - self.last_direct < DIRECT_GAP:
            # A burst: each write would wake the peer once per message (on a VM
            # an inter-processor interrupt costs tens of µs).  Let the loop
            # write the burst in batches instead.
            return False
        self.last_direct = now
        with self.lock:
            sock = self.sock
            if sock is None or self.busy or self.queue:
                return False
            seq = self.seq + 1
            parts = W.encode_message(kind, flags, seq, header, payload, buffers)
            small = not buffers and len(payload) < DIRECT_JOIN_MAX
            sent: Sequence[Any]
            if small:  # one contiguous write is cheapest for small frames
                data = b"".join(parts)
                total = len(data)
                sent = (data,)
            else:
                total = W.total_size(parts)
                sent = parts
            try:
                n = sock.send(data) if small else sock.sendmsg(parts)
            except OSError:  # (BlockingIOError and InterruptedError included)
                return False  # a broken connection: the loop's reader will see it
            self._written(seq, sent, port_id, size, n, total)
            return True

    def _written(self, seq: int, sent: Sequence[Any], port_id: int | None, size: int, n: int, total: int) -> None:
        """Account for a direct write (holding ``lock``) of message ``seq``
        (``sent``, ``total`` bytes of which the socket took ``n``): it is in
        flight until acknowledged (``unacked``, and the acknowledgement clock
        starts if nothing else was); what the socket did not take is queued
        to go next, ahead of anything else; and when all was taken by a
        record layer (TLS) that still holds records, an empty write is queued
        that makes the loop flush them."""
        self.seq = seq
        if not self.unacked:
            self.last_ack_time = time.monotonic()
        self.unacked.append((seq, sent, port_id))
        self.sizes.append(size)
        if n != total:
            self.queue.appendleft((None, W.skip_bytes(list(sent), n), None))
            self.kernel.call_soon(self.wake.set)
        elif self.flushed is not None and self.flushed():
            self.queue.appendleft((None, [b""], None))
            self.kernel.call_soon(self.wake.set)

    def trim(self, acked: int) -> None:
        u = self.unacked
        n = nbytes = 0
        # Under the lock: a direct write appends its message to ``unacked``
        # only after the write, and must not miss an acknowledgement of it.
        with self.lock:
            sizes = self.sizes
            while u and u[0][0] <= acked:
                u.popleft()
                nbytes += sizes.popleft()
                n += 1
        self.last_ack_time = time.monotonic()
        if n:
            self.window.release(n, nbytes)

    def fail(self, exc: BaseException) -> None:
        """Return every queued and unacknowledged message to its sender (each
        waiting port is failed once, together with the proc's other pending
        replies)."""
        if self.failed is None:
            self.failed = exc
        with self.lock:
            self.sock = None
            ports = {port_id for _s, _p, port_id in itertools.chain(self.unacked, self.queue) if port_id is not None}
            self.unacked.clear()
            self.queue.clear()
            n, nbytes = len(self.sizes), sum(self.sizes)
            self.sizes.clear()
        if n:
            self.window.release(n, nbytes)
        self.cancel.cancel()
        self.kernel._fail_pending(self.proc_id, exc, ports)

    async def run(self) -> None:
        """The session's life: connect to the proc's address, serve the
        session (:meth:`_session`) until its connection breaks, and reconnect
        after a backoff (:class:`_Reconnects`) until the proc is known dead,
        its address cannot be used, or it stayed unreachable past the
        delivery timeout -- each of which fails the session."""
        k = self.kernel
        with self.cancel:
            tries = _Reconnects()
            while True:
                address = await k._wait_address(self.proc_id)
                if address is None:  # the proc died before it ever listened
                    self.fail(k._dead_error(self.proc_id))
                    return
                try:
                    transport = k.transport_for(address)
                except Exception as e:  # an address no transport can use: it will never work
                    self.fail(UndeliverableMessageError(f"cannot deliver to proc {self.proc_id!r}: bad address {address!r} ({e})"))
                    return
                broken = await self._connect(transport, address, tries)
                if broken is None or not await self._after_break(address, tries, *broken):
                    return

    async def _connect(self, transport: Transport, address: str,
                       tries: _Reconnects) -> tuple[BaseException, _SessionReader | None] | None:
        """Connect to ``address`` once and serve the session over the
        connection, closing it at the end.  The connection broke: its error,
        and its reader when the transport connected (None when it did not);
        None when it is over for good (the address is malformed: the session
        failed)."""
        stream = None
        reader: _SessionReader | None = None
        try:
            stream = await transport.connect(address)
            tries.refusals = 0
            tries.was_connected = True
            reader = _SessionReader(stream)
            await self._session(stream, address, reader)
            return None  # (not reached: a session ends by an exception or cancellation)
        except (TransportError, OSError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            return e, reader
        except (ValueError, TypeError, AttributeError) as e:  # a malformed address
            self.fail(UndeliverableMessageError(f"cannot deliver to proc {self.proc_id!r} at {address!r}: {e}"))
            return None
        except BaseExceptionGroup as eg:
            err = first_leaf(eg, skip=(trio.Cancelled,))
            if not isinstance(err, (TransportError, OSError, trio.BrokenResourceError)):
                raise
            return err, reader
        finally:
            if stream is not None:
                with trio.CancelScope(shield=True):
                    await stream.aclose()

    async def _after_break(self, address: str, tries: _Reconnects, err: BaseException,
                           reader: _SessionReader | None) -> bool:
        """The connection to ``address`` broke (or could not be made) with
        ``err``: True after waiting the backoff, to try again; False when the
        session failed instead (the proc is dead, or gone, or unreachable for
        longer than the delivery timeout)."""
        k = self.kernel
        if self.proc_id in k.dead:
            self.fail(k._dead_error(self.proc_id))
            return False
        self.last_error = err
        if reader is not None:  # it took the connection: how far did it get?
            tries.judge(reader.acked or (reader.greeted and not self.unacked))
        if isinstance(err, ConnectError) and err.refused:
            tries.refusals += 1
            if tries.was_connected and tries.refusals >= REFUSALS_FOR_DEAD:
                await self._declare_gone(address)
                return False
        if self._unreachable_too_long(address, tries, err):
            return False
        await trio.sleep(tries.next_wait())
        return True

    async def _declare_gone(self, address: str) -> None:
        """The proc was there, its connection broke, and now nothing listens
        at its address: it is gone.  Give its parent a moment to tell us how
        it ended (exit status, or a stop) before we say it ourselves, then
        fail the session.  When this kernel is its parent, the exit comes from
        its watcher: a proc that closed its listener may still be running its
        interpreter's finalization (a stopped proc is gone only once it
        exited)."""
        k = self.kernel
        grace = DEAD_VERDICT_GRACE if k.child(self.proc_id) is None else k.delivery_timeout
        with trio.move_on_after(grace):
            await k.wait_dead(self.proc_id)
        k.proc_failed(
            self.proc_id,
            f"proc {self.proc_id} is gone: its connection closed and nothing listens at "
            f"{address} any more (its exit status is known only to its parent)",
        )
        self.fail(k._dead_error(self.proc_id))

    def _unreachable_too_long(self, address: str, tries: _Reconnects, err: BaseException) -> bool:
        """Note that the session is down (logged once per outage) and, when
        it has been for longer than the delivery timeout, fail it (and the
        proc, when it was ever reached): True then."""
        k = self.kernel
        now = time.monotonic()
        if tries.down_since is None:
            tries.down_since = now
            logger.info("session to %s at %s broke (%s); reconnecting", self.proc_id, address, err)
        if now - tries.down_since <= k.delivery_timeout:
            return False
        why = (
            f"could not deliver to proc {self.proc_id!r} at {address}: no connection for "
            f"{k.delivery_timeout:.0f}s (last error: {err}). Set MONARCH_DELIVERY_TIMEOUT "
            "to wait longer."
        )
        self.fail(UndeliverableMessageError(why))
        if tries.was_connected:  # it was there and has been unreachable ever since
            k.proc_failed(self.proc_id, why)
        return True

    async def _session(self, stream: Stream, address: str, reader: _SessionReader) -> None:
        """Serve one connection until it breaks (raises): shake hands, resend
        what the peer has not acknowledged, then write the queue as it fills,
        while :meth:`_read_acks` trims what the peer acknowledges and
        :meth:`_watchdog` watches for a peer that stopped acknowledging.
        While the queue is empty, other threads may write directly
        (:meth:`try_direct`) to a plain socket."""
        await self._handshake(stream, address, reader)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_acks, reader)
                nursery.start_soon(self._watchdog, address)
                await self._resend(stream)
                direct = _raw_socket(stream)
                if direct is not None:
                    _grow_buffer(direct, socket.SO_SNDBUF)
                    self.flushed = getattr(direct, "pending_output", None)
                while True:
                    with self.lock:
                        if not self.queue:
                            self.busy = False
                            self.sock = direct
                    while not self.queue:
                        if self.wake.is_set():
                            self.wake = trio.Event()
                        await self.wake.wait()
                    parts = self._take_batch()
                    if direct is not None and W.total_size(parts) >= THREAD_WRITE_MIN:
                        # A large write: from a thread, blocking, rather than
                        # one pass of the trio scheduler per socket buffer
                        # the peer drains (hundreds for 64 MiB).
                        await trio.to_thread.run_sync(self._write_blocking, direct, parts)
                    else:
                        await W.write_parts(stream, parts)
        except BaseExceptionGroup as eg:
            raise first_leaf(eg, skip=(trio.Cancelled,)) from None
        finally:
            with self.lock:
                self.sock = None
                self.busy = False

    async def _handshake(self, stream: Stream, address: str, reader: _SessionReader) -> None:
        """Exchange handshakes over a new connection and drop what the peer
        says it has already received.  Raises ``ConnectError`` when the peer
        sends none in time, or answers in TLS (a TLS port dialled without
        TLS: the message says how to dial it)."""
        k = self.kernel
        await stream.send_all(
            W.encode_handshake({"proc": k.proc_id, "session": self.session_id, "address": k.address or ""})
        )
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                hello = await W.read_handshake(reader)
        except trio.TooSlowError:
            raise ConnectError(
                f"{address} took the connection but sent no handshake within {HANDSHAKE_TIMEOUT:g}s "
                "(MONARCH_HANDSHAKE_TIMEOUT)"
            ) from None
        except ConnectionClosed:
            if await _answered_in_tls(reader):
                where = address.split("://", 1)[-1]
                raise ConnectError(
                    f"{address} speaks TLS: use tls://{where} and pass ca=/private_key= (or set "
                    "MONARCH_TLS_CA/MONARCH_TLS_KEY); it answered the plain handshake in TLS"
                ) from None
            raise
        reader.greeted = True
        self.trim(int(hello.get("last", 0)))

    async def _resend(self, stream: Stream) -> None:
        """On a new connection, before anything else: retransmit every
        message the peer has not acknowledged, and forget the partial-write
        tails of the broken connection (their messages are among those)."""
        with self.lock:
            self.queue = collections.deque(i for i in self.queue if i[0] is not None)
        if self.unacked:
            self.last_ack_time = time.monotonic()
            parts = [p for _s, ps, _p in list(self.unacked) for p in ps]
            await W.write_parts(stream, parts)

    def _take_batch(self) -> list:
        """Take everything queued (the session's writer, on the loop): its
        messages count as unacknowledged from now on (the acknowledgement
        clock starts if nothing else was), and direct writes stop until the
        queue is empty again.  Returns the parts to write, in order."""
        with self.lock:
            self.busy = True
            batch = self.queue
            self.queue = collections.deque()
            if not self.unacked:
                self.last_ack_time = time.monotonic()
            self.unacked.extend(i for i in batch if i[0] is not None)
        if len(batch) == 1:
            return batch[0][1]
        return [p for _s, ps, _p in batch for p in ps]

    def _write_blocking(self, sock: Any, parts: list) -> None:
        """Write ``parts`` to the non-blocking ``sock`` (a worker thread); give
        up, as a broken connection, once the session has failed or the kernel
        is closing (checked every 0.1 s while the peer does not read)."""
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLOUT)
        # At most 512 parts per sendmsg; only those are re-sliced after a
        # write (re-slicing all of a batch of thousands of small messages
        # after each write made the batch quadratic: 100k small messages
        # took ~50 s).  ``chunk[0]`` is ``parts[i]`` or its unsent rest.
        i = 0
        parts = list(parts)
        chunk = parts[:512]
        while chunk:
            try:
                n = sock.sendmsg(chunk)
            except (BlockingIOError, InterruptedError):
                if self.failed is not None or self.kernel._closing:
                    raise ConnectionClosed(f"session to {self.proc_id} ended during a write") from None
                poller.poll(100)
                continue
            except OSError as e:
                raise ConnectionClosed(f"connection to {self.proc_id} broke: {e.strerror or e}") from None
            rest = W.skip_bytes(chunk, n)
            i += len(chunk) - len(rest)
            chunk = rest + parts[i + len(rest) : i + 512]
        pending = getattr(sock, "pending_output", None)
        while pending is not None and pending():  # (TLS) records the socket has not taken yet
            try:
                sock.send(b"")
            except (BlockingIOError, InterruptedError):
                if self.failed is not None or self.kernel._closing:
                    raise ConnectionClosed(f"session to {self.proc_id} ended during a write") from None
                poller.poll(100)
            except OSError as e:
                raise ConnectionClosed(f"connection to {self.proc_id} broke: {e.strerror or e}") from None

    async def _watchdog(self, address: str) -> None:
        """A connection that stays up but stops acknowledging (a cut link, a
        hung peer) must not hold messages forever: after the delivery timeout
        without progress they are returned as undeliverable."""
        k = self.kernel
        while True:
            # With nothing unacknowledged no deadline can pass before the next send, so an idle
            # session sleeps half the timeout (the first check after a send still comes before
            # its deadline; then checks are at most a second apart): a client of hundreds of
            # idle sessions no longer wakes each of them every second.
            await trio.sleep(min(1.0, k.delivery_timeout / 4) if self.unacked else k.delivery_timeout / 2)
            if self.unacked and time.monotonic() - self.last_ack_time > k.delivery_timeout:
                why = (
                    f"could not deliver to proc {self.proc_id!r} at {address}: nothing acknowledged for "
                    f"{k.delivery_timeout:.0f}s (MONARCH_DELIVERY_TIMEOUT)"
                )
                self.fail(UndeliverableMessageError(why))
                k.proc_failed(self.proc_id, why)
                return

    async def _read_acks(self, reader: W.FrameReader) -> None:
        while True:
            kind, _f, seq, _h, _p, _b = await reader.read_message()
            if kind != W.K_ACK:
                raise ProtocolError(f"peer {reader.peer} sent kind {kind} on an outbound session")
            self.trim(seq)


class _Reconnects:
    """The reconnect state of an outbound session (``_Outbound.run``): the
    backoff bound -- exponential with full jitter, see ``BACKOFF_BASE`` --,
    since when the session is down (None: it is up), whether the proc was
    ever reached, and the refused attempts in a row since."""

    __slots__ = ("bound", "down_since", "was_connected", "refusals")

    def __init__(self) -> None:
        self.bound = BACKOFF_BASE  # the longest the next wait may be
        self.down_since: float | None = None
        self.was_connected = False
        self.refusals = 0

    def judge(self, proven: bool) -> None:
        """A connection the peer took has ended.  ``proven``: it answered
        what we sent (or had nothing to answer): the session was up, and
        starts afresh.  Otherwise it dropped the connection before proving
        itself (in the TLS or monarch handshake, or instead of
        acknowledging): the time counts as down, and it will likely do the
        same next time."""
        if proven:
            self.bound = BACKOFF_BASE
            self.down_since = None
        else:
            self.bound = max(self.bound, BACKOFF_REJECTED)

    def next_wait(self) -> float:
        """Seconds to wait before the next attempt (and double the bound)."""
        wait = random.random() * self.bound
        self.bound = min(self.bound * 2, BACKOFF_CAP)
        return wait


class _SessionReader(W.FrameReader):
    """The reader of one outbound connection, noting how far the peer got:
    ``greeted`` once its handshake reply arrived, ``acked`` once a frame
    followed (an acknowledgement: it took what we sent).  ``_Outbound.run``
    resets its backoff only for a connection the peer proved itself on.
    (``acked``, not ``proven``: a slot of that name would hide
    ``FrameReader.proven``, the trust the reader gives the peer's frames.)"""

    __slots__ = ("greeted", "acked")

    def __init__(self, stream: Stream) -> None:
        super().__init__(stream)
        self.greeted = False
        self.acked = False

    async def read_message(self) -> tuple:
        m = await super().read_message()
        self.acked = True
        return m


async def _answered_in_tls(reader: W.FrameReader) -> bool:
    """Whether the bytes a peer sent before it closed, instead of a handshake,
    are a TLS record (an alert): a TLS port dialled without TLS."""
    n = reader.buffered()
    if n < 3:
        return False
    head = await reader.read_exactly(3)  # buffered already: no read
    return head[0] in (0x15, 0x16) and head[1] == 0x03 and head[2] <= 0x04


def _raw_socket(stream: Stream) -> Any:
    """The non-blocking stdlib socket the kernel may read/write directly, as
    the stream offers it (``Stream.raw_socket``; None for e.g. TLS, which
    must not be written from two threads, or a stream without the method)."""
    get = getattr(stream, "raw_socket", None)
    return get() if get is not None else None


#: Socket buffer size asked for on plain-socket sessions (the kernel caps it
#: at net.core.wmem_max / rmem_max): a 64 MiB message then crosses in a few
#: rounds of wake-ups instead of hundreds.
SOCKET_BUFFER = 4 << 20


def _grow_buffer(sock: Any, opt: int) -> None:
    try:
        if sock.getsockopt(socket.SOL_SOCKET, opt) < SOCKET_BUFFER:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
    except OSError:  # pragma: no cover - not a socket option this family has
        pass
