"""The mailbox: an actor's thread, its asyncio loop and its queues.

:class:`Mailbox` (``_host.ActorHost`` holds one) runs the actor's own thread
(and loop, once it needs one) and hands it what arrives, one item at a time,
in arrival order:
endpoint messages (run by the invoker's ``run_message``), a stop, and the
undeliverable messages it sent.  Items from any thread go through one FIFO
(``incoming``), drained once per wake-up; while the actor is idle a message is
handled right in the callback that brought it (the idle fast path: one loop
pass per message instead of three).  Control items (``__supervise__`` of a
failed owned mesh) go ahead of the queued messages, or run as tasks beside
an endpoint suspended at an ``await`` (it may be waiting for them); a stop
drops them.  What the mailbox needs of its actor is :class:`MailboxOwner`.

An actor starts without an asyncio loop (:meth:`Mailbox._run_sync`): its
thread constructs it and runs its endpoint messages as they come, waiting
for them on a queue.  Making a loop, running the thread's main task on it
and waking it through its self-pipe cost a proc about as much as the rest
of a spawn and first call together; a synchronous actor (none of its
endpoints ``async def``) needs none of it until something awaits.  The first
item that needs a loop -- an async actor's construction done, an endpoint
that returns an awaitable, a stop, a control or undeliverable item, a death's
cleanup -- makes the loop, and from then on the thread runs on it
(:meth:`Mailbox._main`), with the same order and the same semantics.

The proc's first actor may read the proc's sockets itself while idle
(``Poller.attach``): a request then wakes this thread directly
(:meth:`Mailbox._serve_sockets`).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import queue
import threading
from _thread import get_ident as _get_ident
from typing import Any, Awaitable, Callable, Coroutine, Optional, Protocol

from monarch_core._proc import _state

logger = logging.getLogger("monarch.actor")

#: mailbox items are ``(head, a, b)``: a header tuple (an endpoint message: payload, buffers) or one of these
_STOP = object()  # (reason, reply): stop after what is queued
_AWAIT = object()  # (awaitable, None): a message started on the idle fast path, awaiting
_SUPERVISE = object()  # (failure, None): a control item, ``__supervise__``
_UNDELIVERABLE = object()  # (exception, None): a message this actor sent came back

RunMessage = Callable[[Any, Any, list], Optional[Awaitable[Any]]]


class MailboxOwner(Protocol):
    """What the mailbox calls back of its actor (``_host.ActorHost``)."""

    display_name: str

    @property
    def _stop_requested(self) -> bool: ...

    @property
    def _abandoned(self) -> bool: ...

    async def _construct(self) -> None: ...

    def _construct_sync(self) -> None: ...

    def _wants_loop(self) -> bool: ...

    async def _stop(self, reason: str, reply: tuple | None) -> None: ...

    async def _on_supervise(self, failure: Any) -> None: ...

    async def _on_undeliverable(self, exc: BaseException) -> None: ...

    def _finish_stop(self) -> None: ...

    def _reply_gone(self, h: tuple) -> None: ...


class Mailbox:
    """One actor's thread, loop and queues (see the module's docstring).

    :meth:`start` starts the thread, which constructs the actor and then
    handles the items: without a loop while it can, on :attr:`loop` from the
    first item that needs one (the proc's first actor, which reads the
    proc's sockets while idle, has its loop from the start)."""

    def __init__(self, owner: MailboxOwner, kernel: Any) -> None:
        self.owner = owner
        self.poller: Any = None  # the proc's inbound poller, when this actor's loop reads the proc's sockets
        self.ident = 0  # the actor thread's id
        sel = None
        if getattr(kernel, "threaded_inbound", False) and getattr(kernel, "inbound_poller", None) is not None:
            poller = kernel.inbound_poller()
            sel = poller.attach()
        self._loop: asyncio.AbstractEventLoop | None = None
        if sel is not None:
            self._loop = asyncio.SelectorEventLoop(sel)
            self._loop.add_reader(poller.fileno(), self._serve_sockets)
            self.poller = poller
        #: the thread runs without a loop (``_run_sync``); posts wake it through ``_wake_sync``
        self._sync = sel is None
        self._mode_lock = threading.Lock()  # a sync-mode post's wake-up against the switch to the loop
        self._wake_sync: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.pending: collections.deque = collections.deque()  # taken by the actor's loop, in order
        self.incoming: collections.deque = collections.deque()  # from any thread (``post``)
        #: supervision events (any thread), taken before the queued messages (``take_control``)
        self.control: collections.deque = collections.deque()
        #: tasks beside the queue (concurrent endpoints' bodies, ``__supervise__`` beside an await)
        self.tasks: set[asyncio.Task] = set()
        self.idle = False
        #: the main task awaits the message being handled (an async endpoint suspended at an ``await``)
        self.awaiting = False
        self.closed = False  # the thread has ended (or the actor was abandoned): what arrives is answered at once
        self._waiter: asyncio.Future | None = None
        self._wake_scheduled = False
        self._serving = False  # this actor's loop is reading the proc's sockets
        self._run: RunMessage = _not_started
        self.ctx = contextvars.Context()
        self.ctx.run(_state.current_actor.set, owner)
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The actor's asyncio loop, made on first use (by the actor's thread:
        a task it starts, a death's cleanup); the thread runs on it from the
        item it is handling on."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.new_event_loop()
        return loop

    @property
    def own_loop(self) -> asyncio.AbstractEventLoop | None:
        """The actor's loop if it has one yet (reading this makes none)."""
        return self._loop

    def start(self, run: RunMessage) -> None:
        """Start the actor's thread; endpoint messages go to ``run`` (``Invoker.run_message``)."""
        self._run = run
        self._thread = threading.Thread(target=self._thread_main, name=f"monarch-actor-{self.owner.display_name}",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ arrivals (any thread)

    def post(self, item: tuple) -> None:
        """Hand ``item`` to the actor's thread (any thread).  Items travel
        through one FIFO; the actor's loop is woken once per batch, not once
        per item (each wake-up is a syscall, and an interrupt on another CPU)."""
        self.incoming.append(item)
        if self._serving:  # read by this actor's own loop: handled when the read is done
            return
        if self.closed:
            self.orphan_incoming()
            return
        if not self._wake_scheduled:
            if self._sync:  # the thread runs without a loop (unless it switches meanwhile)
                with self._mode_lock:
                    if self._sync:
                        if not self._wake_scheduled:
                            self._wake_scheduled = True
                            self._wake_sync.put(None)
                        return
            self._wake_scheduled = True
            try:
                if _get_ident() == self.ident:  # read by this actor's own loop: no wake-up needed
                    self.loop.call_soon(self._drain_incoming, context=self.ctx)
                else:
                    self.loop.call_soon_threadsafe(self._drain_incoming, context=self.ctx)
            except RuntimeError:  # the loop is closed: the actor thread is gone
                self.orphan_incoming()

    def post_control(self, item: tuple) -> None:
        """Hand a control item to the actor's loop, ahead of the queued messages (any thread)."""
        self.control.append(item)
        if self.closed:
            self._orphan_control()
            return
        if self._sync:  # the thread runs without a loop: it makes one for this
            with self._mode_lock:
                if self._sync:
                    self._wake_sync.put(None)
                    return
        try:  # the actor's loop takes it (``take_control``), before the queued messages
            if _get_ident() == self.ident:
                self.loop.call_soon(self.take_control, context=self.ctx)
            else:
                self.loop.call_soon_threadsafe(self.take_control, context=self.ctx)
        except RuntimeError:  # the loop is closed: the actor thread is gone
            self._orphan_control()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task:
        """Run ``coro`` as a task beside the queue (on the actor's loop); a stop cancels it."""
        t = self.loop.create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        return t

    async def cancel_tasks(self) -> None:
        """Cancel the tasks beside the queue and wait for them to end."""
        tasks = [t for t in self.tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def quiet(self) -> bool:
        """Nothing is being handled, queued or running beside the queue."""
        return self.idle and not self.has_items() and not self.tasks

    def has_items(self) -> bool:
        """Something is queued (taken, arrived or control)."""
        return bool(self.pending or self.incoming or self.control)

    def take_all(self) -> list[tuple]:
        """Empty the queues of messages (those taken, then those arrived) and return their items."""
        items = list(self.pending)
        self.pending.clear()
        while self.incoming:
            items.append(self.incoming.popleft())
        return items

    def take_pending(self) -> list[tuple]:
        """Empty the queue the loop had already taken and return its items (any thread)."""
        items = []
        while True:
            try:
                items.append(self.pending.popleft())
            except IndexError:
                return items

    # ------------------------------------------------------------ on the actor's loop

    def _serve_sockets(self) -> None:
        """The proc's sockets are readable (this actor's loop reads them while
        idle): read, then handle what came for this actor right here."""
        self._serving = True
        try:
            self.poller.service()
        finally:
            self._serving = False
        if self.incoming:
            self.ctx.run(self._drain_incoming)

    def _drain_incoming(self) -> None:
        self._wake_scheduled = False
        incoming = self.incoming
        control = self.control
        put = self._put
        while incoming:
            if control:  # (a message handled right here may take long: control goes first)
                self.take_control()
            put(incoming.popleft())

    def take_control(self) -> None:
        """Put the control items that arrived ahead of the queued messages,
        after the message being handled (an awaiting one that started while
        the actor was idle, ``_AWAIT``, counts as being handled) -- or, while
        that message is suspended at an ``await``, run them at once as tasks
        beside it (an endpoint may be waiting for its ``__supervise__``, as in
        the reference, where it runs on the actor's loop); once a stop
        is requested they are dropped: the stop stops the meshes this actor
        owns, and ``__supervise__`` does not run during it."""
        control = self.control
        if not control:  # (taken already, by the drain or the main loop)
            return
        if self.owner._stop_requested:  # an event arriving once the stop is asked for is dropped (the reference's)
            control.clear()
            return
        if self.awaiting:  # the message being handled awaits: supervise now, beside it (it may wait for this)
            while control:  # (cancelled by a stop, as the reference's pending __supervise__ is)
                self.spawn(self.owner._on_supervise(control.popleft()[1]))
            return
        pending = self.pending
        at = 1 if pending and pending[0][0] is _AWAIT else 0
        while control:
            pending.insert(at, control.popleft())
            at += 1
        self._wake()

    def _put(self, item: tuple) -> None:
        """A mailbox item arrived (on the actor's loop)."""
        pending = self.pending
        if self.idle and not pending and type(item[0]) is tuple:  # a message, the actor idle: run it here
            rest = self._run(item[0], item[1], item[2])
            if rest is None:
                return
            item = (_AWAIT, rest, None)  # the handler awaits: the main task finishes it, in order
        pending.append(item)
        self._wake()

    def _wake(self) -> None:
        self.idle = False
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _thread_main(self) -> None:
        self.ident = _get_ident()
        # The loop is not made the thread's current event loop: sync code of the
        # actor (endpoints, __init__, hooks) sees no asyncio loop (``_invoke.loopless``).
        try:
            constructed = self._sync
            if self._sync:
                if not self._run_sync():
                    return
                self._to_loop()
            loop = self.loop
            loop.run_until_complete(self.ctx.run(loop.create_task, self._main(constructed)))
        except BaseException:  # pragma: no cover - _run_sync and _main handle everything
            logger.exception("actor %s loop crashed", self.owner.display_name)
        finally:
            made = self._loop
            try:
                pending = [t for t in asyncio.all_tasks(made) if not t.done()] if made is not None else []
                for t in pending:
                    t.cancel()
                if pending and made is not None:
                    made.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            finally:
                if self.poller is not None and made is not None:
                    self.poller.detach(made)
                if made is not None:
                    made.close()
                self.closed = True
                self.orphan_incoming()
                self._orphan_control()

    def _run_sync(self) -> bool:
        """Construct the actor and run its endpoint messages without a loop,
        each in the actor's context, waiting for them on ``_wake_sync``,
        until an item needs a loop: True (the thread goes on on the loop,
        with that item first), or the actor was stopped without this thread:
        False."""
        owner = self.owner
        ctx = self.ctx
        ctx.run(owner._construct_sync)
        if self._loop is not None or owner._wants_loop():
            return True
        incoming = self.incoming
        run = self._run
        wake = self._wake_sync.get
        while True:
            if owner._abandoned:  # stopped without this thread: run nothing more
                return False
            if self.control or self._loop is not None:  # (a death's cleanup made the loop)
                return True
            if not incoming:
                self.idle = True
                wake()
                self.idle = False
                self._wake_scheduled = False  # (before the queue is read: a later post wakes it again)
                continue
            head = incoming[0][0]
            if type(head) is not tuple:  # a stop, an undeliverable message: on the loop
                return True
            try:
                _h, a, b = incoming.popleft()
            except IndexError:  # (taken by a stop that completed without this thread)
                continue
            rest = ctx.run(run, head, a, b)
            if rest is not None:  # the handler awaits: on the loop, before what is queued
                self.pending.appendleft((_AWAIT, rest, None))
                return True

    def _to_loop(self) -> None:
        """From now on posts wake the thread through its loop."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        with self._mode_lock:
            self._sync = False
            self._wake_scheduled = False

    async def _main(self, constructed: bool = False) -> None:
        owner = self.owner
        _state.current_actor.set(owner)
        if not constructed:
            await owner._construct()
        elif self.incoming:  # what arrived while the thread ran without a loop, after what it took
            self._drain_incoming()
        pending = self.pending
        control = self.control
        loop = self.loop
        run = self._run
        while True:
            if owner._abandoned:  # it was stopped without this thread: run nothing more
                return
            if control:  # a failure to supervise arrived: before the queued messages
                self.take_control()
            if not pending:
                self._waiter = loop.create_future()
                self.idle = True
                await self._waiter
                self.idle = False
                continue
            head, a, b = pending.popleft()
            if head is _STOP:
                await owner._stop(a, b)
                return
            if head is _SUPERVISE:
                await owner._on_supervise(a)
                continue
            if head is _UNDELIVERABLE:
                await owner._on_undeliverable(a)
                continue
            rest = a if head is _AWAIT else run(head, a, b)
            if rest is not None:
                self.awaiting = True
                try:
                    await rest
                finally:
                    self.awaiting = False

    # ------------------------------------------------------------ after the thread

    def _orphan_control(self) -> None:
        """Log the failures that reached an actor whose thread has ended."""
        while True:
            try:
                failure = self.control.popleft()[1]
            except IndexError:
                return
            logger.warning("failure of %s arrived after its owner %s ended", failure.mesh_name,
                           self.owner.display_name)

    def orphan_incoming(self) -> None:
        """Answer items that reached an actor whose thread has ended (any thread)."""
        while True:
            try:
                item = self.incoming.popleft()
            except IndexError:
                return
            h = item[0]
            if h is _STOP:
                self.owner._finish_stop()
            elif type(h) is tuple:
                self.owner._reply_gone(h)
            elif h is _UNDELIVERABLE:
                logger.warning("undeliverable message for ended actor %s: %s", self.owner.display_name, item[1])


def _not_started(h: Any, payload: Any, buffers: list) -> None:  # pragma: no cover - start() replaces it
    raise RuntimeError("the mailbox's thread was not started")
