"""The kernel's inbound side on its loop (:class:`InboundServer`).

A ``Kernel`` (``_runtime``) holds one.  It accepts connections on the kernel's
listener and serves each as an inbound session:

* refuses a Unix-socket peer of another user before reading a byte;
* reads the handshake (within ``HANDSHAKE_TIMEOUT``), learns the sender's
  address, fences the session's previous connection (``SessionFence``) and
  answers where to resume;
* hands a plain-socket session to the poller thread (``_inbound`` /
  ``_poller``), or reads it on the loop itself (TLS, third-party streams),
  acknowledging what it delivered with an :class:`~._acker._Acker`;

and it keeps the acknowledgement policy of the proc's senders (at once, or
batched).  Both read paths route each message through the owner's ``route``,
under the session's fence.  Errors of a connection end that connection only:
they are logged (``monarch.kernel``), never raised to the owner.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any, Protocol

import trio

from monarch_core._compat import BaseExceptionGroup, first_leaf
from monarch_core._kernel import _wire as W
from monarch_core._kernel._acker import _Acker, _dropped
from monarch_core._kernel._addresses import AddressBook
from monarch_core._kernel._inbound import InboundSession, SessionFence
from monarch_core._kernel._outbound import HANDSHAKE_TIMEOUT
from monarch_core._kernel._poller import Poller
from monarch_core._kernel._upper import InboundKernel
from monarch_core.errors import AuthenticationError, ProtocolError, TransportError
from monarch_core.hookspecs import Listener, Stream

logger = logging.getLogger("monarch.kernel")

#: Errors that end an inbound connection quietly (DEBUG): the peer went away.
_ENDED = (TransportError, trio.BrokenResourceError, trio.ClosedResourceError, OSError)
#: Errors that drop an inbound connection with a (throttled) WARNING: the peer misbehaved.
_REFUSED = (ProtocolError, AuthenticationError)


class AcceptOwner(InboundKernel, Protocol):
    """What an :class:`InboundServer` reads and calls back on its owner (the
    ``Kernel``), besides what the poller's sessions do (``InboundKernel``)."""

    proc_id: str
    address: str | None
    #: set once the loop is shutting down (a failing listener is then no error)
    _closing: bool

    def start_task(self, afn: Callable, *args: Any) -> None: ...

    def in_loop(self) -> bool: ...

    def inbound_socket(self, stream: Stream) -> socket.socket | None: ...


class InboundServer:
    """Accepts and serves the inbound sessions of one kernel (their tasks
    run on the kernel's loop), and knows how each sender is acknowledged.

    State: the fence of each session (its connections come and go), the
    ackers of the sessions read on the loop, the senders acknowledged at
    once, the procs that opened sessions to this one, and the poller thread
    (started on first use)."""

    def __init__(self, owner: AcceptOwner, addresses: AddressBook) -> None:
        self._owner = owner
        self._addresses = addresses
        #: session id -> the receiving side of that session
        self.fences: dict[str, SessionFence] = {}
        #: inbound sessions read on the loop (TLS, third-party streams)
        self.ackers: set[_Acker] = set()
        self._eager_ack: set[str] = set()  # senders whose messages are acknowledged at once
        self._eager_ack_all = False
        self._peers: dict[str, str] = {}  # procs that opened sessions to us -> their addresses
        #: sender -> its inbound connections being served now (loop thread), and the
        #: tasks waiting for them to end (:meth:`drained`)
        self._open: dict[str, int] = {}
        self._drain_waiters: dict[str, list[trio.Event]] = {}
        #: the thread that reads plain-socket sessions (None until first used)
        self.poller: Poller | None = None
        self._poller_lock = threading.Lock()

    # ------------------------------------------------------------------ sessions
    async def accept_loop(self, listener: Listener) -> None:
        """Serve every connection ``listener`` accepts, each in a task of
        its own, until the listener fails or closes (loop thread)."""
        owner = self._owner
        while True:
            try:
                stream = await listener.accept()
            except TransportError as e:
                if not owner._closing:
                    logger.error("listener on %s failed: %s", owner.address, e)
                return
            owner.start_task(self.serve, stream)

    async def serve(self, stream: Stream) -> None:
        """Serve one inbound connection until it ends, then close it.  Nothing
        is raised but cancellation and unexpected errors: a peer's failure
        or misbehaviour is logged and ends this connection only."""
        peer = getattr(stream, "peer", "?")
        leaf: BaseException | None = None
        try:
            await self._serve(stream, peer)
        except BaseExceptionGroup as eg:
            W.drop_frames(eg)  # frames of route() & co in these tracebacks hold the message being routed
            leaf = first_leaf(eg, skip=(trio.Cancelled,))
            if not isinstance(leaf, _REFUSED + _ENDED):
                raise
            _log_end(peer, leaf)
        except trio.TooSlowError:
            _dropped.warning(peer, f"connection from {peer} sent no handshake within {HANDSHAKE_TIMEOUT:.0f}s; dropped")
        except _REFUSED + _ENDED as e:
            _log_end(peer, e)
        finally:
            leaf = None  # (this frame can outlive the call in a traceback: see ``_read_on_loop``)
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _serve(self, stream: Stream, peer: str) -> None:
        """Shake hands, fence the session's previous connection, then read the
        session on the poller thread or on the loop until it ends."""
        uid = W.foreign_peer_uid(stream)  # once per connection, before any byte is read
        if uid is not None:
            _dropped.warning(f"uid {uid}", f"refused a connection to {self._owner.address} from a process of uid "
                             f"{uid}: this process (uid {os.getuid()}) serves Unix-socket peers of its own user "
                             "only; run the other program as the same user")
            return
        reader = W.FrameReader(stream)
        try:
            session, sender = await self._handshake(reader, peer)
            self._open[sender] = self._open.get(sender, 0) + 1
            try:
                await self._serve_session(stream, reader, session, sender)
            finally:
                self._closed_one(sender)
        finally:
            del reader  # (not kept by a traceback of this frame: it holds the read buffer)

    async def _serve_session(self, stream: Stream, reader: W.FrameReader, session: str, sender: str) -> None:
        """Serve the session of a connection whose handshake was read."""
        try:
            # Fence the session's previous connection (it may still be
            # delivering what it buffered) before reading where to resume.
            fence = self.fences.get(session)
            if fence is None:
                fence = self.fences.setdefault(session, SessionFence(sender))
            scope = trio.CancelScope()
            epoch, last = fence.take(scope.cancel)
            reader.prove_by(lambda: fence.last > 0)  # proven once the session delivered a message
            with scope:
                await stream.send_all(W.encode_handshake({"proc": self._owner.proc_id, "last": last}))
                sock = self._owner.inbound_socket(stream)
                if sock is not None:
                    await self._hand_to_poller(sock, reader, session, sender, fence, epoch, last)
                else:
                    await self._read_on_loop(stream, reader, session, sender, fence, epoch, last)
        finally:
            del reader  # (as in ``_serve``)

    def _closed_one(self, sender: str) -> None:
        n = self._open[sender] - 1
        if n:
            self._open[sender] = n
            return
        del self._open[sender]
        for ev in self._drain_waiters.pop(sender, ()):
            ev.set()

    async def drained(self, sender: str, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until no connection from ``sender`` is
        being read any more: everything it wrote before it closed them was
        routed (loop thread).  A proc's exit closes its connections, so for an
        ended proc this is as soon as the reads reach the end of what it
        sent; the timeout covers a socket its descendants still hold."""
        if not self._open.get(sender):
            return
        ev = trio.Event()
        self._drain_waiters.setdefault(sender, []).append(ev)
        with trio.move_on_after(timeout):
            await ev.wait()

    async def _handshake(self, reader: W.FrameReader, peer: str) -> tuple[str, str]:
        """Read the peer's handshake: its session id and proc id; learn the
        address it listens on.  Raises ``ProtocolError`` for a malformed one,
        ``trio.TooSlowError`` when none came in time."""
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            hello = await W.read_handshake(reader)
        session = hello.get("session")
        sender = hello.get("proc")
        if not isinstance(session, str) or not isinstance(sender, str):
            raise ProtocolError(f"peer {peer} sent a handshake without session/proc")
        sender_addr = hello.get("address")
        if isinstance(sender_addr, str) and sender_addr:
            self._peers[sender] = sender_addr
            if sender not in self._addresses.addresses:
                self._addresses.learn(sender, sender_addr)
        return session, sender

    async def _read_on_loop(self, stream: Stream, reader: W.FrameReader, session: str, sender: str,
                            fence: SessionFence, epoch: int, last: int) -> None:
        """Read the session on the loop, routing each message under its
        fence, with an acker writing the acknowledgements, until it ends (BYE,
        or an error, raised)."""
        payload: Any = None
        buffers: list | None = None
        acker = _Acker(stream, last, sender, eager=self.acks_at_once(sender))
        self.ackers.add(acker)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(acker.run)
                route, deliver, peer = self._owner.route, fence.deliver, reader.peer
                while True:
                    kind, flags, seq, header, payload, buffers = await reader.read_message()
                    routed = deliver(epoch, peer, route, kind, flags, seq, header, payload, buffers, sender)
                    if routed:
                        acker.delivered(seq, reader.buffered() < W.FIXED_SIZE)
                    elif routed is None:
                        self.end_session(session, fence)
                        nursery.cancel_scope.cancel()
                        return
        finally:
            # This frame can outlive the call in a traceback (trio's nursery errors form cycles that
            # only the cyclic GC frees): it must not keep a message's buffers.
            payload = buffers = None
            del reader
            self.ackers.discard(acker)

    async def _hand_to_poller(self, sock: socket.socket, reader: W.FrameReader, session: str, sender: str,
                              fence: SessionFence, epoch: int, last: int) -> None:
        """Hand a plain-socket session to the poller thread and wait for it
        to end (see :mod:`._inbound`); its error, if any, is raised here."""
        done = trio.Event()
        t = InboundSession(self._owner, sock, reader, session, sender, fence, epoch, last, done)
        t.start()
        try:
            await done.wait()
        finally:
            if not done.is_set():  # cancelled: end the thread before the socket is closed
                t.stop()
                with trio.CancelScope(shield=True):
                    await done.wait()
        if t.error is not None:
            try:
                raise t.error
            finally:
                t.error = None  # no cycle: error -> traceback -> this frame -> t -> error

    def end_session(self, session: str, fence: SessionFence) -> None:
        """The sender ended ``session`` (BYE): forget it (any thread)."""
        if self.fences.get(session) is fence:
            del self.fences[session]

    def forget(self, proc_id: str) -> None:
        """``proc_id`` is gone: forget its address as a peer and the fences
        of its sessions (it never reconnects; loop thread)."""
        self._peers.pop(proc_id, None)
        for session in [k for k, f in self.fences.items() if f.sender == proc_id]:
            self.fences.pop(session, None)

    def peers(self) -> dict[str, str]:
        """Procs that have opened a session to this one, and their addresses."""
        return dict(self._peers)

    def poller_thread(self) -> Poller:
        """The thread that reads plain-socket inbound sessions (started on
        first use; any thread)."""
        p = self.poller
        if p is None:
            with self._poller_lock:
                p = self.poller
                if p is None:
                    p = self.poller = Poller()
        return p

    def close(self) -> None:
        """The loop is done: stop the poller thread, if it was started."""
        if self.poller is not None:
            self.poller.close()

    # ------------------------------------------------------------------ acknowledgements
    def ack_soon(self, sender: str) -> None:
        """A message from ``sender`` asked to be acknowledged at once
        (``F_ACK_SOON``): acknowledge what its sessions delivered (any
        reading thread)."""
        p = self.poller
        if p is not None:
            p.ack_sender_soon(sender)
        if self.ackers and self._owner.in_loop():
            for a in list(self.ackers):
                if a.sender == sender:
                    a.soon()

    def ack_at_once(self, sender: str | None = None) -> None:
        """From now on acknowledge what ``sender`` sends (None: every sender)
        as soon as it is delivered, and what it sent already now (loop
        thread)."""
        if sender is None:
            self._eager_ack_all = True
        else:
            self._eager_ack.add(sender)
        if self.poller is not None:
            self.poller.ack_sender_now(sender)
        for a in list(self.ackers):
            if sender is None or a.sender == sender:
                a.now()

    def acks_at_once(self, sender: str) -> bool:
        """Whether what ``sender`` sends is acknowledged as soon as it is delivered."""
        return self._eager_ack_all or sender in self._eager_ack

    async def settle_acks(self, timeout: float) -> None:
        """Acknowledge everything delivered now and wait (at most ``timeout``
        s) until the loop's own inbound sessions have written it (loop
        thread; the poller's sessions acknowledge synchronously)."""
        self.ack_at_once()
        with trio.move_on_after(timeout):
            while any(a.last > a.acked for a in self.ackers):
                await trio.sleep(0.002)


def _log_end(peer: str, e: BaseException) -> None:
    """Log why an inbound connection from ``peer`` ended: a refusal as a
    throttled WARNING, a peer that went away at DEBUG."""
    if isinstance(e, _REFUSED):
        _dropped.warning(peer, f"dropping connection from {peer}: {e}")
    else:
        logger.debug("inbound connection from %s ended: %s", peer, str(e))
