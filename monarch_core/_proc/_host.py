"""ActorHost: runs one actor instance in this process.

Each actor gets its own thread running its own asyncio loop.  Async endpoints
run as coroutines on that loop (so ``asyncio.sleep``/``gather`` work); sync
endpoints run directly on the same thread, which only blocks this actor.
Messages are handled one at a time, in arrival order, except bodies of
``@concurrent_endpoint`` methods, which run as tasks.

:class:`ActorHost` is the whole runtime side of an actor: its thread and
loop, construction, stop, failure and supervision, and each endpoint message
from its header to its reply (``_run_message``: look the endpoint up, run it
-- sync, async or concurrent -- tell the runtime's observer, send the result
or the error to the caller), and the refusals of messages it will not handle.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import inspect
import logging
import threading
import time
from _thread import get_ident as _get_ident
from typing import TYPE_CHECKING, Any, Protocol

from monarch_core._proc import _construction, _lifecycle, _output, _serial, _state, _tree
from monarch_core._proc._port import (
    _DroppingPort,
    Port,
    ReturnPort,
    send_raw_to_port,
    send_to_port,
    this_proc_and_host,
    wrap_exception,
)
from monarch_core._kernel import _frames
from monarch_core._kernel import _wire as W
from monarch_core._mesh._shape import Extent, Point
from monarch_core.errors import ProtocolError, SupervisionError

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel


class HostAgent(Protocol):
    """The proc agent as an :class:`ActorHost` sees it: what the host reads
    and calls back (``_agent.ProcAgent`` satisfies it; that module imports
    this one, so it is not named here)."""

    kernel: Kernel
    #: the process's runtime (``monarch_core._launch``): its ``observer``
    runtime: Any
    #: set once the proc's bootstrap ran (``init_error``: how it failed)
    proc_ready: threading.Event
    init_error: BaseException | None
    #: seconds an actor's stop may take before it completes without the actor's thread
    stop_grace: float

    def actor_failed(self, host: ActorHost, cause: str, category: str, chain: list[dict]) -> dict: ...

    def actor_stopped(self, host: ActorHost, reason: str) -> None: ...

    def reply_gone(self, h: tuple, host: ActorHost) -> None: ...

    def _reply_error(self, h: tuple, exc: BaseException) -> None: ...

    async def stop_owned_async(self, host: ActorHost) -> None: ...

    def stop_meshes(self, meshes: list) -> None: ...


logger = logging.getLogger("monarch.actor")

_STOP = object()
_now = time.perf_counter_ns
_nbytes = _serial.nbytes
_get_running_loop = asyncio._get_running_loop
_set_running_loop = asyncio._set_running_loop


class UndeliverableMessage:
    """What ``Actor._handle_undeliverable_message(self, message)`` receives:
    ``error`` (an ``UndeliverableMessageError`` naming the destination and why).
    Return True to swallow it; otherwise the sending actor fails."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __str__(self) -> str:
        return str(self.error)

    def __repr__(self) -> str:
        return f"UndeliverableMessage({self.error!r})"

_AWAIT = object()
_SUPERVISE = object()
_UNDELIVERABLE = object()
CLEANUP_TIMEOUT = 10.0


class ActorHost:
    """The runtime side of one actor (``context().actor_instance`` is a view of it: ``_actor._context``)."""

    def __init__(
        self,
        agent: HostAgent,
        key: str,
        mesh_name: str,
        rank: int,
        labels: tuple,
        sizes: tuple,
        init_reply: tuple | None,
        payload: Any,
        buffers: list,
        class_name: str = "",
        owner: tuple | None = None,
        trace: bytes | None = None,
    ) -> None:
        self.agent = agent
        self.observer = agent.runtime.observer  # the runtime's (``_observer``): what this actor records
        self.owner = owner  # (proc_id, address, owning actor key or "")
        self.key = key
        self.name = mesh_name
        self.mesh_extent = Extent(labels, sizes)
        self.rank = Point(rank, self.mesh_extent)
        self.class_name = class_name
        #: ``module.Qualname`` of its class once known (the reference's failure reports name it so)
        self.class_path: str | None = None
        self.display_name = f"{mesh_name}{_coords(self.rank)}"
        self.actor_id = f"{agent.kernel.proc_id}.{mesh_name}[{rank}]"
        self.proc_id = agent.kernel.proc_id
        self.instance: Any = None
        self.init_error: BaseException | None = None
        self.failure: BaseException | None = None
        self.stopped = False
        self.owned: list[Any] = []  # meshes spawned by this actor (stopped with it)
        self._init: tuple[Any, Any, Any] = (init_reply, payload, buffers)  # (reply port, payload, buffers)
        self._init_trace = trace  # the spawn's trace context (``__init__`` records under it)
        self._init_reply: tuple | None = init_reply
        self._extents: dict[tuple, Extent] = {(labels, sizes): self.mesh_extent}
        self._methods: dict[str, tuple] = {}  # endpoint name -> (class, property or None, function)
        self._stats: dict[str, Any] = {}  # endpoint name -> its server-side stat (False: not instrumented)
        self.span_metas: dict[str, tuple] = {}  # endpoint name -> its server spans' meta (the observer's)
        self._concurrent: set[asyncio.Task] = set()
        self._current_reply: tuple | None = None
        self._stop_lock = threading.Lock()
        self._stop_replies: list[tuple] = []
        self._stop_requested = False
        self._stop_reason = ""
        self._abandoned = False  # stopped while its thread was stuck (see ``_stop_overdue``)
        self._busy: str | None = None  # "__init__" while it runs (named if a stop gives up on it)
        self._chain: list[dict] = []  # the cascade that failed this actor (first failure first), if any
        self._finished = False
        self._return_ref: tuple | None = None
        self._after_death_task: asyncio.Task | None = None
        self._watchdog: Any = None  # the stop's watchdog (a trio cancel scope on the kernel loop)
        # The proc's first actor reads the proc's sockets itself while idle
        # (see ``Poller.attach``): a request wakes this thread directly.
        self._poller: Any = None
        self._ident = 0
        sel = None
        kernel = agent.kernel
        if getattr(kernel, "threaded_inbound", False) and getattr(kernel, "inbound_poller", None) is not None:
            poller = kernel.inbound_poller()
            sel = poller.attach()
        self.loop: asyncio.AbstractEventLoop
        if sel is not None:
            self.loop = asyncio.SelectorEventLoop(sel)
            self.loop.add_reader(poller.fileno(), self._serve_sockets)
            self._poller = poller
        else:
            self.loop = asyncio.new_event_loop()
        # The mailbox: items arrive through ``_put`` on the actor's loop.  While
        # the actor is idle a message is handled right there, in the callback
        # that brought it (one loop pass per message instead of three).
        self._pending: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._idle = False
        self._incoming: collections.deque = collections.deque()  # from other threads
        #: supervision events (any thread), taken before the queued messages (``_take_control``)
        self._control: collections.deque = collections.deque()
        #: the main task awaits the message being handled (an async endpoint suspended at an ``await``)
        self._awaiting = False
        self._wake_scheduled = False
        self._serving = False  # this actor's loop is reading the proc's sockets
        self._closed = False
        self._ctx = contextvars.Context()
        self._ctx.run(_state.current_actor.set, self)
        self._thread = threading.Thread(target=self._thread_main, name=f"monarch-actor-{self.display_name}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- public-ish
    def describe(self) -> str:
        """The actor in words, for failure texts: ``trainers{'gpus': 1/4}
        (Trainer) on proc procs0{'gpus': 1/4} on host node7``."""
        proc, host = this_proc_and_host()
        where = f" on {proc}" if proc else " in the client"
        if "on host " not in where:
            where += f" on host {host}"
        return f"{self.display_name} ({self.class_name}){where}"

    def enqueue(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        """Queue an endpoint message from proc ``sender`` (any thread): ``h``
        is its header, 9 fields (a traced call's context as a tenth, bytes).
        A header of another shape raises :class:`ProtocolError`: the kernel
        checks only the key, and drops the connection that carried it."""
        if not (len(h) == 9 or (len(h) == 10 and type(h[9]) is bytes)) or type(h[1]) is not str:
            raise ProtocolError(f"peer {sender} sent a malformed actor message header")
        self._post((h, payload, buffers))

    def _post(self, item: tuple) -> None:
        """Hand ``item`` to the actor's thread (any thread).  Items travel
        through one FIFO; the actor's loop is woken once per batch, not once
        per item (each wake-up is a syscall, and an interrupt on another CPU)."""
        self._incoming.append(item)
        if self._serving:  # read by this actor's own loop: handled when the read is done
            return
        if self._closed:
            self._orphan_incoming()
            return
        if not self._wake_scheduled:
            self._wake_scheduled = True
            try:
                if _get_ident() == self._ident:  # read by this actor's own loop: no wake-up needed
                    self.loop.call_soon(self._drain_incoming, context=self._ctx)
                else:
                    self.loop.call_soon_threadsafe(self._drain_incoming, context=self._ctx)
            except RuntimeError:  # the loop is closed: the actor thread is gone
                self._orphan_incoming()

    def _serve_sockets(self) -> None:
        """The proc's sockets are readable (this actor's loop reads them while
        idle): read, then handle what came for this actor right here."""
        self._serving = True
        try:
            self._poller.service()
        finally:
            self._serving = False
        if self._incoming:
            self._ctx.run(self._drain_incoming)

    def _drain_incoming(self) -> None:
        self._wake_scheduled = False
        incoming = self._incoming
        control = self._control
        put = self._put
        while incoming:
            if control:  # (a message handled right here may take long: control goes first)
                self._take_control()
            put(incoming.popleft())

    def _take_control(self) -> None:
        """Put the control items that arrived ahead of the queued messages,
        after the message being handled (an awaiting one that started while
        the actor was idle, ``_AWAIT``, counts as being handled) -- or, while
        that message is suspended at an ``await``, run them at once as tasks
        beside it (an endpoint may be waiting for its ``__supervise__``, as in
        the reference, where it runs on the actor's loop); once a stop
        is requested they are dropped: the stop stops the meshes this actor
        owns, and ``__supervise__`` does not run during it."""
        control = self._control
        if not control:  # (taken already, by the drain or the main loop)
            return
        if self._stop_requested:  # an event arriving once the stop is asked for is dropped (the reference's)
            control.clear()
            return
        if self._awaiting:  # the message being handled awaits: supervise now, beside it (it may wait for this)
            while control:
                t = self.loop.create_task(self._on_supervise(control.popleft()[1]))
                self._concurrent.add(t)  # (cancelled by a stop, as the reference's pending __supervise__ is)
                t.add_done_callback(self._concurrent.discard)
            return
        pending = self._pending
        at = 1 if pending and pending[0][0] is _AWAIT else 0
        while control:
            pending.insert(at, control.popleft())
            at += 1
        self._idle = False
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _orphan_control(self) -> None:
        """Log the failures that reached an actor whose thread has ended."""
        while True:
            try:
                failure = self._control.popleft()[1]
            except IndexError:
                return
            logger.warning("failure of %s arrived after its owner %s ended", failure.mesh_name, self.display_name)

    def _orphan_incoming(self) -> None:
        """Answer items that reached an actor whose thread has ended."""
        while True:
            try:
                item = self._incoming.popleft()
            except IndexError:
                return
            h = item[0]
            if h is _STOP:
                self._finish_stop()
            elif type(h) is tuple:
                self.agent.reply_gone(h, self)
            elif h is _UNDELIVERABLE:
                logger.warning("undeliverable message for ended actor %s: %s", self.display_name, item[1])

    def request_stop(self, reason: str, reply: tuple | None) -> None:
        """Ask the actor to stop after the messages already queued (any
        thread).  ``reply`` gets ``None`` once it has stopped; a request to an
        actor that is stopping or stopped is answered when it is done."""
        with self._stop_lock:
            if self._finished:
                if reply is not None:
                    send_to_port(reply, self.rank.rank, W.S_VALUE, None)
                return
            if reply is not None:
                self._stop_replies.append(reply)
            if self._stop_requested:
                return
            self._stop_requested = True
            self._stop_reason = reason
        self._post((_STOP, reason, None))
        grace = getattr(self.agent, "stop_grace", 0.0)
        if grace > 0:
            kernel = self.agent.kernel
            try:
                kernel.call_soon(kernel.start_task, self._stop_watchdog, grace)
            except RuntimeError:  # the kernel is shutting down: the proc ends anyway
                pass

    def stop_if_idle(self, reason: str) -> bool:
        """Stop now, on the calling thread, if stopping has nothing to run:
        the actor is constructed and idle (no message being handled or
        queued, no concurrent task, no failure being cleaned up), has no
        ``__cleanup__`` and owns no mesh.  Its thread is not woken: it stays
        parked, refusing whatever still reaches it, until the process ends --
        so this is for a stopping proc only (``ProcAgent.stop_everything``),
        where waking thousands of idle actor threads one by one is what a
        stop would otherwise cost.  Returns False (nothing changed) when the
        actor must stop on its own thread (:meth:`request_stop`)."""
        instance = self.instance
        if (instance is None or self._poller is not None or self._busy is not None or self.owned
                or self._concurrent or self._after_death_task is not None
                or getattr(instance, "__cleanup__", None) is not None):
            return False
        with self._stop_lock:
            if self._finished or self._stop_requested or not self._idle or self._pending or self._incoming \
                    or self._control or self._current_reply is not None:
                return False
            self.stopped = True  # a message taken from now on is refused (``_run_message`` checks after taking it)
            if self._current_reply is not None or self._pending or self._incoming or self._control:
                self.stopped = False  # one was taken meanwhile: the actor stops on its thread, after it
                return False
            self._stop_requested = True
            self._stop_reason = reason
        self.agent.actor_stopped(self, reason)
        self._finish_stop()
        return True

    async def _stop_watchdog(self, grace: float) -> None:
        """On the kernel loop: if the stop has not completed after ``grace``
        seconds (``MONARCH_STOP_GRACE``), stop without the actor's thread.  A
        stop that completes cancels it (:meth:`_finish_stop`): a stopped actor
        is not kept alive for the grace period by its watchdog."""
        import trio

        if self._finished:
            return
        with trio.CancelScope() as scope:
            self._watchdog = scope
            if self._finished:  # (finished between the check and the scope: nobody cancels it)
                return
            await trio.sleep(grace)
        self._watchdog = None
        if not scope.cancelled_caught and not self._finished:
            self._stop_overdue(grace)

    def _stop_overdue(self, grace: float) -> None:
        """The actor did not stop within the grace period: its thread is stuck
        in ``__init__`` or an endpoint (a thread cannot be killed).  Complete
        the stop without it: the actor leaves the proc (later messages are
        refused as for a stopped actor), the call it was handling and what was
        queued are refused, the stop is acknowledged, and the meshes it owns
        are stopped.  Its thread is left behind, unreachable; it never runs
        another message, and the proc's own stop ends it (any thread)."""
        with self._stop_lock:
            if self._finished:
                return
            self._abandoned = True
            self.stopped = True
        cur = self._current_reply
        busy = self._busy
        stuck = busy if busy is not None else (f"endpoint {cur[2]}" if cur is not None else None)
        what = f"its {stuck} did not return" if stuck else "it did not finish what it was doing"
        reason = self._stop_reason or "stopped"
        self._stop_reason = (
            f"{reason}; {what} within the {grace:g}s stop grace period (MONARCH_STOP_GRACE), so it was "
            f"stopped without it and its thread was left behind"
        )
        logger.warning("actor %s (%s): %s", self.display_name, self.class_name, self._stop_reason)
        self.agent.actor_stopped(self, self._stop_reason)  # unreachable from now on
        self._closed = True  # what still reaches this object is refused at once
        if cur is not None and cur[0] is not None:
            send_to_port(tuple(cur[0]), cur[1], W.S_ERROR, self._refusal(cur[2], started=True))
        init_reply = self._init_reply
        if init_reply is not None and busy == "__init__":
            send_to_port(init_reply, self.rank.rank, W.S_ERROR, self._refusal("__init__", started=True))
        while True:  # what the actor's loop had already taken (it will not get to it)
            try:
                item = self._pending.popleft()
            except IndexError:
                break
            if type(item[0]) is tuple:
                self._refuse_msg(item[0])
        self._orphan_incoming()
        self._finish_stop()  # the stop is acknowledged
        owned = list(self.owned)
        self.owned.clear()
        if owned:
            threading.Thread(target=self.agent.stop_meshes, args=(owned,), name="monarch-stop-owned",
                             daemon=True).start()

    def _finish_stop(self) -> None:
        """The stop is complete (any thread): its watchdog is cancelled, the
        actor's server-side metrics leave this process (``observer.retire_server``)
        and the stop is acknowledged.  Nothing of the proc's keeps the host after
        this: its thread ends and its loop is closed once ``_main`` returns."""
        with self._stop_lock:
            first = not self._finished
            self._finished = True
            replies, self._stop_replies = self._stop_replies, []
        if first:
            scope = self._watchdog
            if scope is not None:
                self._watchdog = None
                try:
                    self.agent.kernel.call_soon(scope.cancel)
                except RuntimeError:  # the kernel is shutting down: so is the watchdog
                    pass
            self.observer.retire_server(self)
            _frames.forget_actor(self.key)
        for r in replies:
            send_to_port(r, self.rank.rank, W.S_VALUE, None)

    # ---------------------------------------------------------------- thread
    def _thread_main(self) -> None:
        self._ident = _get_ident()
        # The loop is not made the thread's current event loop: sync code of the
        # actor (endpoints, __init__, hooks) sees no asyncio loop (``_loopless``).
        try:
            self.loop.run_until_complete(self._main())
        except BaseException:  # pragma: no cover - _main handles everything
            logger.exception("actor %s loop crashed", self.display_name)
        finally:
            try:
                pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
                for t in pending:
                    t.cancel()
                if pending:
                    self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            finally:
                if self._poller is not None:
                    self._poller.detach(self.loop)
                self.loop.close()
                self._closed = True
                self._orphan_incoming()
                self._orphan_control()

    def _put(self, item: tuple) -> None:
        """A mailbox item arrived (on the actor's loop)."""
        pending = self._pending
        if self._idle and not pending and type(item[0]) is tuple:
            rest = self._run_message(item[0], item[1], item[2])
            if rest is None:
                return
            item = (_AWAIT, rest, None)  # the handler awaits: the main task finishes it, in order
        pending.append(item)
        self._idle = False
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _main(self) -> None:
        _state.current_actor.set(self)
        await self._construct()
        pending = self._pending
        control = self._control
        loop = self.loop
        while True:
            if self._abandoned:  # it was stopped without this thread: run nothing more
                return
            if control:  # a failure to supervise arrived: before the queued messages
                self._take_control()
            if not pending:
                self._waiter = loop.create_future()
                self._idle = True
                await self._waiter
                self._idle = False
                continue
            item = pending.popleft()
            h = item[0]
            if h is _STOP:
                await self._stop(item[1], item[2])
                return
            if h is _AWAIT:
                self._awaiting = True
                try:
                    await item[1]
                finally:
                    self._awaiting = False
            elif h is _SUPERVISE:
                await self._on_supervise(item[1])
            elif h is _UNDELIVERABLE:
                await self._on_undeliverable(item[1])
            else:
                rest = self._run_message(h, item[1], item[2])
                if rest is not None:
                    self._awaiting = True
                    try:
                        await rest
                    finally:
                        self._awaiting = False

    async def _construct(self) -> None:
        init_reply, payload, buffers = self._init
        self._init = (None, None, None)
        self._init_reply = init_reply
        agent = self.agent
        if not agent.proc_ready.is_set():
            await asyncio.get_running_loop().run_in_executor(None, agent.proc_ready.wait)
        token = _state.current_message_rank.set(self.rank)
        try:
            if agent.init_error is not None:
                raise agent.init_error
            # One construction at a time per proc (``_construction``): the class's
            # unpickling and ``__init__`` import modules, which is not safe from
            # several threads at once.
            _construction.take(self.display_name)
            cls, args, kwargs = _serial.loads_importing(payload, buffers)
            self.class_name = cls.__qualname__
            self.class_path = f"{cls.__module__}.{cls.__qualname__}"
            instance = cls.__new__(cls)
            self.instance = instance
            self._busy = "__init__"
            _construction.enter_init()
            sp = self.observer.init_span(self._init_trace)
            if sp is None:
                _loopless(instance.__init__)(*args, **kwargs)
            else:
                self.observer.run_init(self, sp, _loopless(instance.__init__), args, kwargs)
        except BaseException as e:  # any failure of __init__: the actor is stopped, the owner told
            _construction.give()
            self._busy = None
            if self._abandoned:  # its stop gave up waiting for __init__ long ago
                return
            self.init_error = wrap_exception(e, f"{self.name}.__init__")
            logger.error("actor %s failed in __init__: %r", self.display_name, e,
                         extra=self._log_extra("user", "__init__"))
            if init_reply is not None:
                send_to_port(init_reply, self.rank.rank, W.S_ERROR, self.init_error)
            from monarch_core._proc import _supervision as S

            self.agent.actor_failed(self, f"__init__ raised:\n{self.init_error.remote_traceback}", S.USER, [])
            return
        finally:
            _state.current_message_rank.reset(token)
        _construction.give()
        self._busy = None
        if init_reply is not None and not self._abandoned:
            send_to_port(init_reply, self.rank.rank, W.S_VALUE, True)

    def _die(
        self,
        exc: BaseException,
        why: str,
        current: tuple | None = None,
        category: str = "user",
        chain: list[dict] | None = None,
        where: str | None = None,
    ) -> None:
        """The actor fails (on its own thread): whoever waits on the message
        being handled is told, later messages are refused with the cause, the
        owner is told, then its concurrent tasks are cancelled, the meshes it
        owns are stopped and ``__cleanup__(exc)`` runs.  ``where``:
        ``mesh.endpoint`` when an endpoint (or hook) raised."""
        if self.failure is not None or self._abandoned:
            return
        err = wrap_exception(exc, where or self.name)
        self.failure = err
        cause = f"{why}:\n{err.remote_traceback}" if err.remote_traceback else f"{why}: {exc!r}"
        if chain:  # a cascade: its refusals show how it came up to this actor
            from monarch_core._proc import _supervision as S

            self._chain = [*chain, S.make_report(
                mesh_key=self.key, mesh_name=self.name, class_name=self.class_name, rank=self.rank.rank,
                coords=str(self.rank), actor=self.display_name, proc=this_proc_and_host()[0] or "the client",
                cause=why, category=category, host=this_proc_and_host()[1])]
        cur = current if current is not None else self._current_reply
        if cur is not None and cur[0] is not None:
            self._refuse(cur[0], cur[1], cur[2])
        logger.error("actor %s (%s) failed: %s: %r", self.display_name, self.class_name, why, exc,
                     extra=self._log_extra(category, cur[2] if cur is not None else None))
        self.agent.actor_failed(self, cause, category, chain or [])
        self._after_death_task = self.loop.create_task(self._after_death(err))

    def _log_extra(self, category: str, endpoint: str | None) -> dict:
        """Structured fields of an error log record about this actor (``monarch_core.telemetry.LOG_FIELDS``)."""
        return self.observer.log_extra(category, actor=self.display_name, endpoint=endpoint, mesh=self.name,
                                       rank=self.rank.rank, proc=self.proc_id)

    async def _after_death(self, err: BaseException) -> None:
        await self._cancel_concurrent()
        await self.agent.stop_owned_async(self)
        await self._run_cleanup(err)

    async def _run_cleanup(self, exc: BaseException | None) -> None:
        cleanup = getattr(self.instance, "__cleanup__", None) if self.instance is not None else None
        if cleanup is None:
            return
        token = _state.current_message_rank.set(self.rank)
        self._busy = "__cleanup__"
        try:
            res = _loopless(cleanup)(exc)
            if inspect.isawaitable(res):
                await asyncio.wait_for(res, CLEANUP_TIMEOUT)
        except asyncio.TimeoutError:
            logger.warning("actor %s: __cleanup__ did not finish within %.0fs", self.display_name, CLEANUP_TIMEOUT)
        except Exception:
            logger.exception("actor %s: __cleanup__ raised", self.display_name)
        finally:
            self._busy = None
            _state.current_message_rank.reset(token)

    # ---------------------------------------------------------------- supervision
    def supervise(self, failure: Any) -> None:
        """A mesh this actor owns failed (any thread): handled by
        ``__supervise__`` once the message being handled is done, before the
        messages queued behind it (a backlog of busy endpoints does not delay
        it), or at once while that message is suspended at an ``await`` (it
        may be waiting for this); the reference's order."""
        self._control.append((_SUPERVISE, failure, None))
        if self._closed:
            self._orphan_control()
            return
        try:  # the actor's loop takes it (``_take_control``), before the queued messages
            if _get_ident() == self._ident:
                self.loop.call_soon(self._take_control, context=self._ctx)
            else:
                self.loop.call_soon_threadsafe(self._take_control, context=self._ctx)
        except RuntimeError:  # the loop is closed: the actor thread is gone
            self._orphan_control()

    async def _on_supervise(self, failure: Any) -> None:
        if self.failure is not None or self.stopped or self.instance is None:
            return
        handler = getattr(self.instance, "__supervise__", None)
        token = _state.current_message_rank.set(self.rank)
        try:
            handled = _loopless(handler)(failure) if handler is not None else None
            if inspect.isawaitable(handled):
                handled = await handled
        except BaseException as e:
            self.observer.supervision_handled(failure.mesh_name, f"{self.display_name}.__supervise__", False)
            self._die(e, f"__supervise__ raised while handling the failure of its mesh {failure.mesh_name!r}",
                      chain=failure.events, where=self._where("__supervise__"))
            return
        finally:
            _state.current_message_rank.reset(token)
        self.observer.supervision_handled(failure.mesh_name, f"{self.display_name}.__supervise__", bool(handled))
        if handled:
            logger.info("actor %s handled the failure of its mesh %r", self.display_name, failure.mesh_name)
            return
        if getattr(failure, "notice", False):  # nothing failed: an unhandled notice is only logged
            logger.warning("actor %s did not handle a %s", self.display_name, failure.report())
            return
        first = failure.events[0]
        self._die(
            SupervisionError(
                f"its mesh {failure.mesh_name!r} failed ({first['actor']}: "
                f"{first['cause'].strip().splitlines()[-1] if first['cause'].strip() else ''}) and "
                f"{self.class_name}.__supervise__ did not handle it"
            ),
            f"unhandled failure of its mesh {failure.mesh_name!r}",
            category=failure.category,
            chain=failure.events,
        )

    def return_ref(self) -> tuple:
        """The port where undeliverable messages this actor sent come back."""
        ref = self._return_ref
        if ref is None:
            kernel = self.agent.kernel
            ref = self._return_ref = (kernel.proc_id, kernel.address, kernel.add_port(ReturnPort(self)))
        return ref

    def undeliverable(self, exc: BaseException) -> None:
        self._post((_UNDELIVERABLE, exc, None))

    async def _on_undeliverable(self, exc: BaseException) -> None:
        if self.failure is not None or self.stopped or self.instance is None:
            return
        handler = getattr(self.instance, "_handle_undeliverable_message", None)
        if handler is not None:
            try:
                res = _loopless(handler)(UndeliverableMessage(exc))
                if inspect.isawaitable(res):
                    res = await res
            except BaseException as e:
                self._die(e, "_handle_undeliverable_message raised", category="system",
                          where=self._where("_handle_undeliverable_message"))
                return
            if res:
                return
        self._die(exc, "a message it sent could not be delivered", category="system")

    async def _stop(self, reason: str, reply: tuple | None) -> None:
        self.stopped = True
        if self._after_death_task is not None:  # a failed actor cleans up as it dies: let it finish
            await asyncio.shield(self._after_death_task)
        else:
            await self._cancel_concurrent()
            await self.agent.stop_owned_async(self)
            await self._run_cleanup(None)
        if self._abandoned:  # the stop completed without this thread meanwhile
            return
        self.agent.actor_stopped(self, reason)
        # refuse whatever is still queued
        self._pending.extend(self._incoming.popleft() for _ in range(len(self._incoming)))
        while self._pending:
            h, _p, _b = self._pending.popleft()
            if isinstance(h, tuple):
                self._refuse_msg(h)
        self._finish_stop()

    async def _cancel_concurrent(self) -> None:
        tasks = [t for t in self._concurrent if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def __repr__(self) -> str:
        return f"<actor {self.display_name} ({self.class_name}) on {self.proc_id}>"

    # ------------------------------------------------------------ endpoint messages: header to reply

    def _extent(self, labels: tuple, sizes: tuple) -> Extent:
        k = (labels, sizes)
        e = self._extents.get(k)
        if e is None:
            e = self._extents[k] = Extent(labels, sizes)
        return e

    def _refuse_msg(self, h: tuple) -> None:
        """Answer a message this actor will not handle (failed or stopped)."""
        self.agent._reply_error(h, self._refusal(h[1]))

    def _refuse(self, reply: tuple | None, rank: int, method: str) -> None:
        if reply is None:
            return
        send_to_port(tuple(reply), rank, W.S_ERROR, self._refusal(method))

    def _refusal(self, method: str, started: bool = False) -> BaseException:
        """The error for a message this actor will not handle (``started``:
        one it began handling and will never finish)."""
        if self.init_error is not None:
            exc: BaseException = self.init_error
        elif self.failure is not None:
            proc, host = this_proc_and_host()
            on = f", on {proc}" if proc else ""
            if "on host " not in on:
                on += f" on host {host}"
            chain = ""
            if self._chain:  # a cascade: where it started, and how it came up to this actor
                from monarch_core._proc import _supervision as S

                chain = "\n" + S.cascade(self._chain)
            exc = SupervisionError(
                f"actor {self.display_name} ({self.class_name}{on}) and its descendants failed; "
                f"{method} was not completed. Cause: {self.failure}{chain}"
            )
        else:
            reason = f" ({self._stop_reason})" if self._stop_reason else ""
            outcome = "did not complete" if started else "was not run"
            exc = SupervisionError(f"actor {self.describe()} was stopped{reason}; {method} {outcome}")
        return exc

    def _run_message(self, h: tuple, payload: Any, buffers: list) -> Any:
        """Handle one endpoint message as far as it goes without awaiting
        (on the actor's loop).  Returns None when done, else an awaitable the
        caller must await before the next message."""
        method_name, reply, rank, labels, sizes, explicit_flag = h[1], h[2], h[3], h[4], h[5], h[8]
        if method_name == _tree.STOP_METHOD:  # a stop that came through a cast tree, in order
            self.request_stop(str(_serial.loads(payload, buffers)), tuple(reply) if reply is not None else None)
            return None
        reply_ref = tuple(reply) if reply is not None else None
        # Taken before the check: a stop that completes without this thread
        # (``stop_if_idle``) sets ``stopped`` and then reads ``_current_reply``.
        self._current_reply = (reply_ref, rank, method_name)
        if self.init_error is not None or self.failure is not None or self.stopped:
            self._current_reply = None
            self._refuse_msg(h)
            return None
        extent = self._extent(labels, sizes)
        point = Point._make(rank, extent) if type(rank) is int and 0 <= rank < extent.nelements else Point(rank, extent)
        token = _state.current_message_rank.set(point)
        explicit = bool(explicit_flag)
        # the observer's: the endpoint's stat, its span when the call is traced
        stat = self._stats.get(method_name)
        if stat is None:
            stat = self._stat_for(method_name)
        t0 = _now() if stat else 0
        sp = self.observer.server_span(h) if stat else None
        span_token = self.observer.current_span.set(sp) if sp is not None else None  # (its [0], [1]: trace, span id)
        rest: Any = None
        try:
            args, kwargs = _serial.loads(payload, buffers)
            prop, func = self._lookup(method_name)
            if prop is not None:
                explicit = prop._explicit_response_port
            if explicit:
                port: Port[Any] = Port(reply_ref, None, rank) if reply_ref is not None else _DroppingPort()
                port._where = (self.name, method_name)  # named by port.exception(e)
                args = (port, *args)
            if prop is not None and prop._concurrent:
                self._start_concurrent(func, args, kwargs, method_name, None if explicit else reply_ref, rank,
                                       (stat, t0, _nbytes(payload, buffers) if stat else 0, sp))
                sp = None  # the body's task ends it
                rest = asyncio.sleep(0)  # let the body start before the next message
                return rest
            result = func(self.instance, *args, **kwargs)
            if result is not None and inspect.isawaitable(result):
                rest = self._finish(result, point, reply_ref, rank, method_name, explicit,
                                    (stat, t0, _nbytes(payload, buffers) if stat else 0, sp))
                sp = None  # ``_finish`` ends it
                return rest
            if stat:  # recorded before the reply leaves: a caller that then reads the metrics finds the call
                tm = (stat, t0, len(payload) if not buffers else _nbytes(payload, buffers), sp)
                stat = False  # (recorded once, below)
            else:
                tm = None
            if reply_ref is not None and not explicit:
                self._reply_value(reply_ref, rank, result, method_name, tm)
            elif tm is not None:
                self._record(tm, 0, None, method_name)
        except Exception as e:
            if stat:
                self._record_error(stat, sp, t0, payload, buffers, method_name, e)
            self._raised(e, reply_ref, rank, self._where(method_name), explicit)
        except BaseException as e:
            if stat:
                self._record_error(stat, sp, t0, payload, buffers, method_name, e)
            self._die(e, f"{self._where(method_name)} raised {type(e).__name__}", where=self._where(method_name))
        finally:
            if span_token is not None:
                self.observer.current_span.reset(span_token)
            if rest is None:
                self._current_reply = None
            _state.current_message_rank.reset(token)
        return None

    def _record_error(self, stat: Any, sp: Any, t0: int, payload: Any, buffers: list, method: str,
                      e: BaseException) -> None:
        self._record((stat, t0, _nbytes(payload, buffers), sp), 0, type(e).__name__, method)

    def _record(self, tm: tuple, rep: int, err: str | None, method: str) -> None:
        """Record one invocation of ``method``: ``tm`` is (stat, start, request bytes, span)."""
        stat, t0, req, sp = tm
        dt = _now() - t0
        stat.record(dt, req, rep, err)
        if sp is not None:
            self.observer.end_server_span(sp, self, method, t0, dt, err)

    def _stat_for(self, method: str) -> Any:
        try:
            prop, _func = self._lookup(method)
        except AttributeError:
            prop = None
        stat = self._stats[method] = self.observer.server_stat(self, method, prop)
        return stat

    def _where(self, method: str) -> str:
        """``mesh.method``, for messages about an endpoint (built only when one is needed)."""
        return f"{self.name}.{method}"

    async def _finish(self, result: Any, point: Point, reply_ref: tuple | None, rank: int, method: str,
                      explicit: bool, tm: tuple = (False, 0, 0, None)) -> None:
        """The awaiting half of :meth:`_run_message` (``tm``: its stat, start
        time, request bytes and span)."""
        token = _state.current_message_rank.set(point)
        stat, t0, req, sp = tm
        span_token = self.observer.current_span.set(sp) if sp is not None else None
        try:
            result = await result
            rec = (stat, t0, req, sp) if stat else None
            stat = False  # (recorded once, below)
            if reply_ref is not None and not explicit:
                self._reply_value(reply_ref, rank, result, method, rec)
            elif rec is not None:
                self._record(rec, 0, None, method)
        except Exception as e:
            if stat:
                self._record((stat, t0, req, sp), 0, type(e).__name__, method)
            self._raised(e, reply_ref, rank, self._where(method), explicit)
        except BaseException as e:
            if stat:
                self._record((stat, t0, req, sp), 0, type(e).__name__, method)
            self._die(e, f"{self._where(method)} raised {type(e).__name__}", where=self._where(method))
        finally:
            if span_token is not None:
                self.observer.current_span.reset(span_token)
            self._current_reply = None
            _state.current_message_rank.reset(token)

    def _raised(self, e: Exception, reply_ref: tuple | None, rank: int, where: str, explicit: bool) -> None:
        _lifecycle.endpoint_raised(e)  # a debugger may stop here (post-mortem: docs/debugging.md)
        if reply_ref is not None and not explicit:
            logger.debug("endpoint %s raised %r", where, e)
            _output.capture.before_reply()
            send_to_port(reply_ref, rank, W.S_ERROR, wrap_exception(e, where))
        else:
            why = "explicit-response-port endpoint" if explicit else "broadcast (no caller to report to)"
            self._die(e, f"{where} raised in a {why}", where=where)

    def _reply_value(self, reply_ref: tuple, rank: int, result: Any, method: str, tm: tuple | None = None) -> None:
        """Send ``result`` to the caller.  ``tm`` (stat, start, request bytes,
        span): record the invocation first -- as failed with ``TypeError`` if the
        result cannot be pickled -- so that it is counted before the caller hears."""
        try:
            rp, rb = _serial.dumps(result)
        except Exception as e:
            if tm is not None:
                self._record(tm, 0, "TypeError", method)
            where = self._where(method)
            # never raised: the caller gets this one error, without the pickler's frames and ours
            self._raised(TypeError(
                f"{where} returned a {type(result).__qualname__}, which cannot be sent back to the caller: {e}. "
                "Return plain data (numbers, strings, lists, dicts, tensors, picklable objects) instead; keep what "
                "cannot be pickled (locks, sockets, open files) in the actor"), reply_ref, rank, where, False)
            return
        if tm is not None:
            stat, t0, req, sp = tm
            rep = len(rp) if not rb else _nbytes(rp, rb)
            dt = _now() - t0  # (``_record``, inlined: the per-call path with metrics on)
            stat.add((dt, req, rep))
            if len(stat.pending) >= stat.FOLD_AT:
                stat.fold()
            if sp is not None:
                self.observer.end_server_span(sp, self, method, t0, dt, None)
        if _output.capture._queue:  # what the endpoint printed reaches the client before its reply
            _output.capture.before_reply()
        send_raw_to_port(reply_ref, rank, W.S_VALUE, rp, rb)

    def _lookup(self, name: str) -> tuple[Any, Any]:
        found = self._methods.get(name)
        if found is not None and found[0] is type(self.instance):
            return found[1], found[2]
        cls = type(self.instance)
        for klass in cls.__mro__:
            attr = klass.__dict__.get(name)
            if attr is None:
                continue
            if getattr(type(attr), "__monarch_endpoint__", False):  # an @endpoint (``_actor._endpoint``)
                func = _loopless(attr._method, self.loop)
                self._methods[name] = (cls, attr, func)
                return attr, func
            if callable(attr):
                if inspect.iscoroutinefunction(attr) and not _has_async_endpoint(cls):
                    func = _refused_async(cls, name)
                else:
                    func = _loopless(attr, self.loop)
                self._methods[name] = (cls, None, func)
                return None, func
            break
        raise AttributeError(f"{cls.__qualname__} has no endpoint {name!r}")

    def _start_concurrent(
        self, func: Any, args: tuple, kwargs: dict, method: str, reply_ref: tuple | None, rank: int,
        tm: tuple = (False, 0, 0, None),
    ) -> None:
        """Run a concurrent endpoint's body as a task.  Without an explicit port
        its return value (or exception) goes to the caller; an exception that
        is not forwarded anywhere fails the actor.  ``tm``: its stat, start
        time, request bytes and span (recorded when the body ends)."""
        msg_rank = _state.current_message_rank.get()
        current = self._current_reply
        stat, t0, req, sp = tm

        async def body() -> None:
            _state.current_message_rank.set(msg_rank)
            tm = (stat, t0, req, sp) if stat else None
            try:
                result = await func(self.instance, *args, **kwargs)
                rec, tm = tm, None  # (recorded once, here)
                if reply_ref is not None:
                    self._reply_value(reply_ref, rank, result, method, rec)
                elif rec is not None:
                    self._record(rec, 0, None, method)
            except asyncio.CancelledError:
                if tm is not None:
                    self._record(tm, 0, "CancelledError", method)
                raise
            except Exception as e:
                if tm is not None:
                    self._record(tm, 0, type(e).__name__, method)
                _lifecycle.endpoint_raised(e)
                where = self._where(method)
                if reply_ref is not None:
                    send_to_port(reply_ref, rank, W.S_ERROR, wrap_exception(e, where))
                else:
                    self._die(e, f"concurrent endpoint {where} raised without forwarding it to its port", current,
                              where=where)
            except BaseException as e:
                if tm is not None:
                    self._record(tm, 0, type(e).__name__, method)
                self._die(e, f"concurrent endpoint {self._where(method)} raised {type(e).__name__}", current,
                          where=self._where(method))

        t = self.loop.create_task(body())
        self._concurrent.add(t)
        t.add_done_callback(self._concurrent.discard)

def _coords(p: Point) -> str:
    if not len(p.extent):
        return ""
    return str(p)


def _has_async_endpoint(cls: type) -> bool:
    """Whether ``cls`` is an asynchronous actor in the reference's sense: one of its endpoints is ``async def``."""
    for klass in cls.__mro__:
        for attr in klass.__dict__.values():
            if getattr(type(attr), "__monarch_endpoint__", False) and inspect.iscoroutinefunction(attr._method):
                return True
    return False


def _refused_async(cls: type, name: str) -> Any:
    """What ``as_endpoint`` of an ``async`` method of a synchronous actor runs:
    the reference refuses it at call time (the caller gets an ``ActorError``;
    the actor goes on)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"as_endpoint({cls.__qualname__}.{name}): {name} is async, and {cls.__qualname__} is a synchronous "
            f"actor (none of its endpoints is async), which torchmonarch refuses; make one of its endpoints "
            f"`async def`, or {name} synchronous")

    return refuse


def _loopless(func: Any, loop: asyncio.AbstractEventLoop | None = None) -> Any:
    """``func`` itself if it is ``async def``; else a wrapper that runs it with
    no asyncio loop visible, as in the reference: ``asyncio.get_running_loop()``
    raises inside it, and it may run a loop of its own (``asyncio.run``) or
    block in ``Future.get()``.  The actor's loop is hidden only for the call:
    an awaitable it returns is awaited on the actor's loop as usual.  With
    ``loop`` (the actor's, which runs wherever the wrapper is called: its
    endpoints) the wrapper restores that loop without looking it up first
    (about 0.35 µs a call instead of 0.6)."""
    if inspect.iscoroutinefunction(func):
        return func
    if loop is not None:
        def run_on(*args: Any, **kwargs: Any) -> Any:
            _set_running_loop(None)
            try:
                return func(*args, **kwargs)
            finally:
                _set_running_loop(loop)

        return functools.update_wrapper(run_on, func)

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        running = _get_running_loop()
        if running is None:
            return func(*args, **kwargs)
        _set_running_loop(None)
        try:
            return func(*args, **kwargs)
        finally:
            _set_running_loop(running)

    return run
