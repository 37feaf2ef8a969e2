"""The proc kernel: one trio loop per process that owns every socket.

Responsibilities:

* listen on this proc's address and serve inbound sessions;
* keep one outbound *session* per destination proc: FIFO, sequence-numbered,
  acknowledged, retransmitted after a reconnect, de-duplicated by the receiver;
* route arriving messages to actor mailboxes, ports and the proc agent;
* spawn local OS processes and watch them, so that a dead proc fails whatever
  was waiting on it.

Threads: in the client the loop runs in one background thread; in a worker
process it is the main thread.  The thread-safe entry points are
:meth:`Kernel.send`, :meth:`Kernel.call_soon`, :meth:`Kernel.run`,
:meth:`Kernel.add_port` / :meth:`Kernel.remove_port`.  Everything else runs on
the loop.  No plugin hook is called on the per-message path: the transport is
resolved once per address scheme.

``Kernel`` holds startup, addresses, ports, the send path, failures,
routing and the inbound side on its loop (the accept loop, the handshake of
each inbound session, the sessions the loop reads itself -- TLS, third-party
streams -- with their acknowledgements, ``_acker._Acker``; plain-socket
sessions, once they have shaken hands, go to the poller thread,
``_inbound.InboundSession`` / ``_poller.Poller``; both read paths route
through :meth:`Kernel.route` under the session's fence).  It holds a
:class:`~._child_watch.ChildWatch` (the child processes it is handed), which
its ``adopt_child`` ... ``children`` methods delegate to.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import trio

from monarch_core import settings
from monarch_core._compat import BaseExceptionGroup, first_leaf
from monarch_core._kernel import _wire as W
from monarch_core._kernel._acker import _Acker, _dropped
from monarch_core._kernel._child_watch import ChildProcess, ChildWatch
from monarch_core._kernel._inbound import InboundSession, SessionFence
from monarch_core._kernel._outbound import HANDSHAKE_TIMEOUT, _grow_buffer, _Outbound, _raw_socket, _Window
from monarch_core._kernel._poller import Poller
from monarch_core._kernel._ports import PortReceiver
from monarch_core._kernel._upper import MailboxProtocol, ProcAgentProtocol
from monarch_core.errors import (AuthenticationError, ProtocolError, SupervisionError, TransportError,
                                 UndeliverableMessageError)
from monarch_core.hookspecs import Listener, Stream, Transport

logger = logging.getLogger("monarch.kernel")


#: Seconds a message may stay unacknowledged (reconnecting included) before it
#: is returned to its sender as undeliverable.
DELIVERY_TIMEOUT: float = settings.get("MONARCH_DELIVERY_TIMEOUT")
#: Read inbound sessions over plain sockets on a thread of their own
#: (``MONARCH_THREADED_INBOUND=0``: on the trio loop, as TLS sessions are);
#: a kernel takes the value when it is made (``Kernel.threaded_inbound``).
THREADED_INBOUND: bool = settings.get("MONARCH_THREADED_INBOUND")
#: The send window: how much this kernel holds for one destination proc,
#: handed to :meth:`Kernel.send` and not yet acknowledged by it (waiting for the
#: loop, queued, or written and unacknowledged): MONARCH_SEND_WINDOW_MB MiB and
#: MONARCH_SEND_WINDOW_MSGS messages.  While either is reached, a sender waits
#: for room, except on the kernel's loop thread, on a thread serving inbound
#: sessions, and for control messages (see :class:`_Window`); so what is held
#: is at most the window plus one message (a message larger than the window
#: goes alone).  0 (or less): no limit.  The defaults are far above the
#: receiver's acknowledgement cadence (``ACK_EVERY`` = 256 messages,
#: ``ACK_BYTES`` = 8 MiB), so that the window fills only when the receiver
#: falls behind: docs/performance.md.
SEND_WINDOW_BYTES = int(settings.get("MONARCH_SEND_WINDOW_MB") * (1 << 20))
SEND_WINDOW_MSGS: int = settings.get("MONARCH_SEND_WINDOW_MSGS")
_FIXED_SIZE = W.FIXED_SIZE
_F_ACK_SOON = W.F_ACK_SOON
_F_PACKED = W.F_PACKED
_F_SLOW = W.F_TREE | W.F_ACK_SOON  # flags that leave the plain path
_K_ACTOR = W.K_ACTOR
_decode_packed = W.decode_packed


class Kernel:
    """The per-process kernel.  See the module docstring."""

    def __init__(self, *, proc_id: str, name: str, transport: Transport, bind_spec: str | None = None) -> None:
        self.proc_id = proc_id
        self.name = name
        self.transport = transport
        self.bind_spec = bind_spec or transport.default_bind_spec()
        self.address: str | None = None
        self.delivery_timeout = DELIVERY_TIMEOUT
        self.threaded_inbound = THREADED_INBOUND  # inbound plain-socket sessions go to the poller thread
        # Send windows (flow control), one per destination proc; limits of new ones.
        self.send_window_msgs = SEND_WINDOW_MSGS
        self.send_window_bytes = SEND_WINDOW_BYTES
        self._windows: dict[str, _Window] = {}
        self.token: trio.lowlevel.TrioToken | None = None
        self.thread_ident: int | None = None
        self.actors: dict[str, MailboxProtocol] = {}
        self.ports: dict[int, PortReceiver] = {}
        self._port_ids = itertools.count(1)
        self.agent: ProcAgentProtocol | None = None  # the proc agent (see ``_upper``)
        self.dead: dict[str, str] = {}
        self.on_proc_failed: list[Callable[[str, str, bool], None]] = []
        self._outbound: dict[str, _Outbound] = {}
        self._addresses: dict[str, str] = {}
        self._addr_events: dict[str, trio.Event] = {}
        self._pending: dict[str, set[int]] = {}
        self._ackers: set[_Acker] = set()  # inbound sessions read on the loop (TLS, third-party streams)
        self._eager_ack: set[str] = set()  # senders whose messages are acknowledged at once
        self._eager_ack_all = False
        #: Forwards cast-tree messages (set by the proc agent; see ``_proc._tree``).
        self.tree_handler: Callable[..., None] | None = None
        self.tree_forwarded = 0  # cast-tree messages this proc sent on (tests and benchmarks read it)
        self.tree_batches = 0  # batches of gathered replies this proc sent up a cast tree
        #: (actor mesh key, sender's view id) -> member -> (proc_id, address): the addresses a
        #: forwarder needs, kept from the first message of a sender (``_proc._tree``).
        self.tree_tables: dict[tuple[str, str], dict[int, tuple]] = {}
        #: session id -> the receiving side of that session (its connections come and go)
        self._fences: dict[str, SessionFence] = {}
        self._transports: dict[str, Transport] = {}
        self._tx: collections.deque = collections.deque()
        self._tx_scheduled = False
        self._nursery: trio.Nursery | None = None
        self._listener: Listener | None = None
        self._stopped = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._closing = False
        self._child_watch = ChildWatch(self)  # the child OS processes this kernel was handed
        self._dead_events: dict[str, trio.Event] = {}
        self._peers: dict[str, str] = {}  # procs that opened sessions to us -> their addresses
        self._shutdown: trio.Event | None = None  # created on the loop
        self._poller: Poller | None = None
        self._poller_lock = threading.Lock()

    # ------------------------------------------------------------------ startup
    def start_thread(self, *, name: str = "monarch-kernel") -> None:
        """Run the kernel loop in a daemon thread; return once it is listening."""
        threading.Thread(target=self._thread_main, name=name, daemon=True).start()
        self._started.wait()
        if self._start_error is not None:
            raise self._start_error

    def _thread_main(self) -> None:
        try:
            trio.run(self.serve)
        except BaseException as e:  # pragma: no cover - logged, the loop is gone
            if not self._started.is_set():  # (it failed to start: start_thread raises it)
                self._start_error = e
            else:
                logger.exception("monarch kernel loop crashed")
        finally:
            self._started.set()
            self._stopped.set()

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED, after_start: Callable | None = None) -> None:
        """Run the kernel until :meth:`stop_loop` is called."""
        self.token = trio.lowlevel.current_trio_token()
        self.thread_ident = threading.get_ident()
        self._shutdown = trio.Event()
        self._listener = await self.transport.listen(self.bind_spec)  # (a failure: start_thread raises it)
        self.address = self._listener.address
        self._addresses[self.proc_id] = self.address
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._accept_loop, self._listener)
            task_status.started()
            self._started.set()
            if after_start is not None:
                nursery.start_soon(after_start)
            await self._shutdown.wait()
            self._closing = True
            nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            await self._listener.aclose()
        if self._poller is not None:
            self._poller.close()

    def inbound_poller(self) -> Poller:
        """The thread that reads plain-socket inbound sessions (started on
        first use)."""
        p = self._poller
        if p is None:
            with self._poller_lock:
                p = self._poller
                if p is None:
                    p = self._poller = Poller()
        return p

    def stop_loop(self) -> None:
        """Ask the loop to exit (thread-safe).  Sessions are dropped."""
        if self.token is None or self._shutdown is None:
            return
        try:
            self.token.run_sync_soon(self._shutdown.set)
        except trio.RunFinishedError:
            pass

    def join(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    # ------------------------------------------------------------------ thread helpers
    def in_loop(self) -> bool:
        return threading.get_ident() == self.thread_ident

    def call_soon(self, fn: Callable, *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon (thread-safe; FIFO)."""
        if self.token is None:
            raise RuntimeError("the monarch kernel is not running")
        try:
            self.token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            raise RuntimeError("the monarch kernel has shut down") from None

    def run(self, afn: Callable, *args: Any) -> Any:
        """Run ``await afn(*args)`` on the loop and return its result (blocks;
        not callable from the loop thread)."""
        if self.in_loop():
            raise RuntimeError("Kernel.run called from the kernel loop (would deadlock)")
        return trio.from_thread.run(afn, *args, trio_token=self.token)

    def start_task(self, afn: Callable, *args: Any) -> None:
        """Start a background task on the kernel nursery (loop thread only)."""
        assert self._nursery is not None
        self._nursery.start_soon(afn, *args)

    # ------------------------------------------------------------------ child processes (``_child_watch``)
    def adopt_child(self, proc_id: str, proc: ChildProcess, *, describe: str) -> None:
        """Watch ``proc``, the OS process of ``proc_id`` that this process
        started (loop thread): when it exits without :meth:`expect_exit`,
        :meth:`proc_failed` is called with its exit status."""
        self._child_watch.adopt_child(proc_id, proc, describe=describe)

    def child_starting(self, proc_id: str) -> None:
        """``proc_id`` is starting and its spawn reports its failure to start
        (``ChildWatch.child_starting``; loop thread)."""
        self._child_watch.child_starting(proc_id)

    def child_started(self, proc_id: str) -> None:
        """``proc_id`` has started: its unexpected exit is a WARNING again (any thread)."""
        self._child_watch.child_started(proc_id)

    def expect_exit(self, proc_id: str) -> None:
        """``proc_id`` is being stopped on purpose: its end is not a failure."""
        self._child_watch.expect_exit(proc_id)

    def exit_expected(self, proc_id: str) -> bool:
        """Whether ``proc_id``'s end was announced as a stop (:meth:`expect_exit`)."""
        return self._child_watch.exit_expected(proc_id)

    def kill_hung(self, proc_id: str, silent_for: float) -> None:
        """Kill a child proc that stopped answering heartbeats (loop thread)."""
        self._child_watch.kill_hung(proc_id, silent_for)

    def child(self, proc_id: str) -> ChildProcess | None:
        """The adopted OS process of ``proc_id``, if it is still watched."""
        return self._child_watch.child(proc_id)

    def children(self) -> dict[str, dict[str, Any]]:
        """The adopted children still watched: proc id -> its entry (``ChildWatch``)."""
        return self._child_watch.children()

    # ------------------------------------------------------------------ addresses
    def transport_for(self, address: str) -> Transport:
        scheme = address.split("://", 1)[0]
        t = self._transports.get(scheme)
        if t is None:
            from monarch_core._plugins import registry

            t = registry().transport(scheme)
            self._transports[scheme] = t
        return t

    def learn_address(self, proc_id: str, address: str) -> None:
        """Record where ``proc_id`` listens (loop thread)."""
        self._addresses[proc_id] = address
        ev = self._addr_events.pop(proc_id, None)
        if ev is not None:
            ev.set()

    def expect_proc(self, proc_id: str) -> None:
        """Declare a proc whose address will be learned later (loop thread):
        sessions to it wait instead of dialling."""
        if proc_id not in self._addresses and proc_id not in self._addr_events:
            self._addr_events[proc_id] = trio.Event()

    async def _wait_address(self, proc_id: str) -> str | None:
        while True:
            a = self._addresses.get(proc_id)
            if a is not None:
                return a
            if proc_id in self.dead:
                return None
            ev = self._addr_events.get(proc_id)
            if ev is None:
                ev = self._addr_events[proc_id] = trio.Event()
            await ev.wait()

    # ------------------------------------------------------------------ ports
    def add_port(self, handler: PortReceiver) -> int:
        """Register a port handler; returns its id (thread-safe)."""
        pid = next(self._port_ids)
        self.ports[pid] = handler
        return pid

    def remove_port(self, port_id: int) -> None:
        self.ports.pop(port_id, None)

    def _fail_port(self, port_id: int, exc: BaseException, proc_id: str | None) -> None:
        h = self.ports.get(port_id)
        if h is not None:
            try:
                h.fail(exc, proc_id)
            except Exception:  # pragma: no cover - handlers must not raise
                logger.exception("port handler failed while failing port %s", port_id)

    # ------------------------------------------------------------------ sending
    def send(
        self,
        proc_id: str,
        address: str | None,
        kind: int,
        flags: int,
        header: bytes,
        payload: Any,
        buffers: list,
        reply_port: int | None = None,
        track: bool = True,
    ) -> None:
        """Send one message to a proc (thread-safe, FIFO per calling thread
        and destination).

        Flow control: when the proc's send window is full (``_Window``:
        ``MONARCH_SEND_WINDOW_MB`` / ``MONARCH_SEND_WINDOW_MSGS`` of messages
        not yet acknowledged), the calling thread first waits for room, unless
        it is the kernel's loop thread, a thread serving inbound sessions, or
        ``kind`` is ``K_CONTROL``: those never wait (their messages still
        count).  The wait ends as soon as acknowledgements make room, or when
        waiting is moot (the proc is dead, the session failed, the kernel is
        closing, the delivery timeout passed without an acknowledgement); the
        message then goes on as usual (to be failed, if it cannot be
        delivered).  Otherwise it does not block.

        ``reply_port`` names a local port to fail if the message cannot be
        delivered.  With ``track`` (the default) the port also expects a
        reply from that proc, so it is failed if the proc dies before
        replying; without it (undeliverable-message return ports) only this
        message's fate matters.
        """
        if proc_id == self.proc_id:
            self.route(kind, flags, header, payload, buffers, self.proc_id)
            return
        size = _FIXED_SIZE + len(header) + len(payload)
        if buffers:
            size += sum(8 + memoryview(b).nbytes for b in buffers)
        w = self._windows.get(proc_id)
        if w is None:
            w = self._window(proc_id)
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
        if w is not None and w.take(size, self, proc_id, kind):  # full: wait for room if this thread may
            flags |= _F_ACK_SOON
        if not self._tx:
            out = self._outbound.get(proc_id)
            if out is not None and out.sock is not None and out.failed is None:
                if reply_port is not None and track:
                    self._wait_on(proc_id, reply_port)
                if out.try_direct(kind, flags, header, payload, buffers, reply_port, size):
                    if proc_id in self.dead and reply_port is not None:  # raced with its death
                        self.call_soon(self._fail_port, reply_port, self._dead_error(proc_id), proc_id)
                    return
        self._tx.append((proc_id, address, kind, flags, header, payload, buffers, reply_port, track, size))
        if not self._tx_scheduled:
            self._tx_scheduled = True
            if self.thread_ident == threading.get_ident():
                self._drain_tx()
            else:
                try:
                    self.token.run_sync_soon(self._drain_tx)  # type: ignore[union-attr]
                except trio.RunFinishedError:
                    self._tx_scheduled = False
                    raise RuntimeError(
                        "the monarch kernel has shut down; no more messages can be sent "
                        "(was shutdown_context() called?)"
                    ) from None

    def _drain_tx(self) -> None:
        self._tx_scheduled = False
        tx = self._tx
        while tx:
            # Push before popping: while a message sits between the two,
            # ``send`` must still see ``_tx`` non-empty, or a later message
            # from the same thread could take the direct path and overtake it.
            self._push(*tx[0])
            tx.popleft()

    def _push(self, proc_id, address, kind, flags, header, payload, buffers, reply_port, track=True,
              size=0) -> None:
        if proc_id in self.dead:
            self._drop(proc_id, size, reply_port, self._dead_error(proc_id))
            return
        if address is not None and proc_id not in self._addresses:
            if not isinstance(address, str):
                self._drop(proc_id, size, reply_port, UndeliverableMessageError(f"bad address {address!r}"))
                return
            self.learn_address(proc_id, address)
        out = self._outbound.get(proc_id)
        if out is None or out.failed is not None:
            if self._closing:
                self._drop(proc_id, size, reply_port, RuntimeError("the monarch kernel is shutting down"))
                return
            out = _Outbound(self, proc_id)
            self._outbound[proc_id] = out
            assert self._nursery is not None
            self._nursery.start_soon(self._run_outbound, out)
        if reply_port is not None and track:
            self._wait_on(proc_id, reply_port)
        out.push(kind, flags, header, payload, buffers, reply_port, size)

    def _drop(self, proc_id: str, size: int, reply_port: int | None, exc: BaseException) -> None:
        """A message to ``proc_id`` that is not sent: its room in the window
        comes back, and its reply port (if any) fails with ``exc``."""
        self._window(proc_id).release(1, size)
        if reply_port is not None:
            self._fail_port(reply_port, exc, proc_id)

    def _window(self, proc_id: str) -> _Window:
        """The send window to ``proc_id`` (any thread; created on first use)."""
        w = self._windows.get(proc_id)
        if w is None:
            msgs, nbytes = self.send_window_msgs, self.send_window_bytes
            w = self._windows.setdefault(
                proc_id, _Window(msgs if msgs > 0 else math.inf, nbytes if nbytes > 0 else math.inf)
            )
        return w

    def send_window(self, proc_id: str) -> tuple[int, int]:
        """Messages and bytes in flight to ``proc_id`` now: handed to
        :meth:`send`, not yet acknowledged (any thread)."""
        w = self._windows.get(proc_id)
        return (w.msgs, w.nbytes) if w is not None else (0, 0)

    async def _run_outbound(self, out: _Outbound) -> None:
        try:
            await out.run()
        finally:
            if self._outbound.get(out.proc_id) is out and out.failed is not None:
                del self._outbound[out.proc_id]
                w = self._windows.get(out.proc_id)
                if out.proc_id in self.dead and w is out.window and not w.msgs and not w.waiters:
                    del self._windows[out.proc_id]  # (a later send to it takes and releases a new one)

    async def flush(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every outbound session has had all
        its messages acknowledged (loop thread)."""
        with trio.move_on_after(timeout):
            while any((o.queue or o.unacked) and o.failed is None for o in self._outbound.values()):
                await trio.sleep(0.005)

    def _wait_on(self, proc_id: str, port_id: int) -> None:
        """Remember that ``port_id`` waits on ``proc_id`` (any thread)."""
        s = self._pending.get(proc_id)
        if s is None:
            s = self._pending.setdefault(proc_id, set())
        s.add(port_id)

    def reply_done(self, proc_id: str, port_id: int) -> None:
        """Forget that ``port_id`` waits on ``proc_id`` (any thread)."""
        s = self._pending.get(proc_id)
        if s is not None:
            s.discard(port_id)

    # ------------------------------------------------------------------ failures
    def _fail_pending(self, proc_id: str, exc: BaseException, ports: set[int]) -> None:
        """Fail ``ports`` and every reply port still waiting on ``proc_id``, once each."""
        pending = self._pending.pop(proc_id, None)
        if pending:
            ports |= pending
        for port_id in ports:
            self._fail_port(port_id, exc, proc_id)

    def _dead_error(self, proc_id: str) -> SupervisionError:
        return SupervisionError(self.dead.get(proc_id) or f"proc {proc_id} is gone")

    def proc_failed(self, proc_id: str, reason: str, stopped: bool = False) -> None:
        """Mark ``proc_id`` dead (loop thread): its pending calls fail with
        ``reason``, later sends fail at once, listeners are told (``stopped``:
        it was stopped on purpose, which is not a failure)."""
        if proc_id in self.dead:
            return
        stopped = stopped or self._child_watch.exit_expected(proc_id)
        self.dead[proc_id] = reason
        dev = self._dead_events.pop(proc_id, None)
        if dev is not None:
            dev.set()
        exc = SupervisionError(reason)
        ev = self._addr_events.pop(proc_id, None)
        if ev is not None:
            ev.set()
        out = self._outbound.get(proc_id)
        if out is not None and out.failed is None:
            out.fail(exc)
        else:
            self._fail_pending(proc_id, exc, set())
        for cb in list(self.on_proc_failed):
            try:
                cb(proc_id, reason, stopped)
            except Exception:
                logger.exception("proc-failure listener raised")
        # What only a live proc needs goes (``dead`` stays: later sends fail at once; its
        # window goes with its session, ``_run_outbound``).
        self._peers.pop(proc_id, None)
        for session in [k for k, f in self._fences.items() if f.sender == proc_id]:  # it never reconnects
            self._fences.pop(session, None)

    async def wait_dead(self, proc_id: str) -> None:
        """Wait until ``proc_id`` is known to be gone (loop thread)."""
        if proc_id in self.dead:
            return
        ev = self._dead_events.get(proc_id)
        if ev is None:
            ev = self._dead_events[proc_id] = trio.Event()
        await ev.wait()

    def last_error(self, proc_id: str) -> BaseException | None:
        """The last connection error of the session to ``proc_id``, if any."""
        out = self._outbound.get(proc_id)
        return out.last_error if out is not None else None

    # ------------------------------------------------------------------ routing
    def route(self, kind: int, flags: int, header: bytes, payload: Any, buffers: list, sender: str) -> None:
        """Deliver one message that arrived for this proc (any thread).

        A header of the wrong shape raises :class:`ProtocolError` (the
        connection that carried it is dropped); nothing else is raised.  Of an
        actor message's header the kernel checks only the actor key (a str):
        the rest of its shape is the actor layer's, checked where the message
        enters it (``MailboxProtocol.enqueue``, ``ProcAgentProtocol.no_such_actor``),
        which raises the same way.
        """
        if flags & _F_SLOW:
            if flags & _F_ACK_SOON:
                self._ack_soon(sender)
            if flags & W.F_TREE:
                handler = self.tree_handler
                if kind != W.K_ACTOR or handler is None:
                    raise ProtocolError(f"peer {sender} sent a cast-tree message this proc cannot forward")
                handler(self, header, payload, buffers, sender)
                return
        h = _decode_packed(sender, kind, header) if flags & _F_PACKED else W.decode_header(sender, header)
        if kind == _K_ACTOR:
            if type(h[0]) is not str:  # the actor key, all the kernel reads (see above)
                raise ProtocolError(f"peer {sender} sent a malformed actor message header")
            self.route_actor(h, payload, buffers, sender)
        elif kind == W.K_PORT:
            if len(h) != 3 or type(h[0]) is not int or type(h[1]) is not int or type(h[2]) is not int:
                raise ProtocolError(f"peer {sender} sent a malformed port message header")
            port = self.ports.get(h[0])
            if port is None:
                logger.debug("message for closed port %s from %s dropped", h[0], sender)
                return
            port.deliver(h[1], h[2], payload, buffers)
        elif kind == W.K_CONTROL:
            if not isinstance(h[0], str):
                raise ProtocolError(f"peer {sender} sent a malformed control message header")
            if self.agent is None:
                logger.warning("control message %r from %s but no proc agent", h[0], sender)
                return
            # (ops the agent handles on any thread -- a proc's output lines -- run where they were read:
            # before a reply read after them on the same session wakes its caller)
            if self.in_loop() or h[0] in getattr(self.agent, "any_thread_ops", ()):
                self.agent.handle_control(h, payload, buffers, sender)
            else:
                self.call_soon(self.agent.handle_control, h, payload, buffers, sender)
        else:
            raise ProtocolError(f"peer {sender} sent unexpected message kind {kind}")

    def route_actor(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        """Hand an actor message (its decoded 9-field header; one with an
        extension, a traced call's trace context, has it as a tenth) to its
        actor, or to the agent when the actor is not (yet) here; either
        raises :class:`ProtocolError` for a header of the wrong shape.
        Without an agent (a bare kernel) the message is dropped."""
        actor = self.actors.get(h[0])
        if actor is None:
            if self.agent is not None:
                self.agent.no_such_actor(h, payload, buffers, sender)
            return
        actor.enqueue(h, payload, buffers, sender)

    def expect_reply(self, proc_id: str, port_id: int) -> None:
        """``port_id`` also waits on ``proc_id`` (a proc a cast-tree message
        reaches or passes through): it fails if that proc dies first (any
        thread)."""
        if proc_id == self.proc_id:
            return
        self._wait_on(proc_id, port_id)
        if proc_id in self.dead:
            self.call_soon(self._fail_port, port_id, self._dead_error(proc_id), proc_id)


    # ------------------------------------------------------------------ inbound sessions
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
        # (declared: the finally clause drops what they refer to)
        leaf: BaseException | None
        payload: Any
        buffers: list | None
        reader: W.FrameReader | None
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
            leaf = first_leaf(eg, skip=(trio.Cancelled,))
            if isinstance(leaf, (ProtocolError, AuthenticationError)):
                _dropped.warning(peer, f"dropping connection from {peer}: {leaf}")
            elif not isinstance(leaf, (TransportError, trio.BrokenResourceError, trio.ClosedResourceError, OSError)):
                raise
            else:
                logger.debug("inbound connection from %s ended: %s", peer, str(leaf))
        except trio.TooSlowError:
            _dropped.warning(peer, f"connection from {peer} sent no handshake within {HANDSHAKE_TIMEOUT:.0f}s; dropped")
        except (ProtocolError, AuthenticationError) as e:
            _dropped.warning(peer, f"dropping connection from {peer}: {e}")
        except (TransportError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            logger.debug("inbound connection from %s ended: %s", peer, str(e))
        finally:
            # This frame can outlive the call in a traceback (trio's nursery errors form cycles that
            # only the cyclic GC frees): it must not keep a message's buffers or the read buffer.
            leaf = payload = buffers = reader = None
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
