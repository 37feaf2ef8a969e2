"""The kernel's send path to other procs (:class:`SendPath`).

A ``Kernel`` (``_runtime``) holds one, and :meth:`Kernel.send` hands it every
message for another proc.  It owns, per destination proc:

* the send window (``_outbound._Window``: flow control, what was handed to
  ``send`` and not yet acknowledged);
* the outbound session (``_outbound._Outbound``: FIFO, sequence-numbered,
  acknowledged, retransmitted after a reconnect);

and the loop's send queue: messages that cannot be written straight to a
connected idle socket from the calling thread wait there, in order, until the
loop hands them to their session (:meth:`SendPath._drain`).

The session and the window call back into the kernel through
``_outbound.Kernel``; :class:`SendOwner` adds what this path itself calls.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable
from typing import Any, Protocol

import trio

from monarch_core._kernel import _wire as W
from monarch_core._kernel._addresses import AddressBook
from monarch_core._kernel._outbound import Kernel as OutboundKernel
from monarch_core._kernel._outbound import _Outbound, _Window
from monarch_core.errors import UndeliverableMessageError

_FIXED_SIZE = W.FIXED_SIZE
_F_ACK_SOON = W.F_ACK_SOON


class SendOwner(OutboundKernel, Protocol):
    """What a :class:`SendPath` reads and calls back on its owner (the
    ``Kernel``), besides what its sessions and windows do
    (``_outbound.Kernel``)."""

    #: the loop's thread and token (None before the loop runs)
    thread_ident: int | None
    token: trio.lowlevel.TrioToken | None
    #: limits of the windows made from now on (0 or less: no limit)
    send_window_msgs: int
    send_window_bytes: int

    def start_task(self, afn: Callable, *args: Any) -> None: ...

    def _fail_port(self, port_id: int, exc: BaseException, proc_id: str | None) -> None: ...

    def _wait_on(self, proc_id: str, port_id: int) -> None: ...


class SendPath:
    """Send windows, the loop's send queue and the outbound sessions of one
    kernel.  :meth:`send` is thread-safe; the queue is drained, and sessions
    are made and run, on the loop."""

    def __init__(self, owner: SendOwner, addresses: AddressBook) -> None:
        self._owner = owner
        self._addresses = addresses
        #: proc id -> its send window (made on first use, :meth:`window`)
        self.windows: dict[str, _Window] = {}
        #: proc id -> its outbound session (a failed one stays until its task ends)
        self.sessions: dict[str, _Outbound] = {}
        #: messages waiting for the loop: (proc_id, address, kind, flags, header,
        #: payload, buffers, reply_port, track, size)
        self.tx: collections.deque = collections.deque()
        self._tx_scheduled = False

    # ------------------------------------------------------------------ any thread
    def send(self, proc_id: str, address: str | None, kind: int, flags: int, header: bytes, payload: Any,
             buffers: list, reply_port: int | None, track: bool) -> None:
        """Send one message to another proc (any thread): take its room in
        the window (waiting for it when this thread may, see
        ``_Window.take``), then write it straight to the socket if the
        session is connected and idle and nothing waits in the queue before
        it, else queue it for the loop.  The contract is :meth:`Kernel.send`'s."""
        size = _FIXED_SIZE + len(header) + len(payload)
        if buffers:
            size += sum(8 + memoryview(b).nbytes for b in buffers)
        w = self.windows.get(proc_id)
        if w is None:
            w = self.window(proc_id)
        took = w
        # _Window.take, inlined for a window with room (every message pays this)
        with w.lock:
            msgs = w.msgs
            if msgs < w.max_msgs and w.nbytes < w.max_bytes:
                w.msgs = msgs = msgs + 1
                w.nbytes = nbytes = w.nbytes + size
                if msgs >= w.ask_msgs or nbytes >= w.ask_bytes:
                    w.ask_msgs = w.ask_bytes = math.inf
                    flags |= _F_ACK_SOON
                w = None
        if w is not None and w.take(size, self._owner, proc_id, kind):  # full: wait for room if this thread may
            flags |= _F_ACK_SOON
        if self.windows.get(proc_id) is not took:
            # Its proc died and the window went with its session (``_run_session``)
            # while this thread took room in it: the room is taken in the window
            # of now, where the message's drop (``_drop``) gives it back.
            took.release(1, size)
            cur = self.window(proc_id)
            with cur.lock:
                cur.msgs += 1
                cur.nbytes += size
        # (a message waiting in the queue goes first: FIFO per thread and destination)
        if not self.tx and self._direct(proc_id, kind, flags, header, payload, buffers, reply_port, track, size):
            return
        self._queue((proc_id, address, kind, flags, header, payload, buffers, reply_port, track, size))

    def _direct(self, proc_id: str, kind: int, flags: int, header: bytes, payload: Any, buffers: list,
                reply_port: int | None, track: bool, size: int) -> bool:
        """Write the message from this thread if the session to ``proc_id``
        is connected over a plain socket and idle (``_Outbound.try_direct``);
        False: it was not written, queue it."""
        out = self.sessions.get(proc_id)
        if out is None or out.sock is None or out.failed is not None:
            return False
        owner = self._owner
        if reply_port is not None and track:
            owner._wait_on(proc_id, reply_port)
        if not out.try_direct(kind, flags, header, payload, buffers, reply_port, size):
            return False
        if proc_id in owner.dead and reply_port is not None:  # raced with its death
            owner.call_soon(owner._fail_port, reply_port, owner._dead_error(proc_id), proc_id)
        return True

    def _queue(self, item: tuple) -> None:
        """Append ``item`` to the send queue and have the loop drain it
        (now, on the loop thread).  Raises RuntimeError once the loop is gone."""
        self.tx.append(item)
        if self._tx_scheduled:
            return
        self._tx_scheduled = True
        owner = self._owner
        if owner.thread_ident == threading.get_ident():
            self._drain()
            return
        try:
            owner.token.run_sync_soon(self._drain)  # type: ignore[union-attr]
        except trio.RunFinishedError:
            self._tx_scheduled = False
            raise RuntimeError(
                "the monarch kernel has shut down; no more messages can be sent "
                "(was shutdown_context() called?)"
            ) from None

    def window(self, proc_id: str) -> _Window:
        """The send window to ``proc_id`` (any thread; made on first use with
        the owner's ``send_window_msgs`` / ``send_window_bytes``)."""
        w = self.windows.get(proc_id)
        if w is None:
            msgs, nbytes = self._owner.send_window_msgs, self._owner.send_window_bytes
            w = self.windows.setdefault(
                proc_id, _Window(msgs if msgs > 0 else math.inf, nbytes if nbytes > 0 else math.inf)
            )
        return w

    def in_flight(self, proc_id: str) -> tuple[int, int]:
        """Messages and bytes in flight to ``proc_id`` now (any thread)."""
        w = self.windows.get(proc_id)
        return (w.msgs, w.nbytes) if w is not None else (0, 0)

    def last_error(self, proc_id: str) -> BaseException | None:
        """The last connection error of the session to ``proc_id``, if any."""
        out = self.sessions.get(proc_id)
        return out.last_error if out is not None else None

    # ------------------------------------------------------------------ loop thread
    def _drain(self) -> None:
        self._tx_scheduled = False
        tx = self.tx
        while tx:
            # Push before popping: while a message sits between the two,
            # ``send`` must still see ``tx`` non-empty, or a later message
            # from the same thread could take the direct path and overtake it.
            self._push(*tx[0])
            tx.popleft()

    def _push(self, proc_id: str, address: Any, kind: int, flags: int, header: bytes, payload: Any,
              buffers: list, reply_port: int | None, track: bool, size: int) -> None:
        """Hand one queued message to the session to ``proc_id`` (made, and
        its task started, when there is none or it failed), or drop it."""
        owner = self._owner
        if proc_id in owner.dead:
            self._drop(proc_id, size, reply_port, owner._dead_error(proc_id))
            return
        if address is not None and proc_id not in self._addresses.addresses:
            if not isinstance(address, str):
                self._drop(proc_id, size, reply_port, UndeliverableMessageError(f"bad address {address!r}"))
                return
            self._addresses.learn(proc_id, address)
        out = self.sessions.get(proc_id)
        if out is None or out.failed is not None:
            if owner._closing:
                self._drop(proc_id, size, reply_port, RuntimeError("the monarch kernel is shutting down"))
                return
            out = self.sessions[proc_id] = _Outbound(owner, proc_id)
            owner.start_task(self._run_session, out)
        if reply_port is not None and track:
            owner._wait_on(proc_id, reply_port)
        out.push(kind, flags, header, payload, buffers, reply_port, size)

    def _drop(self, proc_id: str, size: int, reply_port: int | None, exc: BaseException) -> None:
        """A message to ``proc_id`` that is not sent: its room in the window
        comes back, and its reply port (if any) fails with ``exc``."""
        self.window(proc_id).release(1, size)
        if reply_port is not None:
            self._owner._fail_port(reply_port, exc, proc_id)

    async def _run_session(self, out: _Outbound) -> None:
        try:
            await out.run()
        finally:
            if self.sessions.get(out.proc_id) is out and out.failed is not None:
                del self.sessions[out.proc_id]
                w = self.windows.get(out.proc_id)
                if out.proc_id in self._owner.dead and w is out.window and not w.msgs and not w.waiters:
                    del self.windows[out.proc_id]  # (a later send to it takes and releases a new one)

    def fail_session(self, proc_id: str, exc: BaseException) -> bool:
        """Fail the live session to ``proc_id`` with ``exc`` (its queued and
        unacknowledged messages fail, and so do the reply ports waiting on
        the proc: ``_Outbound.fail``); False when there is none."""
        out = self.sessions.get(proc_id)
        if out is None or out.failed is not None:
            return False
        out.fail(exc)
        return True

    async def flush(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every live session has had all
        its messages acknowledged."""
        with trio.move_on_after(timeout):
            while any((o.queue or o.unacked) and o.failed is None for o in self.sessions.values()):
                await trio.sleep(0.005)
