"""Inbound sessions read by a dedicated thread (plain sockets only).

The trio loop is a fine place to *manage* connections but a costly place to
*read* them: every message it reads costs a pass through trio's scheduler
before the loop thread gives the GIL back, and the thread that consumes the
message (an actor's thread, a caller blocked in ``Future.get``) waits for it.
On a two-core machine that was ~80 µs per hop, twice per call.

So once an inbound session over a plain socket has shaken hands, a thread of
its own reads it: it blocks in ``poll`` (GIL released), reads whatever is
there, routes every complete message, and sends the session's cumulative
acknowledgements itself (the socket's only writer).  The frame parsing is the
same :class:`~monarch_core._kernel._wire.FrameReader` code, driven
synchronously over a blocking source, so every limit it enforces still holds.
TLS and third-party streams keep the trio path.

The trio task that owns the connection waits for the thread; when it is
cancelled (kernel shutdown) it shuts the socket down, which ends the thread,
and only then lets the connection be closed (no descriptor reuse race).
"""

from __future__ import annotations

import logging
import select
import socket
import threading
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


class InboundThread:
    """Reads one inbound session to its end (see the module docstring)."""

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
        self.reader = reader
        self.session = session
        self.sender = sender
        self.source = _BlockingSource(sock, reader.peer, last)
        self.error: BaseException | None = None
        self.bye = False
        self._done = done  # a trio.Event, set on the loop when the thread ends
        self._thread = threading.Thread(target=self._main, name=f"monarch-in-{sender}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the thread soon (any thread): its next read fails."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _main(self) -> None:
        try:
            self._read_loop()
        except (ProtocolError, AuthenticationError, ConnectionClosed) as e:
            self.error = e
        except BaseException as e:  # a bug in routing: drop this connection, say so
            logger.exception("inbound session from %s failed", self.sender)
            self.error = e
        finally:
            try:
                self.kernel.call_soon(self._done.set)
            except RuntimeError:  # the loop is gone: nobody waits any more
                pass

    def _read_loop(self) -> None:
        k = self.kernel
        reader = self.reader
        reader.stream = self.source  # type: ignore[assignment]
        source = self.source
        route = k.route
        inbound_last = k._inbound_last
        session, sender = self.session, self.sender
        last = source.last
        read_message = reader.read_message
        fixed = W.FIXED_SIZE
        while True:
            kind, flags, seq, header, payload, buffers = drive(read_message())
            if kind == W.K_BYE:
                inbound_last.pop(session, None)
                self.bye = True
                return
            if seq <= last:
                continue  # a retransmission we already delivered
            if seq != last + 1:
                raise ProtocolError(f"peer {reader.peer} skipped from seq {last} to {seq}")
            last = seq
            inbound_last[session] = seq
            source.last = seq
            route(kind, flags, header, payload, buffers, sender)
            if seq - source.acked >= ACK_EVERY and reader.buffered() < fixed:
                source.send_ack()
