"""The kernel's inbound side on its trio loop: the listener's accept loop, the
handshake of each inbound session, the sessions the loop reads itself (TLS,
third-party streams) and their acknowledgements (:class:`_Acker`), and when
senders are acknowledged at once.

Plain-socket sessions are handed, once they have shaken hands, to the poller
thread (``_inbound.InboundSession``, ``_poller.Poller``); both read paths
route through ``Kernel.route`` under the session's fence.

:class:`InboundServing` is a part of ``Kernel`` (a base class of it, so that
its methods are the kernel's own: no call layer, no extra lookup); it uses the
kernel's state that ``Kernel.__init__`` sets up (``_fences``, ``_ackers``,
``_eager_ack``, ``_eager_ack_all``, ``_peers``, ``_poller``, ...).  This module
does not import ``_runtime`` (which imports it).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Any

import trio

from monarch_core._compat import BaseExceptionGroup, first_leaf
from monarch_core._kernel import _wire as W
from monarch_core._kernel._inbound import ACK_DELAY, ACK_EVERY, InboundSession, SessionFence
from monarch_core._kernel._outbound import HANDSHAKE_TIMEOUT, _grow_buffer, _raw_socket
from monarch_core._kernel._throttle import ThrottledLog
from monarch_core.errors import AuthenticationError, ProtocolError, TransportError

if TYPE_CHECKING:
    from monarch_core.hookspecs import Listener, Stream

logger = logging.getLogger("monarch.kernel")


#: Warnings about dropped inbound connections: one line per peer host and
#: reason every 10 s, counting the ones left out (a rejected client retries).
_dropped = ThrottledLog(logger)


class _Acker:
    """Sends cumulative acknowledgements for one inbound session.

    Acknowledgements are off the critical path: one goes out when the read
    buffer drains and ``ACK_EVERY`` messages are unacknowledged, otherwise
    after ``ACK_DELAY`` seconds, so a request/reply exchange costs no extra
    write on either side."""

    ACK_EVERY = ACK_EVERY
    ACK_DELAY = ACK_DELAY

    def __init__(self, stream: Stream, last: int, sender: str = "", eager: bool = False) -> None:
        self.stream = stream
        self.sender = sender
        self.acked = last
        self.last = last
        self.eager = eager  # acknowledge at once (the sender is stopping, or this proc is)
        self.wake = trio.Event()
        self.hurry = False  # the sender asked for the next acknowledgement at once (F_ACK_SOON)
        self.hurried: trio.Event | None = None  # set to cut a delayed acknowledgement's wait short

    def delivered(self, seq: int, drained: bool) -> None:
        self.last = seq
        if drained or seq - self.acked >= self.ACK_EVERY:
            self.wake.set()

    def now(self) -> None:
        """Acknowledge what was delivered without waiting (loop thread)."""
        self.eager = True
        self.wake.set()

    def soon(self) -> None:
        """Acknowledge what is delivered by the time this task runs, without
        the delay, once (loop thread; a message flagged ``F_ACK_SOON``)."""
        self.hurry = True
        self.wake.set()
        if self.hurried is not None:
            self.hurried.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            if self.last - self.acked < self.ACK_EVERY and not self.eager and not self.hurry:
                self.hurried = trio.Event()
                with trio.move_on_after(self.ACK_DELAY):
                    await self.hurried.wait()
                self.hurried = None
            self.hurry = False
            last = self.last
            if last > self.acked:
                await self.stream.send_all(W.FIXED.pack(W.K_ACK, 0, 0, 0, 0, last))
                self.acked = last


class InboundServing:
    """The inbound half of ``Kernel`` (see the module docstring)."""

    # ------------------------------------------------------------------ receiving
    async def _accept_loop(self, listener: Listener) -> None:
        while True:
            try:
                stream = await listener.accept()
            except TransportError as e:
                if self._closing:
                    return
                logger.error("listener on %s failed: %s", self.address, e)
                return
            self._nursery.start_soon(self._serve_inbound, stream)  # type: ignore[union-attr]

    async def _serve_inbound(self, stream: Stream) -> None:
        peer = getattr(stream, "peer", "?")
        acker: _Acker | None = None
        try:
            uid = W.foreign_peer_uid(stream)  # once per connection, before any byte is read
            if uid is not None:
                _dropped.warning(f"uid {uid}", f"refused a connection to {self.address} from a process of uid {uid}: "
                                 f"this process (uid {os.getuid()}) serves Unix-socket peers of its own user only; "
                                 "run the other program as the same user")
                return
            reader = W.FrameReader(stream)
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                hello = await W.read_handshake(reader)
            session = hello.get("session")
            sender = hello.get("proc")
            if not isinstance(session, str) or not isinstance(sender, str):
                raise ProtocolError(f"peer {peer} sent a handshake without session/proc")
            sender_addr = hello.get("address")
            if isinstance(sender_addr, str) and sender_addr:
                self._peers[sender] = sender_addr
                if sender not in self._addresses:
                    self.learn_address(sender, sender_addr)
            # Fence the session's previous connection (it may still be
            # delivering what it buffered) before reading where to resume.
            fence = self._fences.get(session)
            if fence is None:
                fence = self._fences.setdefault(session, SessionFence(sender))
            scope = trio.CancelScope()
            epoch, last = fence.take(scope.cancel)
            reader.prove_by(lambda: fence.last > 0)  # proven once the session delivered a message
            with scope:
                await stream.send_all(W.encode_handshake({"proc": self.proc_id, "last": last}))
                sock = _raw_socket(stream) if self.threaded_inbound else None
                if sock is not None:
                    _grow_buffer(sock, socket.SO_RCVBUF)
                    await self._serve_inbound_thread(sock, reader, session, sender, fence, epoch, last)
                    return
                acker = _Acker(stream, last, sender, eager=self.acks_at_once(sender))
                self._ackers.add(acker)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(acker.run)
                    route, deliver = self.route, fence.deliver
                    while True:
                        kind, flags, seq, header, payload, buffers = await reader.read_message()
                        routed = deliver(epoch, peer, route, kind, flags, seq, header, payload, buffers, sender)
                        if routed:
                            acker.delivered(seq, reader.buffered() < W.FIXED_SIZE)
                        elif routed is None:
                            self.end_session(session, fence)
                            nursery.cancel_scope.cancel()
                            return
        except BaseExceptionGroup as eg:
            W.drop_frames(eg)  # frames of route() & co in these tracebacks hold the message being routed
            e = first_leaf(eg, skip=(trio.Cancelled,))
            if isinstance(e, (ProtocolError, AuthenticationError)):
                _dropped.warning(peer, f"dropping connection from {peer}: {e}")
            elif not isinstance(e, (TransportError, trio.BrokenResourceError, trio.ClosedResourceError, OSError)):
                raise
            else:
                logger.debug("inbound connection from %s ended: %s", peer, str(e))
        except trio.TooSlowError:
            _dropped.warning(peer, f"connection from {peer} sent no handshake within {HANDSHAKE_TIMEOUT:.0f}s; dropped")
        except (ProtocolError, AuthenticationError) as e:
            _dropped.warning(peer, f"dropping connection from {peer}: {e}")
        except (TransportError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            logger.debug("inbound connection from %s ended: %s", peer, str(e))
        finally:
            # This frame can outlive the call in a traceback (trio's nursery errors form cycles that
            # only the cyclic GC frees): it must not keep a message's buffers or the read buffer.
            e = payload = buffers = reader = None
            if acker is not None:
                self._ackers.discard(acker)
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _serve_inbound_thread(self, sock: Any, reader: W.FrameReader, session: str, sender: str,
                                    fence: SessionFence, epoch: int, last: int) -> None:
        """Hand a plain-socket inbound session to the poller thread and wait
        for it to end (see :mod:`._inbound`)."""
        done = trio.Event()
        t = InboundSession(self, sock, reader, session, sender, fence, epoch, last, done)
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
        if self._fences.get(session) is fence:
            del self._fences[session]

    # ------------------------------------------------------------------ acknowledgements
    def _ack_soon(self, sender: str) -> None:
        """A message from ``sender`` asked to be acknowledged at once
        (``F_ACK_SOON``): acknowledge what its sessions delivered (any
        reading thread)."""
        p = self._poller
        if p is not None:
            p.ack_sender_soon(sender)
        if self._ackers and self.in_loop():
            for a in list(self._ackers):
                if a.sender == sender:
                    a.soon()

    def ack_at_once(self, sender: str | None = None) -> None:
        """From now on acknowledge what ``sender`` sends (None: every sender)
        as soon as it is delivered, and what it sent already now (loop
        thread).  For a sender that is stopping (it waits for its messages to
        be acknowledged before it goes), and for every sender when this proc
        stops (a sender must not take a message it handled for one it lost)."""
        if sender is None:
            self._eager_ack_all = True
        else:
            self._eager_ack.add(sender)
        if self._poller is not None:
            self._poller.ack_sender_now(sender)
        for a in list(self._ackers):
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
            while any(a.last > a.acked for a in self._ackers):
                await trio.sleep(0.002)

    def peers(self) -> dict[str, str]:
        """Procs that have opened a session to this one, and their addresses."""
        return dict(self._peers)
