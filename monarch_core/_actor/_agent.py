"""The proc agent: the control plane of one process.

Handles control messages (spawn/stop actors, run the proc's bootstrap, stop
the proc, controllers), holds messages that arrive for an actor before its
spawn message, heartbeats the child procs this process started, and owns the
meshes this process created outside any actor.  A worker loop's agent
(starting procs for remote clients) is ``monarch_core._launch._worker``.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable


from monarch_core import settings
from monarch_core import _telemetry
from monarch_core._actor import _instrument, _serial, _state
from monarch_core._actor._port import ReturnPort, send_to_port, wrap_exception
from monarch_core._kernel import _control as C
from monarch_core._kernel import _wire as W
from monarch_core.errors import ProtocolError, SupervisionError, UndeliverableMessageError

if TYPE_CHECKING:
    from monarch_core._actor._host import ActorHost
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.proc")

#: Seconds a message for a not-yet-spawned actor is held before it is
#: returned as undeliverable.
HOLD_TIMEOUT = 30.0
STOP_GRACE: float = settings.get("MONARCH_STOP_GRACE")
#: Seconds between heartbeats a parent sends its child procs, and how long a
#: child may go without answering before it is declared hung and killed.
HEARTBEAT_INTERVAL: float = settings.get("MONARCH_HEARTBEAT_INTERVAL")
HEARTBEAT_TIMEOUT: float = settings.get("MONARCH_HEARTBEAT_TIMEOUT")


class Supervised:
    """What an owner knows about an actor mesh it owns."""

    __slots__ = ("key", "name", "class_name", "mesh", "owner_host", "health", "members")

    def __init__(self, key: str, name: str, class_name: str, mesh: Any, owner_host: Any, health: dict, members: list) -> None:
        self.key = key
        self.name = name
        self.class_name = class_name
        self.mesh = mesh
        self.owner_host = owner_host
        self.health = health  # actor rank -> failure report (shared with the mesh and its slices)
        self.members = members  # _ProcSlot per actor rank


class ProcAgent:
    def __init__(self, kernel: Kernel) -> None:
        from monarch_core._actor import _tree

        self.kernel = kernel
        kernel.tree_handler = _tree.forward  # this proc forwards cast-tree messages it is on the way of
        self.runtime: Any = None
        self.proc_ready = threading.Event()
        self.init_error: BaseException | None = None
        self.held: dict[str, collections.deque] = {}
        # Actor messages are routed off the loop (the kernel's reader threads),
        # spawns on it: this lock makes "register the actor and hand it what
        # was held" one step, so a message never overtakes an earlier one
        # that was held because it arrived before the spawn.
        self.hold_lock = threading.Lock()
        self.gone: dict[str, tuple[str, str]] = {}  # actor key -> (the actor, in words; why it is gone)
        self.owned: list[Any] = []  # ProcMesh/ActorMesh objects created outside any actor
        self.owned_lock = threading.Lock()
        self.controllers: dict[str, Any] = {}
        self.controller_waiters: dict[str, list] = {}
        self._sweeper_started = False
        self.stopping = False
        self.supervised: dict[str, Supervised] = {}
        #: A worker loop (``monarch_core._launch._worker.WorkerLoopAgent``): starts procs for clients.
        self.is_host = False
        self.proc_owners: dict[str, set[tuple]] = {}  # child proc id -> other owners of meshes on it
        self._return_port: tuple | None = None
        self._heartbeat_started = False
        self._last_pong: dict[str, float] = {}
        kernel.on_proc_failed.append(self._on_proc_failed)
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
            C.Supervise: self._on_supervise,
            C.RegisterOwner: self._on_register_owner,
            C.ProcStopping: self._on_proc_stopping,
            C.ProcDied: self._on_proc_died,
            C.Ping: self._on_ping,
            C.Telemetry: self._on_telemetry,
            C.TelemetryFlush: self._on_telemetry_flush,
            C.LogOption: self._on_log_option,
        }

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
        from monarch_core._actor._host import ActorHost

        key, owner = m.key, m.owner
        if key in self.kernel.actors:
            logger.warning("duplicate spawn of actor %s from %s ignored", key, sender)
            return
        host = ActorHost(
            self, key, m.mesh_name, m.rank, m.labels, m.sizes, m.init_reply, payload, buffers, m.class_name, owner
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
        host = self.kernel.actors.get(m.key)
        if host is None:
            if m.reply:
                send_to_port(m.reply, -1, W.S_VALUE, None)
            return
        host.request_stop(m.reason, m.reply)

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
                             extra=_telemetry.log_extra("user", endpoint="bootstrap", rank=rank))
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
        try:
            self.kernel.call_soon(self._announce_stopping)
            # Everything delivered here was handled (or will be, before the actors stop):
            # say so now, or the senders would count what is unacknowledged as lost.
            self.kernel.call_soon(self.kernel.ack_at_once)
            self.stop_everything(reason, grace)
            _instrument.final_flush()  # its output and last telemetry go out before it ends
            try:
                self.kernel.run(self.kernel.settle_acks, 1.0)
                # let replies already queued (stop acknowledgements) reach their ports
                self.kernel.run(self.kernel.flush, 1.0)
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
        _state.upper.spawn_local_controller(self, name, payload, buffers)  # type: ignore[misc] - set by _mesh

    def controller_ready(self, name: str, mesh: Any, error: BaseException | None) -> None:
        """Called (any thread) when a controller's __init__ finished."""
        if error is None:
            self.controllers[name] = mesh
        for reply in self.controller_waiters.pop(name, []):
            if error is None:
                send_to_port(reply, -1, W.S_VALUE, mesh)
            else:
                send_to_port(reply, -1, W.S_ERROR, error)

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

    # ---------------------------------------------------------------- supervision
    def actor_failed(self, host: ActorHost, cause: str, category: str, chain: list[dict]) -> dict:
        """An actor of this proc died (any thread): report it to its owner;
        the report (what its later refusals quote)."""
        from monarch_core._actor import _supervision as S
        from monarch_core._actor._port import this_proc_and_host

        self.gone.setdefault(host.key, (host.describe(), f"failed: {cause.strip().splitlines()[-1] if cause.strip() else cause}"))
        _instrument.actor_failed(host, cause, category)
        report = S.make_report(
            mesh_key=host.key,
            mesh_name=host.name,
            class_name=host.class_name,
            rank=host.rank.rank,
            coords=str(host.rank),
            actor=host.display_name,
            proc=self.runtime.name if self.runtime is not None else self.kernel.proc_id,
            cause=cause,
            category=category,
            chain=chain,
            host=this_proc_and_host()[1],
        )
        owner = host.owner
        if owner is None or owner[0] == self.kernel.proc_id:
            self.handle_report(report)
            return report
        payload, bufs = _serial.dumps(report)
        self.kernel.send(owner[0], owner[1], W.K_CONTROL, 0, C.encode(C.Supervise()), payload, bufs)
        return report

    def _on_supervise(self, m: C.Supervise, payload: Any, buffers: list, sender: str) -> None:
        try:
            report = _serial.loads(payload, buffers)
        except Exception:
            logger.exception("undecodable supervision report from %s", sender)
            return
        self.handle_report(report)

    def register_supervised(self, rec: Supervised) -> None:
        self.supervised[rec.key] = rec

    def unregister_supervised(self, key: str) -> None:
        self.supervised.pop(key, None)

    def handle_report(self, report: dict) -> None:
        """A mesh this process owns lost a rank (any thread): mark it, and hand
        the failure to the owner (``__supervise__``, or the root's hook)."""
        from monarch_core._actor import _supervision as S

        rec = self.supervised.get(report["mesh_key"])
        if rec is None:
            logger.warning(
                "failure of actor %s, whose mesh this process does not own (any more):\n%s",
                report["actor"],
                report["cause"],
            )
            return
        rank = report["rank"]
        if rank in rec.health:
            return  # each failed rank is reported once
        rec.health[rank] = report
        mesh = rec.mesh._with_region(rec.mesh._region_) if rec.mesh is not None else None
        failure = S.MeshFailure(mesh, report)
        _instrument.supervision_event(failure, report, rec.owner_host, self.runtime)
        logger.info("supervision: %s", failure.report().splitlines()[0])
        if rec.owner_host is not None:
            rec.owner_host.supervise(failure)
        elif self.runtime is not None and self.runtime.is_client:
            S.deliver_to_root(failure)
        else:
            S.proc_level_unhandled(failure)

    def _on_register_owner(self, m: C.RegisterOwner, payload: Any, buffers: list, sender: str) -> None:
        proc_id = m.proc_id
        self.proc_owners.setdefault(proc_id, set()).add(m.owner)
        if proc_id in self.kernel.dead:  # already gone: tell it now
            self._tell_owners(proc_id, self.kernel.dead[proc_id], proc_id in self.kernel._expected_exits)

    def _tell_owners(self, proc_id: str, reason: str, stopped: bool) -> None:
        for owner in self.proc_owners.pop(proc_id, ()):
            self.kernel.send(owner[0], owner[1], W.K_CONTROL, 0,
                             C.encode(C.ProcDied(proc_id, reason, stopped)), b"", [])

    def _on_proc_stopping(self, m: C.ProcStopping, payload: Any, buffers: list, sender: str) -> None:
        """A proc we talk to is stopping on purpose: its end is not a failure,
        and it waits for what it sends to be acknowledged before it goes."""
        self.kernel.expect_exit(m.proc_id)
        self.kernel.ack_at_once(m.proc_id)

    def _on_proc_failed(self, proc_id: str, reason: str, stopped: bool) -> None:
        """A proc died: every actor on it, of every mesh this process owns, failed."""
        self._last_pong.pop(proc_id, None)
        _instrument.proc_ended(proc_id, reason, stopped)
        if proc_id in self.proc_owners:
            self._tell_owners(proc_id, reason, stopped)
        if stopped:
            return
        from monarch_core._actor import _supervision as S
        from monarch_core._actor._port import this_proc_and_host

        for rec in list(self.supervised.values()):
            for rank, slot in enumerate(rec.members):
                if slot.proc_id != proc_id or rank in rec.health:
                    continue
                from monarch_core._mesh._shape import Point

                coords = str(Point(rank, rec.mesh._region_.extent)) if rec.mesh is not None else "{}"
                host = slot.host_name if slot.host is not None else (this_proc_and_host()[1] if slot.describe else None)
                self.handle_report(
                    S.make_report(
                        mesh_key=rec.key,
                        mesh_name=rec.name,
                        class_name=rec.class_name,
                        rank=rank,
                        coords=coords,
                        actor=f"{rec.name}{coords}",
                        proc=slot.describe or proc_id,
                        cause=f"its process died: {reason}",
                        category=S.INFRASTRUCTURE,
                        host=host,
                    )
                )

    def return_ref(self) -> tuple:
        """This process's port for undeliverable messages sent outside any actor."""
        if self._return_port is None:
            pid = self.kernel.add_port(ReturnPort(self))
            self._return_port = (self.kernel.proc_id, self.kernel.address, pid)
        return self._return_port

    def undeliverable(self, exc: BaseException) -> None:
        """A message sent from outside any actor could not be delivered."""
        from monarch_core._actor import _supervision as S

        if self.runtime is not None and self.runtime.is_client:
            report = S.make_report(
                mesh_key="",
                mesh_name="client",
                class_name="client",
                rank=0,
                coords="{}",
                actor="client",
                proc=self.kernel.proc_id,
                cause=f"a message the client sent could not be delivered: {exc}",
                category=S.SYSTEM,
            )
            S.deliver_to_root(S.MeshFailure(None, report))
        else:
            logger.error("a message sent by this proc could not be delivered: %s", exc)

    def _on_proc_died(self, m: C.ProcDied, payload: Any, buffers: list, sender: str) -> None:
        """A worker loop reports that a proc it started for us ended."""
        self.kernel.proc_failed(m.proc_id, m.reason, m.stopped)

    # ---------------------------------------------------------------- heartbeats
    def watch_child(self, proc_id: str) -> None:
        """Start heartbeating a child proc (loop thread)."""
        self._last_pong[proc_id] = time.monotonic()
        if not self._heartbeat_started and HEARTBEAT_INTERVAL > 0:
            self._heartbeat_started = True
            self.kernel.start_task(self._heartbeat)

    async def _heartbeat(self) -> None:
        import trio

        kernel = self.kernel
        pong = _Pong(self)
        port_id = kernel.add_port(pong)
        ref = (kernel.proc_id, kernel.address, port_id)
        header = C.encode(C.Ping(ref))
        while True:
            await trio.sleep(HEARTBEAT_INTERVAL)
            now = time.monotonic()
            for proc_id, last in list(self._last_pong.items()):
                if proc_id in kernel.dead:
                    self._last_pong.pop(proc_id, None)
                    continue
                if now - last > HEARTBEAT_TIMEOUT:
                    self._last_pong.pop(proc_id, None)
                    kernel.kill_hung(proc_id, HEARTBEAT_TIMEOUT)
                    continue
                kernel.send(proc_id, None, W.K_CONTROL, 0, header, b"", [], None)

    def _on_ping(self, m: C.Ping, payload: Any, buffers: list, sender: str) -> None:
        send_to_port(m.reply, -1, W.S_VALUE, self.kernel.proc_id)

    # ---------------------------------------------------------------- telemetry
    def _on_telemetry(self, m: C.Telemetry, payload: Any, buffers: list, sender: str) -> None:
        _instrument.on_telemetry(payload, sender)

    def _on_telemetry_flush(self, m: C.TelemetryFlush, payload: Any, buffers: list, sender: str) -> None:
        _instrument.on_flush(m.reply)

    def _on_log_option(self, m: C.LogOption, payload: Any, buffers: list, sender: str) -> None:
        _instrument.on_log_option(m.reply, m.stream, m.level)

    # ---------------------------------------------------------------- lifecycle of actors

    def actor_stopped(self, host: ActorHost, reason: str) -> None:
        self.gone[host.key] = (host.describe(), f"stopped: {reason}")
        self.kernel.actors.pop(host.key, None)
        _release_rdma(host.key, f"its owner {host.display_name} stopped ({reason})")
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
        not on the loop thread)."""
        with self.owned_lock:
            owned = list(self.owned)
            self.owned.clear()
        hosts = list(self.kernel.actors.values())
        for host in hosts:
            owned.extend(host.owned)
            host.owned.clear()
        _stop_meshes(owned, timeout)
        cells = []
        from monarch_core._actor._future import Cell

        for host in hosts:
            c = Cell()
            host_reply = _LocalSignal(c)
            pid = self.kernel.add_port(host_reply)
            host.request_stop(reason, (self.kernel.proc_id, self.kernel.address, pid))
            cells.append(c)
        deadline = time.monotonic() + timeout
        for c in cells:
            c.wait(max(0.0, deadline - time.monotonic()))
        _release_rdma(None, f"its owner's process stopped ({reason})")


class _Pong:
    def __init__(self, agent: ProcAgent) -> None:
        self.agent = agent

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        try:
            proc_id = _serial.loads(payload, buffers)
        except Exception:
            return
        if proc_id in self.agent._last_pong:
            self.agent._last_pong[proc_id] = time.monotonic()

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        return None


class _LocalSignal:
    def __init__(self, cell: Any) -> None:
        self.cell = cell

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        self.cell.set_result(None)

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        self.cell.set_result(None)


def _stop_meshes(meshes: list, timeout: float) -> None:
    futs = []
    grace = max(0.5, timeout - 1.0)
    for m in reversed(meshes):
        try:
            futs.append(m._stop_owned("its owner stopped", grace))
        except Exception:
            logger.exception("stopping %r failed", m)
    deadline = time.monotonic() + timeout
    for f in futs:
        try:
            f.get(timeout=max(0.1, deadline - time.monotonic()))
        except Exception as e:
            logger.warning("stop did not complete cleanly: %s", e)


def _release_rdma(owner_key: str | None, why: str) -> None:
    """End the RDMA buffer registrations of actor ``owner_key`` (``None``: all
    of this process's).  Nothing to do, and nothing imported, in a process
    that never registered one."""
    service = sys.modules.get("monarch_core._rdma._service")
    if service is None:
        return
    try:
        if owner_key is None:
            service.release_all(why)
        else:
            service.release_owner(owner_key, why)
    except Exception:  # noqa: BLE001 - stopping must go on
        logger.exception("releasing RDMA registrations failed")


def _run_proc_setup(rt: Any) -> None:
    """Run plugins' ``monarch_proc_setup`` hooks in this (new) proc."""
    from monarch_core._plugins import registry

    reg = registry()
    if reg.pm.hook.monarch_proc_setup.get_hookimpls():
        reg.pm.hook.monarch_proc_setup(proc_name=rt.name, rank=rt.point.rank)
