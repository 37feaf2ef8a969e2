"""How an actor is built and how it fails: construction, death, cleanup,
``__supervise__`` and undeliverable messages.

:class:`Failing` (``_host.ActorHost`` holds one) runs the actor's
construction (its class unpickled, ``__init__``, the spawn's reply), its
death (:meth:`Failing.die`: the call being handled refused, the owner told,
then the concurrent tasks cancelled, the owned meshes stopped and
``__cleanup__`` run), the supervision of the meshes it owns
(``__supervise__``) and the undeliverable messages it sent
(``_handle_undeliverable_message``), and words the refusal of a failed
actor.  What it needs of its actor is :class:`FailingHost`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from typing import Any, Protocol

from monarch_core._proc import _construction, _serial, _state
from monarch_core._proc._instrumentation import Instrumentation
from monarch_core._proc._invoke import loopless
from monarch_core._proc._mailbox import Mailbox
from monarch_core._proc._port import send_to_port, this_proc_and_host, wrap_exception
from monarch_core._kernel import _wire as W
from monarch_core._kernel._events import EventBus
from monarch_core._mesh._shape import Point
from monarch_core.errors import SupervisionError

logger = logging.getLogger("monarch.actor")

#: seconds ``__cleanup__`` may run (an async one is abandoned after it)
CLEANUP_TIMEOUT = 10.0


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


class InitAgent(Protocol):
    """What :class:`Failing` reads of the proc agent (``_host.HostAgent``): whether the proc's bootstrap ran."""

    #: set once the proc's bootstrap ran (``init_error``: how it failed)
    proc_ready: threading.Event
    init_error: BaseException | None


class FailingHost(Protocol):
    """What :class:`Failing` reads, sets and calls of its actor (``_host.ActorHost``)."""

    key: str
    name: str
    rank: Point
    display_name: str
    proc_id: str
    class_name: str
    class_path: str | None
    instance: Any
    init_error: BaseException | None
    failure: BaseException | None
    stopped: bool

    @property
    def _abandoned(self) -> bool: ...

    @property
    def _current_reply(self) -> tuple | None: ...

    def _refusal(self, method: str, started: bool = False) -> BaseException: ...

    def _tell_failed(self, cause: str, category: str, chain: list[dict]) -> None: ...

    async def _stop_owned(self) -> None: ...


class Failing:
    """The construction and the failures of one actor (on its loop, except
    :meth:`failed_refusal`).  ``busy`` names what runs outside an endpoint
    (``__init__``, ``__cleanup__``: a stop that gives up on the thread names
    it); ``after_death`` is the task that cleans a dead actor up."""

    def __init__(self, host: FailingHost, agent: InitAgent, instrumentation: Instrumentation, events: EventBus,
                 mailbox: Mailbox, init: tuple[tuple | None, Any, list], trace: bytes | None) -> None:
        self.host = host
        self.agent = agent
        self.instrumentation = instrumentation  # the runtime's: ``__init__`` spans, log records' fields
        self.events = events  # the runtime's: ``supervision_handled``
        self.mailbox = mailbox
        self.init_reply: tuple | None = init[0]  # the spawn's reply port
        self._init: tuple[Any, Any] = (init[1], init[2])  # (payload, buffers) of the class and its arguments
        self._init_trace = trace  # the spawn's trace context (``__init__`` records under it)
        self.busy: str | None = None  # "__init__" while it runs (named if a stop gives up on it)
        self.chain: list[dict] = []  # the cascade that failed this actor (first failure first), if any
        self.after_death: asyncio.Task | None = None

    # ------------------------------------------------------------ construction

    async def construct(self) -> None:
        """:meth:`construct_now` once the proc is ready, without blocking the
        actor's loop meanwhile (the loop of the proc's first actor reads the
        proc's sockets)."""
        agent = self.agent
        if not agent.proc_ready.is_set():
            await asyncio.get_running_loop().run_in_executor(None, agent.proc_ready.wait)
        self.construct_now()

    def construct_sync(self) -> None:
        """:meth:`construct_now` once the proc is ready (the actor's thread waits)."""
        self.agent.proc_ready.wait()
        self.construct_now()

    def construct_now(self) -> None:
        """Unpickle the actor's class and run its ``__init__`` (one
        construction at a time per proc), then answer the spawn."""
        payload, buffers = self._init
        self._init = (None, None)
        host, agent, init_reply = self.host, self.agent, self.init_reply
        token = _state.current_message_rank.set(host.rank)
        try:
            if agent.init_error is not None:
                raise agent.init_error
            # One construction at a time per proc (``_construction``): the class's
            # unpickling and ``__init__`` import modules, which is not safe from
            # several threads at once.
            _construction.take(host.display_name)
            self._init_instance(payload, buffers)
        except BaseException as e:  # any failure of __init__: the actor is stopped, the owner told
            _construction.give()
            self.busy = None
            self._init_failed(e)
            return
        finally:
            _state.current_message_rank.reset(token)
        _construction.give()
        self.busy = None
        if init_reply is not None and not host._abandoned:
            send_to_port(init_reply, host.rank.rank, W.S_VALUE, True)

    def _init_instance(self, payload: Any, buffers: list) -> None:
        host = self.host
        cls, args, kwargs = _serial.loads_spawn(payload, buffers)
        host.class_name = cls.__qualname__
        host.class_path = f"{cls.__module__}.{cls.__qualname__}"
        instance = cls.__new__(cls)
        host.instance = instance
        self.busy = "__init__"
        _construction.enter_init()
        sp = self.instrumentation.init_span(self._init_trace)
        if sp is None:
            loopless(instance.__init__)(*args, **kwargs)
        else:
            self.instrumentation.run_init(host, sp, loopless(instance.__init__), args, kwargs)

    def _init_failed(self, e: BaseException) -> None:
        host = self.host
        if host._abandoned:  # its stop gave up waiting for __init__ long ago
            return
        host.init_error = err = wrap_exception(e, f"{host.name}.__init__")
        logger.error("actor %s failed in __init__: %r", host.display_name, e,
                     extra=self.log_extra("user", "__init__"))
        if self.init_reply is not None:
            send_to_port(self.init_reply, host.rank.rank, W.S_ERROR, err)
        from monarch_core._proc import _supervision as S

        host._tell_failed(f"__init__ raised:\n{err.remote_traceback}", S.USER, [])

    # ------------------------------------------------------------ death

    def die(self, exc: BaseException, why: str, current: tuple | None = None, category: str = "user",
            chain: list[dict] | None = None, where: str | None = None) -> None:
        """The actor fails (on its own thread): whoever waits on the message
        being handled (``current``, else the host's) is told, later messages
        are refused with the cause, the owner is told, then its concurrent
        tasks are cancelled, the meshes it owns are stopped and
        ``__cleanup__(exc)`` runs.  ``where``: ``mesh.endpoint`` when an
        endpoint (or hook) raised."""
        host = self.host
        if host.failure is not None or host._abandoned:
            return
        err = wrap_exception(exc, where or host.name)
        host.failure = err
        cause = f"{why}:\n{err.remote_traceback}" if err.remote_traceback else f"{why}: {exc!r}"
        if chain:  # a cascade: its refusals show how it came up to this actor
            self.chain = [*chain, self._report(why, category)]
        cur = current if current is not None else host._current_reply
        if cur is not None and cur[0] is not None:
            send_to_port(tuple(cur[0]), cur[1], W.S_ERROR, host._refusal(cur[2]))
        logger.error("actor %s (%s) failed: %s: %r", host.display_name, host.class_name, why, exc,
                     extra=self.log_extra(category, cur[2] if cur is not None else None))
        host._tell_failed(cause, category, chain or [])
        self.after_death = self.mailbox.loop.create_task(self._after_death(err))

    def _report(self, why: str, category: str) -> dict:
        """This actor's entry in the cascade that failed it."""
        from monarch_core._proc import _supervision as S

        host = self.host
        proc, on_host = this_proc_and_host()
        return S.make_report(
            mesh_key=host.key, mesh_name=host.name, class_name=host.class_name, rank=host.rank.rank,
            coords=str(host.rank), actor=host.display_name, proc=proc or "the client", cause=why,
            category=category, host=on_host)

    def log_extra(self, category: str, endpoint: str | None) -> dict:
        """Structured fields of an error log record about this actor (``monarch_core.telemetry.LOG_FIELDS``)."""
        host = self.host
        return self.instrumentation.log_extra(category, actor=host.display_name, endpoint=endpoint,
                                              mesh=host.name, rank=host.rank.rank, proc=host.proc_id)

    async def _after_death(self, err: BaseException) -> None:
        await self.mailbox.cancel_tasks()
        await self.host._stop_owned()
        await self.run_cleanup(err)

    async def run_cleanup(self, exc: BaseException | None) -> None:
        """Run ``__cleanup__(exc)`` if the actor has one (an async one for at most :data:`CLEANUP_TIMEOUT` s)."""
        host = self.host
        cleanup = getattr(host.instance, "__cleanup__", None) if host.instance is not None else None
        if cleanup is None:
            return
        token = _state.current_message_rank.set(host.rank)
        self.busy = "__cleanup__"
        try:
            res = loopless(cleanup)(exc)
            if inspect.isawaitable(res):
                await asyncio.wait_for(res, CLEANUP_TIMEOUT)
        except asyncio.TimeoutError:
            logger.warning("actor %s: __cleanup__ did not finish within %.0fs", host.display_name, CLEANUP_TIMEOUT)
        except Exception:
            logger.exception("actor %s: __cleanup__ raised", host.display_name)
        finally:
            self.busy = None
            _state.current_message_rank.reset(token)

    def failed_refusal(self, method: str) -> BaseException:
        """The error for a message this failed actor will not handle (any thread)."""
        host = self.host
        proc, on_host = this_proc_and_host()
        on = f", on {proc}" if proc else ""
        if "on host " not in on:
            on += f" on host {on_host}"
        chain = ""
        if self.chain:  # a cascade: where it started, and how it came up to this actor
            from monarch_core._proc import _supervision as S

            chain = "\n" + S.cascade(self.chain)
        return SupervisionError(
            f"actor {host.display_name} ({host.class_name}{on}) and its descendants failed; "
            f"{method} was not completed. Cause: {host.failure}{chain}"
        )

    # ------------------------------------------------------------ supervision, undeliverable messages

    async def on_supervise(self, failure: Any) -> None:
        """A mesh this actor owns failed: ``__supervise__(failure)``; unhandled (or raising), the actor fails."""
        host = self.host
        if host.failure is not None or host.stopped or host.instance is None:
            return
        handler = getattr(host.instance, "__supervise__", None)
        token = _state.current_message_rank.set(host.rank)
        try:
            handled = loopless(handler)(failure) if handler is not None else None
            if inspect.isawaitable(handled):
                handled = await handled
        except BaseException as e:
            self.events.emit("supervision_handled", mesh=failure.mesh_name,
                             handled_by=f"{host.display_name}.__supervise__", handled=False)
            self.die(e, f"__supervise__ raised while handling the failure of its mesh {failure.mesh_name!r}",
                     chain=failure.events, where=f"{host.name}.__supervise__")
            return
        finally:
            _state.current_message_rank.reset(token)
        self.events.emit("supervision_handled", mesh=failure.mesh_name,
                         handled_by=f"{host.display_name}.__supervise__", handled=bool(handled))
        if handled:
            logger.info("actor %s handled the failure of its mesh %r", host.display_name, failure.mesh_name)
            return
        if getattr(failure, "notice", False):  # nothing failed: an unhandled notice is only logged
            logger.warning("actor %s did not handle a %s", host.display_name, failure.report())
            return
        self._unsupervised(failure)

    def _unsupervised(self, failure: Any) -> None:
        first = failure.events[0]
        cause = first["cause"].strip()
        self.die(
            SupervisionError(
                f"its mesh {failure.mesh_name!r} failed ({first['actor']}: "
                f"{cause.splitlines()[-1] if cause else ''}) and "
                f"{self.host.class_name}.__supervise__ did not handle it"
            ),
            f"unhandled failure of its mesh {failure.mesh_name!r}",
            category=failure.category,
            chain=failure.events,
        )

    async def on_undeliverable(self, exc: BaseException) -> None:
        """A message this actor sent came back: ``_handle_undeliverable_message``; unhandled, the actor fails."""
        host = self.host
        if host.failure is not None or host.stopped or host.instance is None:
            return
        handler = getattr(host.instance, "_handle_undeliverable_message", None)
        if handler is not None:
            try:
                res = loopless(handler)(UndeliverableMessage(exc))
                if inspect.isawaitable(res):
                    res = await res
            except BaseException as e:
                self.die(e, "_handle_undeliverable_message raised", category="system",
                         where=f"{host.name}._handle_undeliverable_message")
                return
            if res:
                return
        self.die(exc, "a message it sent could not be delivered", category="system")
