"""The proc agent: the control plane of one process.

Handles control messages (spawn/stop actors, run the proc's bootstrap, stop
the proc, controllers), holds messages that arrive for an actor before its
spawn message, and owns the meshes this process created outside any actor.
Supervision reports, proc deaths and heartbeats of child procs are the
:class:`~._watch.ProcWatch` it holds (``ProcAgent.watch``), which its methods of
the same names delegate to.  A worker loop's agent
(starting procs for remote clients) is ``monarch_core._launch._worker``.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Callable, cast


from monarch_core import settings
from monarch_core._proc import _lifecycle, _serial, _state, _tree
from monarch_core._proc._port import send_to_port, wrap_exception
from monarch_core._proc._watch import ProcWatch, Supervised
from monarch_core._proc import _control as C
from monarch_core._kernel import _wire as W
from monarch_core._kernel._poller import following
from monarch_core.errors import ProtocolError, SupervisionError, UndeliverableMessageError

if TYPE_CHECKING:
    from monarch_core._proc._host import ActorHost
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.proc")

#: Seconds a message for a not-yet-spawned actor is held before it is
#: returned as undeliverable.
HOLD_TIMEOUT = 30.0
STOP_GRACE: float = settings.get("MONARCH_STOP_GRACE")
#: Ended actors a proc remembers (a message to one is refused at once, naming it).
GONE_KEPT = 256


class ProcAgent:
    """The control plane of one process (see the module docstring); it is the
    kernel's ``agent`` (``_kernel._upper.ProcAgentProtocol``) and what each
    actor's host calls back (``_proc._host.HostAgent``)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.runtime: Any = None
        self.proc_ready = threading.Event()
        self.init_error: BaseException | None = None
        self.held: dict[str, collections.deque] = {}
        # Actor messages are routed off the loop (the kernel's reader threads),
        # spawns on it: this lock makes "register the actor and hand it what
        # was held" one step, so a message never overtakes an earlier one
        # that was held because it arrived before the spawn.
        self.hold_lock = threading.Lock()
        #: actor key -> (the actor, in words; why it is gone): the last GONE_KEPT ended actors
        self.gone: MutableMapping[str, tuple[str, str]] = _state.Recent(GONE_KEPT)
        #: actor key -> its rank, for the ended actors that stopped (a later mesh stop is answered for that rank)
        self.stopped_ranks: MutableMapping[str, int] = _state.Recent(GONE_KEPT)
        self.owned: list[Any] = []  # ProcMesh/ActorMesh objects created outside any actor
        self.owned_lock = threading.Lock()
        self.controllers: dict[str, Any] = {}
        self.controller_waiters: dict[str, list] = {}
        self._sweeper_started = False
        self.stopping = False
        #: A worker loop (``monarch_core._launch._worker.WorkerLoopAgent``): starts procs for clients.
        self.is_host = False
        #: supervision, proc deaths and heartbeats (``_watch``)
        self.watch = ProcWatch(kernel, self.gone, self)
        kernel.events.subscribe("proc_failed", self._on_proc_failed)
        self._control = self.control_handlers()
        #: seconds an actor's stop may take before it completes without the actor's thread
        self.stop_grace: float = STOP_GRACE

    # ---------------------------------------------------------------- dispatch (loop thread)
    def control_handlers(self) -> dict[type, Callable[[Any, Any, list, str], None]]:
        """The control messages this agent answers: message type -> handler."""
        return {
            C.Spawn: self._on_spawn,
            C.StopActor: self._on_stop_actor,
            C.Init: self._on_init,
            C.StopProc: self._on_stop_proc,
            C.Controller: self._on_controller,
            C.Supervise: self.watch.on_supervise,
            C.RegisterOwner: self.watch.on_register_owner,
            C.ProcStopping: self.watch.on_proc_stopping,
            C.ProcDied: self.watch.on_proc_died,
            C.Ping: self._on_ping,
            C.Telemetry: self._on_telemetry,
            C.TelemetryFlush: self._on_telemetry_flush,
            C.LogOption: self._on_log_option,
            C.Reload: self._on_reload,
        }

    #: control ops handled on the thread that read them, not queued for the kernel's loop: a proc's
    #: telemetry batch (its output lines; ``hub.ingest`` takes any thread), so that what an endpoint
    #: printed is printed before the reply that follows it on the same session resolves the call
    any_thread_ops: frozenset[str] = frozenset({"telemetry"})

    def handle_control(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        op = h[0]
        handler = self._control.get(C.op_type(op))  # type: ignore[arg-type]
        if handler is None:
            logger.warning("unknown control op %r from %s", op, sender)
            return
        try:
            msg = C.decode(h)
        except ProtocolError as e:
            logger.warning("malformed control message %r from %s dropped: %s", op, sender, e)
            return
        try:
            handler(msg, payload, buffers, sender)
        except (ValueError, TypeError, IndexError, KeyError, AttributeError) as e:
            logger.warning("malformed control message %r from %s dropped: %s", op, sender, e)
        except Exception:
            logger.exception("control op %r from %s failed", op, sender)

    def _on_spawn(self, m: C.Spawn, payload: Any, buffers: list, sender: str) -> None:
        from monarch_core._proc._host import ActorHost

        key, owner = m.key, m.owner
        if key in self.kernel.actors:
            logger.warning("duplicate spawn of actor %s from %s ignored", key, sender)
            return
        host = ActorHost(
            self, key, m.mesh_name, m.rank, m.labels, m.sizes, m.init_reply, payload, buffers, m.class_name, owner,
            m.trace,
        )
        with self.hold_lock:  # what was held goes first; then the actor is visible to the readers
            held = self.held.pop(key, None)
            if held:
                for _t, hh, p, b, snd in held:
                    host.enqueue(hh, p, b, snd)
            self.kernel.actors[key] = host
        parent = self.runtime.parent if self.runtime is not None else None
        if owner and parent and owner[0] not in (parent[0], self.kernel.proc_id):
            # An owner other than our parent: the parent (which sees our exit
            # status) tells it when this proc ends.
            self.kernel.send(parent[0], parent[1], W.K_CONTROL, 0,
                             C.encode(C.RegisterOwner(self.kernel.proc_id, owner[:2])), b"", [])

    def _on_stop_actor(self, m: C.StopActor, payload: Any, buffers: list, sender: str) -> None:
        host = self._host(m.key)
        if host is None:  # never here, or stopped already (it may have stopped itself): stopped, for its rank
            if m.reply:
                send_to_port(m.reply, self.stopped_ranks.get(m.key, -1), W.S_VALUE, None)
            return
        host.request_stop(m.reason, m.reply)

    def _host(self, key: str) -> ActorHost | None:
        """This proc's actor ``key``: the kernel's mailbox of that key, which
        this agent made (``_on_spawn``), an ``ActorHost``."""
        return cast("ActorHost | None", self.kernel.actors.get(key))

    def _on_init(self, m: C.Init, payload: Any, buffers: list, sender: str) -> None:
        reply, rank = m.reply, m.rank

        def run() -> None:
            try:
                _run_proc_setup(self.runtime)
                fn = _serial.loads(payload, buffers)
                if fn is not None:
                    import inspect

                    r = fn()
                    if inspect.isawaitable(r):
                        import asyncio

                        async def _await(x: Any) -> Any:
                            return await x

                        asyncio.run(_await(r))
            except BaseException as e:
                self.init_error = wrap_exception(e, "bootstrap")
                logger.error("proc bootstrap failed: %r", e,
                             extra=self.runtime.instrumentation.log_extra("user", endpoint="bootstrap", rank=rank))
                send_to_port(reply, rank, W.S_ERROR, self.init_error)
            else:
                send_to_port(reply, rank, W.S_VALUE, ("ready", self.kernel.proc_id))
            finally:
                self.proc_ready.set()

        threading.Thread(target=run, name="monarch-proc-bootstrap", daemon=True).start()

    def _on_stop_proc(self, m: C.StopProc, payload: Any, buffers: list, sender: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        threading.Thread(
            target=self._stop_proc, args=(m.reason, m.grace), name="monarch-proc-stop", daemon=True
        ).start()

    def _stop_proc(self, reason: str, grace: float) -> None:
        """Stop within ``grace`` seconds (the stopper escalates to signals a
        little after it): the actors, then the last output and acknowledgements,
        each waiting at most for what is left of it."""
        deadline = time.monotonic() + grace

        def left() -> float:  # what remains of the grace, for one more wait of at most 1 s
            return min(1.0, max(0.05, deadline - time.monotonic()))

        try:
            # This thread's waits below do not read the sockets: the poller's
            # thread reads for them at once (not after its standby).
            with following():
                self.kernel.call_soon(self._announce_stopping)
                # Everything delivered here was handled (or will be, before the actors stop):
                # say so now, or the senders would count what is unacknowledged as lost.
                self.kernel.call_soon(self.kernel.ack_at_once)
                self.stop_everything(reason, grace)
                self.runtime.events.emit("proc_ending")  # its output and last telemetry go out before it ends
                try:
                    self.kernel.run(self.kernel.settle_acks, left())
                    # let replies already queued (stop acknowledgements) reach their ports
                    self.kernel.run(self.kernel.flush, left())
                except Exception:  # pragma: no cover - the loop is already gone
                    pass
        finally:
            self.kernel.stop_loop()

    def _announce_stopping(self) -> None:
        """Tell every proc that talks to us that our end will be a stop, not a crash."""
        header = C.encode(C.ProcStopping(self.kernel.proc_id))
        for peer, addr in list(self.kernel.peers().items()):
            self.kernel.send(peer, addr, W.K_CONTROL, 0, header, b"", [])

    def _on_controller(self, m: C.Controller, payload: Any, buffers: list, sender: str) -> None:
        name, reply = m.name, m.reply
        existing = self.controllers.get(name)
        if existing is not None:
            send_to_port(reply, -1, W.S_VALUE, existing)
            return
        waiters = self.controller_waiters.get(name)
        if waiters is not None:
            waiters.append(reply)
            return
        self.controller_waiters[name] = [reply]
        self._spawn_controller_here(name, payload, buffers)

    def _spawn_controller_here(self, name: str, payload: Any, buffers: list) -> None:
        """On the root proc (kernel loop): spawn controller ``name`` here
        (``payload``: its ``_serial.dumps_spawn``); every waiter
        hears of it through :meth:`controller_ready`."""
        import uuid

        from monarch_core._kernel._ports import PortHandler
        from monarch_core._proc._slot import ProcSlot

        kernel = self.kernel
        key = f"controller-{name}-{uuid.uuid4().hex[:8]}"
        agent = self

        class _Init(PortHandler):
            def deliver(self, rank: int, status: int, p: Any, b: list) -> None:
                kernel.remove_port(port_id)
                err = None
                if status != W.S_VALUE:
                    try:
                        err = _serial.loads(p, b)
                    except Exception as e:  # noqa: BLE001
                        err = e
                agent.controller_ready(name, (key, kernel.proc_id, kernel.address), err)

            def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
                agent.controller_ready(name, None, exc)

        port_id = kernel.add_port(_Init())
        owner = (kernel.proc_id, kernel.address, "")
        spawn = C.Spawn(key, name, 0, (), (), (kernel.proc_id, kernel.address, port_id), "controller", owner)
        self.register_supervised(
            Supervised(key, name, "controller", None, None, {}, [ProcSlot(kernel.proc_id, kernel.address)])
        )
        self._on_spawn(spawn, payload, buffers, kernel.proc_id)

    def controller_ready(self, name: str, mesh: Any, error: BaseException | None) -> None:
        """Called (any thread) when a controller's __init__ finished."""
        if error is None:
            self.controllers[name] = mesh
        for reply in self.controller_waiters.pop(name, []):
            if error is None:
                send_to_port(reply, -1, W.S_VALUE, mesh)
            else:
                send_to_port(reply, -1, W.S_ERROR, error)

    # ---------------------------------------------------------------- supervision and heartbeats (``watch``)
    @property
    def supervised(self) -> dict[str, Supervised]:
        """Actor mesh key -> what this process, its owner, knows of it."""
        return self.watch.supervised

    @property
    def proc_owners(self) -> dict[str, set[tuple]]:
        """Child proc id -> the other owners of meshes on it."""
        return self.watch.proc_owners

    def actor_failed(self, host: ActorHost, cause: str, category: str, chain: list[dict]) -> dict:
        """An actor of this proc died (any thread): report it (``ProcWatch.actor_failed``)."""
        return self.watch.actor_failed(host, cause, category, chain)

    def register_supervised(self, rec: Supervised) -> None:
        self.watch.register_supervised(rec)

    def unregister_supervised(self, key: str) -> None:
        self.watch.unregister_supervised(key)

    def handle_report(self, report: dict) -> None:
        """A mesh this process owns lost a rank (``ProcWatch.handle_report``)."""
        self.watch.handle_report(report)

    def note_failure_cause(self, proc_id: str, cause: str) -> None:
        """What was observed of ``proc_id``'s coming failure (``ProcWatch.note_failure_cause``)."""
        self.watch.note_failure_cause(proc_id, cause)

    def return_ref(self) -> tuple:
        """This process's port for undeliverable messages sent outside any actor."""
        return self.watch.return_ref()

    def undeliverable(self, exc: BaseException) -> None:
        """A message sent from outside any actor could not be delivered."""
        self.watch.undeliverable(exc)

    def watch_child(self, proc_id: str) -> None:
        """Start heartbeating a child proc (loop thread)."""
        self.watch.watch_child(proc_id)

    def watch_host(self, proc_id: str, address: str, on_silent: Callable[[str], None]) -> None:
        """Heartbeat the worker loop ``proc_id`` (``ProcWatch.watch_host``; loop thread)."""
        self.watch.watch_host(proc_id, address, on_silent)

    def unwatch_host(self, proc_id: str) -> None:
        """Stop heartbeating worker loop ``proc_id`` (loop thread)."""
        self.watch.unwatch_host(proc_id)

    def heartbeat_tick(self, now: float, paused: float | None) -> None:
        """Called once per heartbeat (loop thread); ``paused``: how long this
        process did not run before this tick (``None``: it ran).  The worker
        loop checks on its clients here."""

    def _on_proc_failed(self, proc_id: str, reason: str, stopped: bool) -> None:
        """A proc died or was cut off (the kernel's ``proc_failed`` event)."""
        self.watch.on_proc_failed(proc_id, reason, stopped)

    def _on_ping(self, m: C.Ping, payload: Any, buffers: list, sender: str) -> None:
        self.watch.on_ping(m, payload, buffers, sender)

    def forward_tree(self, kernel: Kernel, header: bytes, payload: Any, buffers: list, sender: str) -> None:
        """Forward a cast-tree message this proc is on the way of (``_tree.forward``)."""
        _tree.forward(kernel, header, payload, buffers, sender)

    # ---------------------------------------------------------------- undeliverable
    def no_such_actor(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        """A message for an actor this proc does not (yet) have: refuse it if
        the actor is gone, else hold it until the spawn arrives (any thread).
        A header of the wrong shape raises :class:`ProtocolError`, as
        ``ActorHost.enqueue`` does (the kernel checks only the key)."""
        if not (len(h) == 9 or (len(h) == 10 and type(h[9]) is bytes)) or type(h[1]) is not str:
            raise ProtocolError(f"peer {sender} sent a malformed actor message header")
        key = h[0]
        gone = self.gone.get(key)
        if gone is not None:
            from monarch_core._proc._tree import STOP_METHOD

            if h[1] == STOP_METHOD and h[2] and key in self.stopped_ranks:
                send_to_port(tuple(h[2]), h[3], W.S_VALUE, None)  # a mesh stop of one that stopped itself: done
                return
            who, why = gone
            self._reply_error(h, SupervisionError(f"actor {who} is gone ({why}); {h[1]} was not run"))
            return
        with self.hold_lock:
            host = self.kernel.actors.get(key)
            if host is None:
                q = self.held.get(key)
                if q is None:
                    q = self.held[key] = collections.deque()
                q.append((time.monotonic(), h, payload, buffers, sender))
        if host is not None:  # spawned meanwhile: what was held went first
            host.enqueue(h, payload, buffers, sender)
            return
        if not self._sweeper_started:
            if self.kernel.in_loop():
                self._ensure_sweeper()
            else:
                self.kernel.call_soon(self._ensure_sweeper)

    def _ensure_sweeper(self) -> None:
        if not self._sweeper_started:
            self._sweeper_started = True
            self.kernel.start_task(self._sweep)

    async def _sweep(self) -> None:
        import trio

        while True:
            await trio.sleep(1.0)
            now = time.monotonic()
            expired = []
            with self.hold_lock:
                for key in list(self.held):
                    q = self.held[key]
                    while q and now - q[0][0] > HOLD_TIMEOUT:
                        expired.append((key, q.popleft()[1]))
                    if not q:
                        del self.held[key]
            for key, h in expired:
                self._reply_error(
                    h,
                    UndeliverableMessageError(
                        f"no actor {key!r} on proc {self.kernel.proc_id} after {HOLD_TIMEOUT:.0f}s; "
                        f"{h[1]} was not delivered"
                    ),
                )

    def _reply_error(self, h: tuple, exc: BaseException) -> None:
        """Tell the sender of actor message ``h`` that it was not handled: its
        reply port if it has one, else its undeliverable-return port.  A
        malformed reply address (from a broken or hostile peer) is dropped."""
        try:
            self._reply_error_to(h, exc)
        except (ValueError, TypeError, IndexError) as e:
            logger.warning("cannot answer message %r: malformed reply address (%s)", h[:2], e)

    def _reply_error_to(self, h: tuple, exc: BaseException) -> None:
        reply = h[2]
        if reply:
            send_to_port(tuple(reply), h[3], W.S_ERROR, exc)
        elif len(h) > 7 and h[7]:
            err = exc if isinstance(exc, UndeliverableMessageError) else UndeliverableMessageError(str(exc))
            send_to_port(tuple(h[7]), h[3], W.S_ERROR, err)

    def reply_gone(self, h: tuple, host: ActorHost) -> None:
        gone = self.gone.get(host.key)
        why = f" ({gone[1]})" if gone is not None else ""
        self._reply_error(h, SupervisionError(f"actor {host.describe()} is gone{why}; {h[1]} was not run"))

    # ---------------------------------------------------------------- telemetry
    def _on_telemetry(self, m: C.Telemetry, payload: Any, buffers: list, sender: str) -> None:
        self.runtime.instrumentation.on_telemetry(payload, sender)

    def _on_telemetry_flush(self, m: C.TelemetryFlush, payload: Any, buffers: list, sender: str) -> None:
        self.runtime.instrumentation.on_flush(m.reply)

    def _on_log_option(self, m: C.LogOption, payload: Any, buffers: list, sender: str) -> None:
        self.runtime.instrumentation.on_log_option(m.reply, m.stream, m.level)

    def _on_reload(self, m: C.Reload, payload: Any, buffers: list, sender: str) -> None:
        from monarch_core._proc import _reload

        _reload.on_reload(m.reply, m.paths)

    # ---------------------------------------------------------------- lifecycle of actors

    def actor_stopped(self, host: ActorHost, reason: str) -> None:
        self.gone[host.key] = (host.describe(), f"stopped: {reason}")
        self.stopped_ranks[host.key] = host.rank.rank
        self.kernel.actors.pop(host.key, None)
        _lifecycle.emit("actor_stopped", actor_key=host.key, actor_name=host.display_name, why=reason)
        tables = self.kernel.tree_tables
        for k in [k for k in tables if k[0] == host.key]:  # cast-tree addresses of its mesh
            tables.pop(k, None)

    async def stop_owned_async(self, host: ActorHost) -> None:
        """Stop the meshes an actor owns (from the actor's loop)."""
        owned = list(host.owned)
        host.owned.clear()
        if not owned:
            return
        import asyncio

        await asyncio.get_running_loop().run_in_executor(None, _stop_meshes, owned, STOP_GRACE)

    def stop_meshes(self, meshes: list) -> None:
        """Stop ``meshes`` (blocking, bounded by the stop grace; not on the loop)."""
        _stop_meshes(meshes, STOP_GRACE)

    def register_owned(self, mesh: Any) -> None:
        host = _state.current_actor.get()
        if host is not None:
            host.owned.append(mesh)
        else:
            with self.owned_lock:
                self.owned.append(mesh)

    def unregister_owned(self, mesh: Any) -> None:
        with self.owned_lock:
            try:
                self.owned.remove(mesh)
            except ValueError:
                pass

    def shutdown_owned(self, timeout: float) -> None:
        self.stop_everything("the client shut down", timeout)

    def stop_everything(self, reason: str, timeout: float) -> None:
        """Stop all actors of this process and every mesh it owns (blocking;
        not on the loop thread), between the ``proc_stopping`` and
        ``proc_stopped`` lifecycle events (what the layers above and plugins
        hold for this process is released at the second, whatever the
        stopping managed)."""
        _lifecycle.emit("proc_stopping", why=reason)
        try:
            with self.owned_lock:
                owned = list(self.owned)
                self.owned.clear()
            hosts = [cast("ActorHost", h) for h in self.kernel.actors.values()]  # (see ``_host``)
            for host in hosts:
                owned.extend(host.owned)
                host.owned.clear()
            _stop_meshes(owned, timeout)
            _stop_actors(self.kernel, hosts, reason, timeout)
        finally:
            _lifecycle.emit("proc_stopped", why=reason)


def _stop_actors(kernel: Kernel, hosts: list[ActorHost], reason: str, timeout: float) -> None:
    """Stop ``hosts`` and wait (at most ``timeout`` seconds) until they have:
    the idle ones at once, without waking their threads (``stop_if_idle``),
    the others each on its own thread, all at the same time."""
    from monarch_core._proc._future import Cell

    cells = []
    for host in hosts:
        if host.stop_if_idle(reason):  # nothing to run: stopped without waking its thread
            continue
        c = Cell()
        pid = kernel.add_port(_LocalSignal(c))
        host.request_stop(reason, (kernel.proc_id, kernel.address, pid))
        cells.append(c)
    deadline = time.monotonic() + timeout
    for c in cells:
        c.wait(max(0.0, deadline - time.monotonic()))


class _LocalSignal:
    def __init__(self, cell: Any) -> None:
        self.cell = cell

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        self.cell.set_result(None)

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        self.cell.set_result(None)


def _stop_meshes(meshes: list, timeout: float) -> None:
    """Stop ``meshes`` (the last registered first) within about ``timeout``
    seconds, tier by tier (a mesh's ``_stop_tier``, 0 unless it says so):
    proc and actor meshes together, then, once they are gone, host meshes --
    whose worker loops report their procs' ends; a host mesh stopped while
    its procs stop leaves that stop waiting for reports that never come."""
    deadline = time.monotonic() + timeout
    tiers = sorted({getattr(m, "_stop_tier", 0) for m in meshes})
    for tier in tiers:
        left = max(1.0, deadline - time.monotonic())  # a later tier still gets a (short) stop
        grace = max(0.5, left - 1.0)
        futs = []
        for m in reversed(meshes):
            if getattr(m, "_stop_tier", 0) != tier:
                continue
            try:
                futs.append(m._stop_owned("its owner stopped", grace))
            except Exception:
                logger.exception("stopping %r failed", m)
        until = time.monotonic() + left
        for f in futs:
            try:
                f.get(timeout=max(0.1, until - time.monotonic()))
            except Exception as e:
                logger.warning("stop did not complete cleanly: %s", e)


def _run_proc_setup(rt: Any) -> None:
    """Run plugins' ``monarch_proc_setup`` hooks in this (new) proc."""
    from monarch_core._plugins import registry

    reg = registry()
    if reg.pm.hook.monarch_proc_setup.get_hookimpls():
        reg.pm.hook.monarch_proc_setup(proc_name=rt.name, rank=rt.point.rank)
