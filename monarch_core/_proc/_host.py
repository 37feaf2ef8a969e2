"""ActorHost: runs one actor instance in this process.

Each actor gets its own thread, and its own asyncio loop once it needs one
(``_mailbox``).  Async endpoints run as coroutines on that loop (so
``asyncio.sleep``/``gather`` work); sync endpoints run directly on the same
thread, which only blocks this actor.
Messages are handled one at a time, in arrival order, except bodies of
``@concurrent_endpoint`` methods, which run as tasks.

:class:`ActorHost` is the actor as the rest of the runtime sees it: its
identity (key, mesh name, rank, display name, id, class), its instance, the
flags other layers read (``init_error``, ``failure``, ``stopped``), the
meshes it owns, and the entry points (``enqueue``, ``request_stop``,
``stop_if_idle``, ``supervise``, ``undeliverable``, ``return_ref``).  The
work is done by the components it holds, each behind the protocol it
declares of its host:

- ``_mailbox.Mailbox``: the thread, the loop (made when first needed), the queues, the idle fast path;
- ``_invoke.Invoker``: one endpoint message from its header (``ActorHeader``) to its reply;
- ``_failing.Failing``: construction, death, cleanup, ``__supervise__``,
  undeliverable messages;
- ``_stopping.Stopping``: stop requests, the stop, the grace period.

The host talks to the proc agent (:class:`HostAgent`) for them: the
components never hand the agent an actor.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

from monarch_core._proc._failing import CLEANUP_TIMEOUT as CLEANUP_TIMEOUT  # (re-exported)
from monarch_core._proc._failing import UndeliverableMessage as UndeliverableMessage  # (re-exported)
from monarch_core._proc._failing import Failing
from monarch_core._proc._invoke import Invoker, has_async_endpoint
from monarch_core._proc._mailbox import _SUPERVISE, _UNDELIVERABLE, Mailbox
from monarch_core._proc._port import ReturnPort, this_proc_and_host
from monarch_core._proc._stopping import Stopping
from monarch_core._mesh._shape import Extent, Point
from monarch_core.errors import ProtocolError

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel



class HostAgent(Protocol):
    """The proc agent as an :class:`ActorHost` sees it: what the host and its
    components read and call back (``_agent.ProcAgent`` satisfies it; that
    module imports this one, so it is not named here)."""

    kernel: Kernel
    #: the process's runtime (``_state.ProcRuntime``): its ``instrumentation`` and ``events``
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
        rt = agent.runtime  # its ``instrumentation`` (what this actor records per call) and ``events`` (what it tells)
        instrumentation, events = rt.instrumentation, rt.events
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
        self.span_metas: dict[str, tuple] = {}  # endpoint name -> its server spans' meta (the instrumentation's)
        self._return_ref: tuple | None = None
        self._mailbox = mailbox = Mailbox(self, agent.kernel)
        self._invoker = Invoker(self, instrumentation, mailbox.spawn)
        self._invoker.known_extent(self.mesh_extent)
        self._failing = Failing(self, agent, instrumentation, events, mailbox, (init_reply, payload, buffers), trace)
        self._stopping = Stopping(self, agent, events, mailbox, self._invoker, self._failing)
        self._post: Callable[[tuple], None] = mailbox.post  # (bound once: ``enqueue``'s one call)
        mailbox.start(self._invoker.run_message)

    # ---------------------------------------------------------------- entry points
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
        is its header, the 9 fields of an ``_invoke.ActorHeader`` (a traced
        call's context as a tenth, bytes).  A header of another shape raises
        :class:`ProtocolError`: the kernel checks only the key, and drops the
        connection that carried it."""
        if not (len(h) == 9 or (len(h) == 10 and type(h[9]) is bytes)) or type(h[1]) is not str:
            raise ProtocolError(f"peer {sender} sent a malformed actor message header")
        self._post((h, payload, buffers))

    def request_stop(self, reason: str, reply: tuple | None) -> None:
        """Ask the actor to stop after the messages already queued (any
        thread).  ``reply`` gets ``None`` once it has stopped; a request to an
        actor that is stopping or stopped is answered when it is done
        (``_stopping.Stopping.request``)."""
        self._stopping.request(reason, reply)

    def stop_if_idle(self, reason: str) -> bool:
        """Stop now, on the calling thread, if stopping has nothing to run (a
        stopping proc's idle actors: ``_stopping.Stopping.if_idle``); False:
        nothing changed, the actor must stop on its thread (:meth:`request_stop`)."""
        return self._stopping.if_idle(reason)

    def supervise(self, failure: Any) -> None:
        """A mesh this actor owns failed (any thread): handled by
        ``__supervise__`` once the message being handled is done, before the
        messages queued behind it (a backlog of busy endpoints does not delay
        it), or at once while that message is suspended at an ``await`` (it
        may be waiting for this); the reference's order."""
        self._mailbox.post_control((_SUPERVISE, failure, None))

    def return_ref(self) -> tuple:
        """The port where undeliverable messages this actor sent come back."""
        ref = self._return_ref
        if ref is None:
            kernel = self.agent.kernel
            ref = self._return_ref = (kernel.proc_id, kernel.address, kernel.add_port(ReturnPort(self)))
        return ref

    def undeliverable(self, exc: BaseException) -> None:
        """A message this actor sent could not be delivered (any thread):
        ``_handle_undeliverable_message``, in order with its messages."""
        self._post((_UNDELIVERABLE, exc, None))

    def __repr__(self) -> str:
        return f"<actor {self.display_name} ({self.class_name}) on {self.proc_id}>"

    # ---------------------------------------------------------------- refusals
    def _refusal(self, method: str, started: bool = False) -> BaseException:
        """The error for a message this actor will not handle (``started``:
        one it began handling and will never finish): why it failed in
        ``__init__``, how it failed, or that it was stopped."""
        if self.init_error is not None:
            return self.init_error
        if self.failure is not None:
            return self._failing.failed_refusal(method)
        return self._stopping.stopped_refusal(method, started)

    def _refuse_msg(self, h: tuple) -> None:
        """Answer a message this actor will not handle (failed or stopped)."""
        self.agent._reply_error(h, self._refusal(h[1]))

    # ---------------------------------------------------------------- for the components
    def _die(self, exc: BaseException, why: str, current: tuple | None = None, category: str = "user",
             chain: list[dict] | None = None, where: str | None = None) -> None:
        """The actor fails (``_failing.Failing.die``)."""
        self._failing.die(exc, why, current, category, chain, where)

    def _tell_failed(self, cause: str, category: str, chain: list[dict]) -> None:
        self.agent.actor_failed(self, cause, category, chain)

    def _tell_stopped(self, reason: str) -> None:
        self.agent.actor_stopped(self, reason)

    async def _stop_owned(self) -> None:
        await self.agent.stop_owned_async(self)

    def _reply_gone(self, h: tuple) -> None:
        self.agent.reply_gone(h, self)

    async def _construct(self) -> None:
        await self._failing.construct()

    def _construct_sync(self) -> None:
        self._failing.construct_sync()

    def _wants_loop(self) -> bool:
        """The actor runs on a loop from its construction on: one of its endpoints is ``async def``."""
        instance = self.instance
        return instance is not None and has_async_endpoint(type(instance))

    async def _stop(self, reason: str, reply: tuple | None) -> None:
        await self._stopping.run(reason)

    async def _on_supervise(self, failure: Any) -> None:
        await self._failing.on_supervise(failure)

    async def _on_undeliverable(self, exc: BaseException) -> None:
        await self._failing.on_undeliverable(exc)

    def _finish_stop(self) -> None:
        self._stopping.finish()

    # ---------------------------------------------------------------- the components' state, by its old names
    @property
    def _stop_requested(self) -> bool:
        return self._stopping.requested

    @property
    def _abandoned(self) -> bool:
        return self._stopping.abandoned

    @property
    def _current_reply(self) -> tuple | None:
        """``(reply port, rank, endpoint)`` of the message being handled, or None."""
        return self._invoker.current

    @property
    def _stats(self) -> dict[str, Any]:
        """Endpoint name -> its server-side stat (telemetry's listener of ``actor_finished`` clears it)."""
        return self._invoker.stats

    @property
    def _incoming(self) -> Any:
        return self._mailbox.incoming

    @property
    def _pending(self) -> Any:
        return self._mailbox.pending

    @property
    def _control(self) -> Any:
        return self._mailbox.control


def _coords(p: Point) -> str:
    if not len(p.extent):
        return ""
    return str(p)
