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

``Kernel`` holds its loop (startup, shutdown, the thread helpers), the ports,
proc failures and routing (:meth:`Kernel.route`, which both inbound read paths
call under the session's fence), and the components that do the rest, each
with its own state, calling back only what its owner protocol names:

* :class:`~._addresses.AddressBook` (``_addresses``): where procs listen, the
  transport of each scheme;
* :class:`~._sending.SendPath` (``_sending``): send windows, the loop's send
  queue and the outbound sessions (``_outbound._Outbound``), which
  :meth:`Kernel.send` hands every message for another proc;
* :class:`~._accept.InboundServer` (``_accept``): the accept loop, the
  handshake of each inbound session, the sessions the loop reads itself (TLS,
  third-party streams) with their acknowledgements, ``_acker._Acker``; plain-
  socket sessions, once they have shaken hands, go to the poller thread
  (``_inbound.InboundSession`` / ``_poller.Poller``);
* :class:`~._child_watch.ChildWatch` (``_child_watch``): the child processes
  it is handed.

The kernel's methods of the same names (``learn_address``, ``flush``,
``ack_at_once``, ``adopt_child`` ...) delegate to them, so that the layers
above see one ``Kernel``.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

import trio

from monarch_core import settings
from monarch_core._kernel import _wire as W
from monarch_core._kernel._accept import InboundServer
from monarch_core._kernel._acker import _Acker, _dropped  # noqa: F401  (tests patch them here)
from monarch_core._kernel._addresses import AddressBook
from monarch_core._kernel._child_watch import ChildProcess, ChildWatch
from monarch_core._kernel._events import EventBus
from monarch_core._kernel._inbound import SessionFence
from monarch_core._kernel._outbound import _grow_buffer, _Outbound, _raw_socket, _Window
from monarch_core._kernel._poller import Poller
from monarch_core._kernel._ports import PortReceiver
from monarch_core._kernel._sending import SendPath
from monarch_core._kernel._upper import MailboxProtocol, ProcAgentProtocol
from monarch_core.errors import ProtocolError, SupervisionError
from monarch_core.hookspecs import Listener, Stream, Transport

logger = logging.getLogger("monarch.kernel")

__all__ = ["DELIVERY_TIMEOUT", "SEND_WINDOW_BYTES", "SEND_WINDOW_MSGS", "THREADED_INBOUND", "Kernel", "_Outbound"]


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
_F_ACK_SOON = W.F_ACK_SOON
_F_PACKED = W.F_PACKED
_F_SLOW = W.F_TREE | W.F_ACK_SOON  # flags that leave the plain path
_K_ACTOR = W.K_ACTOR
_K_PORT = W.K_PORT
_decode_packed = W.decode_packed
_decode_header = W.decode_header


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
        # Limits of the send windows made from now on (flow control; ``SendPath.window``).
        self.send_window_msgs = SEND_WINDOW_MSGS
        self.send_window_bytes = SEND_WINDOW_BYTES
        self.token: trio.lowlevel.TrioToken | None = None
        self.thread_ident: int | None = None
        self.actors: dict[str, MailboxProtocol] = {}
        self.ports: dict[int, PortReceiver] = {}
        self._port_ids = itertools.count(1)
        self.agent: ProcAgentProtocol | None = None  # the proc agent (see ``_upper``)
        #: proc id -> why it is gone (later sends to it fail at once)
        self.dead: dict[str, str] = {}
        #: this kernel's events (``_events``): ``proc_failed``, emitted ``(proc_id, reason,
        #: stopped)`` on the loop when a proc is found gone
        self.events = EventBus(("proc_failed",))
        self._dead_events: dict[str, trio.Event] = {}
        self._pending: dict[str, set[int]] = {}  # proc id -> reply ports waiting on it
        self.tree_forwarded = 0  # cast-tree messages this proc sent on (tests and benchmarks read it)
        self.tree_batches = 0  # batches of gathered replies this proc sent up a cast tree
        #: (actor mesh key, sender's view id) -> member -> (proc_id, address): the addresses a
        #: forwarder needs, kept from the first message of a sender (``_proc._tree``).
        self.tree_tables: dict[tuple[str, str], dict[int, tuple]] = {}
        self._nursery: trio.Nursery | None = None
        self._listener: Listener | None = None
        self._stopped = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._closing = False
        self._shutdown: trio.Event | None = None  # created on the loop
        # The components (see the module docstring).
        self._book = AddressBook(self.dead)
        self._sender = SendPath(self, self._book)
        self._server = InboundServer(self, self._book)
        self._child_watch = ChildWatch(self)  # the child OS processes this kernel was handed

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
        self._book.learn(self.proc_id, self.address)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._server.accept_loop, self._listener)
            task_status.started()
            self._started.set()
            if after_start is not None:
                nursery.start_soon(after_start)
            await self._shutdown.wait()
            self._closing = True
            nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            await self._listener.aclose()
        self._server.close()

    def stop_loop(self) -> None:
        """Ask the loop to exit (thread-safe).  Sessions are dropped."""
        if self.token is None or self._shutdown is None:
            return
        try:
            self.token.run_sync_soon(self._shutdown.set)
        except trio.RunFinishedError:
            pass

    def join(self, timeout: float | None = None) -> bool:
        """Wait (at most ``timeout`` s) for the loop's thread to end; whether it did."""
        return self._stopped.wait(timeout)

    # ------------------------------------------------------------------ thread helpers
    def in_loop(self) -> bool:
        """Whether the calling thread is the loop's."""
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

    # ------------------------------------------------------------------ addresses (``_addresses``)
    def transport_for(self, address: str) -> Transport:
        """The transport of ``address``'s scheme (resolved once per scheme)."""
        return self._book.transport_for(address)

    def learn_address(self, proc_id: str, address: str) -> None:
        """Record where ``proc_id`` listens (loop thread)."""
        self._book.learn(proc_id, address)

    def expect_proc(self, proc_id: str) -> None:
        """Declare a proc whose address will be learned later (loop thread):
        sessions to it wait instead of dialling."""
        self._book.expect(proc_id)

    async def _wait_address(self, proc_id: str) -> str | None:
        """``proc_id``'s address once known; None once it is dead (loop thread)."""
        return await self._book.wait(proc_id)

    @property
    def _addresses(self) -> dict[str, str]:
        """Proc id -> the address it listens on (read-only use; tests read it)."""
        return self._book.addresses

    # ------------------------------------------------------------------ ports
    def add_port(self, handler: PortReceiver) -> int:
        """Register a port handler; returns its id (thread-safe)."""
        pid = next(self._port_ids)
        self.ports[pid] = handler
        return pid

    def remove_port(self, port_id: int) -> None:
        """Forget a port (thread-safe); messages for it are dropped from now on."""
        self.ports.pop(port_id, None)

    def _fail_port(self, port_id: int, exc: BaseException, proc_id: str | None) -> None:
        h = self.ports.get(port_id)
        if h is not None:
            try:
                h.fail(exc, proc_id)
            except Exception:  # pragma: no cover - handlers must not raise
                logger.exception("port handler failed while failing port %s", port_id)

    # ------------------------------------------------------------------ sending (``_sending``)
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
        and destination).  A message to this proc is routed at once, on the
        calling thread; one to another proc goes to the send path
        (``SendPath.send``).

        Flow control: when the proc's send window is full (``_Window``:
        ``MONARCH_SEND_WINDOW_MB`` / ``MONARCH_SEND_WINDOW_MSGS`` of messages
        not yet acknowledged), the calling thread first waits for room, unless
        it is the kernel's loop thread, a thread serving inbound sessions, or
        ``kind`` is ``K_CONTROL``: those never wait (their messages still
        count).  The wait ends as soon as acknowledgements make room, or when
        waiting is moot (the proc is dead, the session failed, the kernel is
        closing, the delivery timeout passed without an acknowledgement); the
        message then goes on as usual (to be failed, if it cannot be
        delivered).  Otherwise it does not block.  Raises RuntimeError once
        the kernel has shut down.

        ``reply_port`` names a local port to fail if the message cannot be
        delivered.  With ``track`` (the default) the port also expects a
        reply from that proc, so it is failed if the proc dies before
        replying; without it (undeliverable-message return ports) only this
        message's fate matters.
        """
        if proc_id == self.proc_id:
            self.route(kind, flags, header, payload, buffers, self.proc_id)
            return
        self._sender.send(proc_id, address, kind, flags, header, payload, buffers, reply_port, track)

    def _window(self, proc_id: str) -> _Window:
        """The send window to ``proc_id`` (any thread; made on first use)."""
        return self._sender.window(proc_id)

    def send_window(self, proc_id: str) -> tuple[int, int]:
        """Messages and bytes in flight to ``proc_id`` now: handed to
        :meth:`send`, not yet acknowledged (any thread)."""
        return self._sender.in_flight(proc_id)

    async def flush(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every outbound session has had all
        its messages acknowledged (loop thread)."""
        await self._sender.flush(timeout)

    def last_error(self, proc_id: str) -> BaseException | None:
        """The last connection error of the session to ``proc_id``, if any."""
        return self._sender.last_error(proc_id)

    @property
    def _outbound(self) -> dict[str, _Outbound]:
        """Proc id -> its outbound session (read-only use: the launch layer,
        tests and benchmarks read it)."""
        return self._sender.sessions

    @property
    def _windows(self) -> dict[str, _Window]:
        """Proc id -> its send window (read-only use; tests read it)."""
        return self._sender.windows

    @property
    def _tx(self) -> Any:
        """The loop's send queue (read-only use; benchmarks read its length)."""
        return self._sender.tx

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
        self._book.give_up(proc_id)
        if not self._sender.fail_session(proc_id, exc):
            self._fail_pending(proc_id, exc, set())
        self.events.emit("proc_failed", proc_id, reason, stopped)
        # What only a live proc needs goes (``dead`` stays: later sends fail at once; its
        # window goes with its session, ``SendPath._run_session``).
        self._server.forget(proc_id)

    async def inbound_drained(self, proc_id: str, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until no connection from ``proc_id`` is
        being read: what it sent before closing them was routed (loop thread)."""
        await self._server.drained(proc_id, timeout)

    async def wait_dead(self, proc_id: str) -> None:
        """Wait until ``proc_id`` is known to be gone (loop thread)."""
        if proc_id in self.dead:
            return
        ev = self._dead_events.get(proc_id)
        if ev is None:
            ev = self._dead_events[proc_id] = trio.Event()
        await ev.wait()

    def expect_reply(self, proc_id: str, port_id: int) -> None:
        """``port_id`` also waits on ``proc_id`` (a proc a cast-tree message
        reaches or passes through): it fails if that proc dies first (any
        thread)."""
        if proc_id == self.proc_id:
            return
        self._wait_on(proc_id, port_id)
        if proc_id in self.dead:
            self.call_soon(self._fail_port, port_id, self._dead_error(proc_id), proc_id)

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
        if flags & _F_SLOW and self._route_slow(kind, flags, header, payload, buffers, sender):
            return
        h = _decode_packed(sender, kind, header) if flags & _F_PACKED else _decode_header(sender, header)
        if kind == _K_ACTOR:
            if type(h[0]) is not str:  # the actor key, all the kernel reads (see above)
                raise ProtocolError(f"peer {sender} sent a malformed actor message header")
            self.route_actor(h, payload, buffers, sender)
        elif kind == _K_PORT:
            if len(h) != 3 or type(h[0]) is not int or type(h[1]) is not int or type(h[2]) is not int:
                raise ProtocolError(f"peer {sender} sent a malformed port message header")
            port = self.ports.get(h[0])
            if port is None:
                logger.debug("message for closed port %s from %s dropped", h[0], sender)
                return
            port.deliver(h[1], h[2], payload, buffers)
        elif kind == W.K_CONTROL:
            self._route_control(h, payload, buffers, sender)
        else:
            raise ProtocolError(f"peer {sender} sent unexpected message kind {kind}")

    def _route_slow(self, kind: int, flags: int, header: bytes, payload: Any, buffers: list, sender: str) -> bool:
        """The flags that leave the plain path (``_F_SLOW``): acknowledge at
        once (``F_ACK_SOON``), hand a cast-tree message to the forwarder
        (``F_TREE``; a proc without one raises ``ProtocolError``).  True: the
        message was handled here."""
        if flags & _F_ACK_SOON:
            self._server.ack_soon(sender)
        if not flags & W.F_TREE:
            return False
        agent = self.agent
        if kind != _K_ACTOR or agent is None:
            raise ProtocolError(f"peer {sender} sent a cast-tree message this proc cannot forward")
        agent.forward_tree(self, header, payload, buffers, sender)
        return True

    def _route_control(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        """Hand a control message (its decoded header) to the proc agent: on
        the loop, or where it was read for the ops the agent handles on any
        thread (``any_thread_ops``)."""
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

    # ------------------------------------------------------------------ inbound sessions (``_accept``)
    def inbound_socket(self, stream: Stream) -> socket.socket | None:
        """The plain socket under an inbound ``stream`` that has shaken hands,
        its receive buffer grown, when the poller thread is to read the
        session; None when this kernel reads it on its loop
        (``threaded_inbound`` off, or a stream that offers no plain socket:
        TLS, third-party streams)."""
        sock = _raw_socket(stream) if self.threaded_inbound else None
        if sock is not None:
            _grow_buffer(sock, socket.SO_RCVBUF)
        return sock

    def inbound_poller(self) -> Poller:
        """The thread that reads plain-socket inbound sessions (started on
        first use)."""
        return self._server.poller_thread()

    def end_session(self, session: str, fence: SessionFence) -> None:
        """The sender ended ``session`` (BYE): forget it (any thread)."""
        self._server.end_session(session, fence)

    def ack_at_once(self, sender: str | None = None) -> None:
        """From now on acknowledge what ``sender`` sends (None: every sender)
        as soon as it is delivered, and what it sent already now (loop
        thread).  For a sender that is stopping (it waits for its messages to
        be acknowledged before it goes), and for every sender when this proc
        stops (a sender must not take a message it handled for one it lost)."""
        self._server.ack_at_once(sender)

    def acks_at_once(self, sender: str) -> bool:
        """Whether what ``sender`` sends is acknowledged as soon as it is delivered."""
        return self._server.acks_at_once(sender)

    async def settle_acks(self, timeout: float) -> None:
        """Acknowledge everything delivered now and wait (at most ``timeout``
        s) until the loop's own inbound sessions have written it (loop
        thread; the poller's sessions acknowledge synchronously)."""
        await self._server.settle_acks(timeout)

    def peers(self) -> dict[str, str]:
        """Procs that have opened a session to this one, and their addresses."""
        return self._server.peers()

    @property
    def _poller(self) -> Poller | None:
        """The poller thread, if it was started (tests read it)."""
        return self._server.poller

    @property
    def _ackers(self) -> set[_Acker]:
        """The acknowledgers of the inbound sessions read on the loop (tests read them)."""
        return self._server.ackers
