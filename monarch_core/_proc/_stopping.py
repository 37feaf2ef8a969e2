"""How an actor stops: the request, the stop itself, the stop without the
actor's thread, and the words of a stopped actor's refusals.

:class:`Stopping` (``_host.ActorHost`` holds one) takes stop requests from
any thread (:meth:`Stopping.request`: the stop runs on the actor's thread
after the messages already queued, and is acknowledged to every requester
once done), stops an idle actor that has nothing to run on the calling
thread (:meth:`Stopping.if_idle`), watches the stop's grace period
(``MONARCH_STOP_GRACE``: :meth:`Stopping.overdue` completes a stop whose
thread is stuck, without it) and runs the stop on the actor's loop
(:meth:`Stopping.run`).  What it needs of its actor is :class:`StoppingHost`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any, Protocol

from monarch_core._proc._failing import Failing
from monarch_core._proc._invoke import Invoker
from monarch_core._proc._mailbox import _STOP, Mailbox
from monarch_core._proc._port import send_to_port
from monarch_core._kernel import _frames
from monarch_core._kernel._events import EventBus
from monarch_core._kernel import _wire as W
from monarch_core._mesh._shape import Point
from monarch_core.errors import SupervisionError

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.actor")


class StopAgent(Protocol):
    """What :class:`Stopping` uses of the proc agent (``_host.HostAgent``)."""

    kernel: Kernel
    #: seconds an actor's stop may take before it completes without the actor's thread
    stop_grace: float

    def stop_meshes(self, meshes: list) -> None: ...


class StoppingHost(Protocol):
    """What :class:`Stopping` reads, sets and calls of its actor (``_host.ActorHost``)."""

    key: str
    display_name: str
    class_name: str
    rank: Point
    instance: Any
    owned: list[Any]
    stopped: bool

    def describe(self) -> str: ...

    def _refusal(self, method: str, started: bool = False) -> BaseException: ...

    def _refuse_msg(self, h: tuple) -> None: ...

    def _tell_stopped(self, reason: str) -> None: ...

    async def _stop_owned(self) -> None: ...


class Stopping:
    """The stop of one actor.  ``requested``: a stop was asked for (control
    items are dropped from then on); ``abandoned``: it completed without the
    actor's thread (``overdue``: the thread runs nothing more); ``reason``:
    why it stopped, as its refusals say."""

    def __init__(self, host: StoppingHost, agent: StopAgent, events: EventBus, mailbox: Mailbox, invoker: Invoker,
                 failing: Failing) -> None:
        self.host = host
        self.agent = agent
        self.events = events  # the runtime's (``_runtime_events``): ``actor_finished``
        self.mailbox = mailbox
        self.invoker = invoker
        self.failing = failing
        self.requested = False
        self.reason = ""
        self.abandoned = False  # stopped while its thread was stuck (see ``overdue``)
        self._lock = threading.Lock()
        self._replies: list[tuple] = []
        self._finished = False
        self._watchdog: Any = None  # the stop's watchdog (a trio cancel scope on the kernel loop)

    # ------------------------------------------------------------ requests (any thread)

    def request(self, reason: str, reply: tuple | None) -> None:
        """Ask the actor to stop after the messages already queued (any
        thread).  ``reply`` gets ``None`` once it has stopped; a request to an
        actor that is stopping or stopped is answered when it is done."""
        with self._lock:
            if self._finished:
                if reply is not None:
                    send_to_port(reply, self.host.rank.rank, W.S_VALUE, None)
                return
            if reply is not None:
                self._replies.append(reply)
            if self.requested:
                return
            self.requested = True
            self.reason = reason
        self.mailbox.post((_STOP, reason, None))
        grace = getattr(self.agent, "stop_grace", 0.0)
        if grace > 0:
            kernel = self.agent.kernel
            try:
                kernel.call_soon(kernel.start_task, self._watch, grace)
            except RuntimeError:  # the kernel is shutting down: the proc ends anyway
                pass

    def if_idle(self, reason: str) -> bool:
        """Stop now, on the calling thread, if stopping has nothing to run:
        the actor is constructed and idle (no message being handled or
        queued, no concurrent task, no failure being cleaned up), has no
        ``__cleanup__`` and owns no mesh.  Its thread is not woken: it stays
        parked, refusing whatever still reaches it, until the process ends --
        so this is for a stopping proc only (``ProcAgent.stop_everything``),
        where waking thousands of idle actor threads one by one is what a
        stop would otherwise cost.  Returns False (nothing changed) when the
        actor must stop on its own thread (:meth:`request`)."""
        if self._has_work():
            return False
        host, mailbox, invoker = self.host, self.mailbox, self.invoker
        with self._lock:
            if self._finished or self.requested or not mailbox.quiet() or invoker.current is not None:
                return False
            host.stopped = True  # a message taken from now on is refused (``run_message`` checks after taking it)
            if invoker.current is not None or mailbox.has_items():
                host.stopped = False  # one was taken meanwhile: the actor stops on its thread, after it
                return False
            self.requested = True
            self.reason = reason
        host._tell_stopped(reason)
        self.finish()
        return True

    def _has_work(self) -> bool:
        """Stopping this actor runs something on its thread (or it is not built yet)."""
        instance = self.host.instance
        return (instance is None or self.mailbox.poller is not None or self.failing.busy is not None
                or bool(self.host.owned) or self.failing.after_death is not None
                or getattr(instance, "__cleanup__", None) is not None)

    # ------------------------------------------------------------ the grace period (kernel loop, any thread)

    async def _watch(self, grace: float) -> None:
        """On the kernel loop: if the stop has not completed after ``grace``
        seconds (``MONARCH_STOP_GRACE``), stop without the actor's thread.  A
        stop that completes cancels it (:meth:`finish`): a stopped actor
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
            self.overdue(grace)

    def overdue(self, grace: float) -> None:
        """The actor did not stop within the grace period: its thread is stuck
        in ``__init__`` or an endpoint (a thread cannot be killed).  Complete
        the stop without it: the actor leaves the proc (later messages are
        refused as for a stopped actor), the call it was handling and what was
        queued are refused, the stop is acknowledged, and the meshes it owns
        are stopped.  Its thread is left behind, unreachable; it never runs
        another message, and the proc's own stop ends it (any thread)."""
        host = self.host
        with self._lock:
            if self._finished:
                return
            self.abandoned = True
            host.stopped = True
        cur = self.invoker.current
        busy = self.failing.busy
        stuck = busy if busy is not None else (f"endpoint {cur[2]}" if cur is not None else None)
        what = f"its {stuck} did not return" if stuck else "it did not finish what it was doing"
        self.reason = (
            f"{self.reason or 'stopped'}; {what} within the {grace:g}s stop grace period (MONARCH_STOP_GRACE), "
            f"so it was stopped without it and its thread was left behind"
        )
        logger.warning("actor %s (%s): %s", host.display_name, host.class_name, self.reason)
        host._tell_stopped(self.reason)  # unreachable from now on
        self.mailbox.closed = True  # what still reaches it is refused at once
        if cur is not None and cur[0] is not None:
            send_to_port(tuple(cur[0]), cur[1], W.S_ERROR, host._refusal(cur[2], started=True))
        init_reply = self.failing.init_reply
        if init_reply is not None and busy == "__init__":
            send_to_port(init_reply, host.rank.rank, W.S_ERROR, host._refusal("__init__", started=True))
        for item in self.mailbox.take_pending():  # what the actor's loop had already taken (it will not get to it)
            if isinstance(item[0], tuple):
                host._refuse_msg(item[0])
        self.mailbox.orphan_incoming()
        self.finish()  # the stop is acknowledged
        owned = list(host.owned)
        host.owned.clear()
        if owned:
            threading.Thread(target=self.agent.stop_meshes, args=(owned,), name="monarch-stop-owned",
                             daemon=True).start()

    # ------------------------------------------------------------ the stop

    async def run(self, reason: str) -> None:
        """The stop, on the actor's loop, once what was queued before it ran:
        tasks cancelled, owned meshes stopped, ``__cleanup__`` run (or the
        dead actor's cleanup awaited), what is still queued refused."""
        host, mailbox, failing = self.host, self.mailbox, self.failing
        host.stopped = True
        if failing.after_death is not None:  # a failed actor cleans up as it dies: let it finish
            await asyncio.shield(failing.after_death)
        else:
            await mailbox.cancel_tasks()
            await host._stop_owned()
            await failing.run_cleanup(None)
        if self.abandoned:  # the stop completed without this thread meanwhile
            return
        host._tell_stopped(reason)
        for item in mailbox.take_all():  # refuse whatever is still queued
            if isinstance(item[0], tuple):
                host._refuse_msg(item[0])
        self.finish()

    def finish(self) -> None:
        """The stop is complete (any thread): its watchdog is cancelled, the
        runtime event ``actor_finished`` is emitted (its server-side metrics leave this process)
        and the stop is acknowledged.  Nothing of the proc's keeps the actor after
        this: its thread ends and its loop is closed once its main task returns."""
        with self._lock:
            first = not self._finished
            self._finished = True
            replies, self._replies = self._replies, []
        host = self.host
        if first:
            scope = self._watchdog
            if scope is not None:
                self._watchdog = None
                try:
                    self.agent.kernel.call_soon(scope.cancel)
                except RuntimeError:  # the kernel is shutting down: so is the watchdog
                    pass
            self.events.emit("actor_finished", host=host)
            _frames.forget_actor(host.key)
        for r in replies:
            send_to_port(r, host.rank.rank, W.S_VALUE, None)

    def stopped_refusal(self, method: str, started: bool) -> BaseException:
        """The error for a message this stopped actor will not handle (``started``:
        one it began handling and will never finish)."""
        reason = f" ({self.reason})" if self.reason else ""
        outcome = "did not complete" if started else "was not run"
        return SupervisionError(f"actor {self.host.describe()} was stopped{reason}; {method} {outcome}")
