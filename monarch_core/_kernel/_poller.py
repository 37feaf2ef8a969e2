"""The kernel's poller: inbound sessions over plain sockets, read off the trio loop.

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
format is enforced by the same code either way.  A stream's "socket" may be a
record layer with the socket's interface (the tls transport's: see
``hookspecs.Stream.raw_socket``); one whose ``pending()`` says plaintext is
ready is read again before its descriptor is waited on.  Streams without
``raw_socket`` keep the trio path.

The trio task that owns a connection waits until the session ends; when it
is cancelled (kernel shutdown) it shuts the socket down, which ends the
session, and only then lets the connection be closed (no descriptor reuse).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import selectors
import _signal  # type: ignore[import-not-found]  # (CPython's C module behind ``signal``; typeshed has no stub)
import threading
import time
from collections.abc import Iterator
from typing import Any

from monarch_core._kernel import _inbound
from monarch_core._kernel._inbound import InboundSession
from monarch_core.errors import ConnectionClosed

logger = logging.getLogger("monarch.kernel")

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

_MAIN_IDENT = threading.main_thread().ident
_sigint_pending: list[Any] = []  # SIGINTs that came mid-event: _SIGINT (raise KeyboardInterrupt) or a _ChainedSigint
_SIGINT = _signal.SIGINT
_default_int_handler = _signal.default_int_handler


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
        #: monotonic time a leader last stopped waiting (-inf: none did; not 0, which is only
        #: the boot time: a machine up for less than ``LINGER`` would linger)
        self._left = -math.inf
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
            s.ack_due = due = time.monotonic() + _inbound.ACK_DELAY
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
                    more = s.more
                    if more is not None:  # (TLS) decrypted bytes the socket no longer signals
                        while more() and s.on_readable(self) and sessions.get(fd) is s:
                            pass
                        if sessions.get(fd) is not s:
                            continue
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
        st = self._leader()
        if st is None:
            return None
        main = st.ident == _MAIN_IDENT
        if main:
            deliver_cancellation()  # (a Ctrl-C that came while this thread did not wait)
        with cell._lock:
            if cell._done:
                return True
            if cell._waiters is None:
                cell._waiters = [st]
            else:
                cell._waiters.append(st)
        restore = _guard_sigint() if main else None
        try:
            return self._wait_leading(cell, st, timeout, restore is not None)
        except (OSError, ValueError):  # the poller closed under us
            return None
        finally:
            self._stop_leading(cell, st, restore)

    def _leader(self) -> _Leader | None:
        """The calling thread's means to lead this poller (made on its first
        wait), or None when it cannot lead: the poller is closed, the thread
        is serving an event already, it is the poller's own thread, or it is
        out of descriptors."""
        if self._closed or getattr(_tls, "handling", False):
            return None
        if threading.get_ident() == self._ident:
            return None
        st = getattr(_tls, "lead", None)
        if st is None or st.poller is not self:
            try:
                st = _tls.lead = _Leader(self)
            except (OSError, ValueError):  # out of descriptors, or closed meanwhile
                return None
        return st

    def _wait_leading(self, cell: Any, st: _Leader, timeout: float | None, guard: bool) -> bool | None:
        """The wait of :meth:`lead`, ``st`` registered as a waiter of ``cell``:
        block in ``st``'s epoll (woken by a readable session or by ``cell``'s
        resolution) and serve what is ready, until ``cell`` is done (True),
        ``timeout`` has passed (False) or the poller closed (None).  Each wait
        is bounded by ``LEAD_SLICE`` and by the next delayed acknowledgement.
        ``guard``: SIGINT is deferred (main thread): one that came while an
        event was served is raised between events."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        waiting = self._waiting
        ident = st.ident
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
                _raise_pending_sigint()
        return True

    def _stop_leading(self, cell: Any, st: _Leader, restore: Any) -> None:
        """The end of :meth:`lead`'s wait: put SIGINT's handler back
        (``restore``, None when it was not replaced) and raise a SIGINT
        deferred meanwhile, drop ``st`` from ``cell``'s waiters, and wake the
        poller's thread when some other wait now depends on it to read."""
        if restore is not None:
            _signal.signal(_SIGINT, restore)
            if _sigint_pending:
                _raise_pending_sigint()
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
        if sel is not None and not self._waiting:
            # The loop will not wait again (its actor stopped): the poller's
            # thread reads from now on, not after its standby or linger.
            self._left = -math.inf
            self._wake_standby()

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
                        s.ack_due = now + _inbound.ACK_DELAY
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


@contextlib.contextmanager
def following() -> Iterator[None]:
    """A wait that does not read the sockets itself is under way on this
    thread (so the poller's thread reads for it at once; see ``Poller.follow``)."""
    p = Poller.current
    if p is None:
        yield
        return
    p.follow(1)
    try:
        yield
    finally:
        p.follow(-1)


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


def _guard_sigint() -> Any:
    """Make SIGINT end the main thread's wait: the handler to put back after
    it, or None when SIGINT is not Python's to handle (ignored, default
    action, or a handler set outside Python).

    Python's own handler (``KeyboardInterrupt``) becomes :func:`_deferred_sigint`;
    any other Python handler is chained (:class:`_ChainedSigint`): it runs,
    and if it cancelled the asyncio task this wait blocks (what
    ``asyncio.run``'s handler does on the first Ctrl-C, expecting the task to
    reach an ``await`` soon), the wait raises ``CancelledError`` in it -- a
    blocking ``.get()`` is where that task would otherwise sit until the
    reply comes, and a loop of them never reaches an ``await`` at all."""
    current = _signal.getsignal(_SIGINT)
    if current is _default_int_handler:
        _signal.signal(_SIGINT, _deferred_sigint)
        return current
    if callable(current) and not isinstance(current, _ChainedSigint):
        _signal.signal(_SIGINT, _ChainedSigint(current))
        return current
    return None


class _ChainedSigint:
    """The program's SIGINT handler while the main thread leads a wait: it
    runs (after the event at hand when one is being served), then a
    cancelled asyncio task's wait ends with ``CancelledError``."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    def __call__(self, signum: int, frame: Any) -> None:
        if getattr(_tls, "handling", False):
            _sigint_pending.append(self)
            return
        self.fire(signum, frame)

    def fire(self, signum: int, frame: Any) -> None:
        self.handler(signum, frame)  # the program's own: it may raise (asyncio's second Ctrl-C does)
        deliver_cancellation()


#: asyncio tasks whose cancellation a blocking wait delivered -> the cancel count it delivered
_delivered: Any = None


def deliver_cancellation() -> None:
    """Raise ``CancelledError`` when the asyncio task running in this thread
    has a cancellation that no ``await`` (nor an earlier blocking wait)
    delivered yet: a blocking wait in a task is where it stands instead of an
    ``await``, and is one for cancellation, once per ``cancel()``."""
    global _delivered
    import sys

    asyncio = sys.modules.get("asyncio")
    if asyncio is None or asyncio._get_running_loop() is None:
        return
    task = asyncio.current_task()
    if task is None or not getattr(task, "_must_cancel", False):
        return
    cancelling = getattr(task, "cancelling", None)  # Python >= 3.11
    count = cancelling() if cancelling is not None else 1
    if _delivered is None:
        import weakref

        _delivered = weakref.WeakKeyDictionary()
    if _delivered.get(task, 0) >= count:
        return
    _delivered[task] = count
    raise asyncio.CancelledError


def _raise_pending_sigint() -> None:
    """Deliver the SIGINTs deferred while an event was served."""
    pending = list(_sigint_pending)
    _sigint_pending.clear()
    for item in pending:
        if isinstance(item, _ChainedSigint):
            item.fire(_SIGINT, None)
        else:
            raise KeyboardInterrupt
