"""Supervision and liveness in the proc agent: failure reports, proc deaths, heartbeats.

:class:`ProcWatch` is the half of :class:`~._agent.ProcAgent` that turns an
actor's failure into a report for the mesh's owner, handles reports for the
meshes this process owns (``__supervise__`` or the root's hook), turns a
proc's death into a failure of every rank it held, tells registered owners of
proc deaths, returns undeliverable messages sent outside any actor, and
heartbeats the child procs this process started and the worker loops of its
host meshes (a worker loop that stops answering is a lost host: frozen or cut
off), and notices when this process itself did not run for a while (stopped,
then continued): then nobody is blamed for the silence, and every clock starts
again.

:class:`ProcWatch` is a component the agent holds (``ProcAgent.watch``),
constructed with the kernel, the agent's record of ended actors, and the
agent itself as a :class:`WatchOwner` (the two things it calls back: the
runtime, set after the agent is made, and the per-heartbeat hook a worker
loop's agent overrides).  The agent's methods of the same names delegate to it.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Callable, Protocol

from monarch_core import settings
from monarch_core._proc import _serial
from monarch_core._proc._port import ReturnPort, send_to_port
from monarch_core._proc import _control as C
from monarch_core._kernel import _wire as W
from monarch_core._kernel._child_watch import DRAIN_WAIT

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel
    from monarch_core._proc._host import ActorHost

logger = logging.getLogger("monarch.proc")

#: how many of the meshes it stopped a process remembers, to tell a failure the stop caused (``ProcWatch._released``)
RELEASED_KEPT = 4096

#: Seconds between heartbeats a parent sends its child procs, and how long a
#: child may go without answering before it is declared hung and killed.
HEARTBEAT_INTERVAL: float = settings.get("MONARCH_HEARTBEAT_INTERVAL")
HEARTBEAT_TIMEOUT: float = settings.get("MONARCH_HEARTBEAT_TIMEOUT")
#: How long a worker loop watched with :meth:`ProcWatch.watch_host` may go
#: without answering before its host is declared lost.
HOST_HEARTBEAT_TIMEOUT: float = settings.get("MONARCH_HOST_HEARTBEAT_TIMEOUT")
#: A heartbeat tick this much later than due (and at least a second) means
#: this process did not run meanwhile (SIGSTOP, a suspended VM, a stalled
#: loop): the silence it saw is its own, so nobody is declared hung or lost.
PAUSE_FACTOR: float = 1.0
#: Heartbeats a process sends per second at most, to its child procs and to
#: the worker loops it watches (each kind counted apart), before it spaces
#: their rounds out: up to ``32 * MONARCH_HEARTBEAT_INTERVAL`` peers (64 by
#: default) each is pinged every round; beyond, each is pinged every few
#: rounds (:func:`ping_every`), but at least four times within its timeout.
#: The silence checks still run every round.
PINGS_PER_S: float = 32.0


def ping_every(peers: int, limit: float, interval: float | None = None) -> int:
    """In how many heartbeat rounds (one every ``interval`` s, by default
    ``MONARCH_HEARTBEAT_INTERVAL``) each of ``peers`` is pinged once: 1 while
    pinging them all every round stays within :data:`PINGS_PER_S`; beyond,
    as many rounds as keep it there, at most as many as fit four times in
    ``limit`` (the silence after which a peer is declared hung or lost)."""
    interval = HEARTBEAT_INTERVAL if interval is None else interval
    if interval <= 0 or peers <= PINGS_PER_S * interval:
        return 1
    spaced = math.ceil(peers / (PINGS_PER_S * interval))
    return max(1, min(spaced, int(limit / (4 * interval))))


def ping_due(peer: str, rounds: int, every: int) -> bool:
    """Whether ``peer`` is pinged in heartbeat round ``rounds``, each peer
    being pinged once in ``every`` rounds (:func:`ping_every`): its phase is
    its name's hash, so that it stays put as peers come and go and the peers
    spread over the rounds."""
    return every == 1 or (rounds + hash(peer)) % every == 0


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


class WatchOwner(Protocol):
    """What a :class:`ProcWatch` calls back on its owner (the proc agent)."""

    @property
    def runtime(self) -> Any:
        """The process's runtime (``monarch_core._launch``'s ``Runtime``;
        None until it is set): its ``events``, ``name``, ``is_client``."""

    def heartbeat_tick(self, now: float, paused: float | None) -> None:
        """Called once per heartbeat (loop thread); ``paused``: how long this
        process did not run before this tick (``None``: it ran)."""


class ProcWatch:
    """Supervision and heartbeats of one process (see the module docstring)."""

    def __init__(self, kernel: Kernel, gone: MutableMapping[str, tuple[str, str]], owner: WatchOwner) -> None:
        self.kernel = kernel
        self._owner = owner
        #: actor key -> (the actor, in words; why it is gone): the agent's record, shared
        self._gone = gone
        #: actor mesh key -> what this process, its owner, knows of it
        self.supervised: dict[str, Supervised] = {}
        #: the last RELEASED_KEPT meshes this process stopped (unregister_supervised), oldest first
        self._released: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.proc_owners: dict[str, set[tuple]] = {}  # child proc id -> other owners of meshes on it
        self._return_port: tuple | None = None
        self._heartbeat_started = False
        self._last_pong: dict[str, float] = {}
        self._hosts: dict[str, _WatchedHost] = {}  # worker loop proc id -> its watch (watch_host)
        self._failure_causes: dict[str, str] = {}  # proc id -> what was observed (note_failure_cause)
        self._reported_dead: set[str] = set()  # procs whose worker loop reported their end

    @property
    def runtime(self) -> Any:
        return self._owner.runtime

    def actor_failed(self, host: ActorHost, cause: str, category: str, chain: list[dict]) -> dict:
        """An actor of this proc died (any thread): report it to its owner;
        the report (what its later refusals quote)."""
        from monarch_core._proc import _supervision as S
        from monarch_core._proc._port import this_proc_and_host

        self._gone.setdefault(host.key, (host.describe(), f"failed: {cause.strip().splitlines()[-1] if cause.strip() else cause}"))
        self.runtime.events.emit("actor_failed", host=host, cause=cause, category=category)
        report = S.make_report(
            mesh_key=host.key,
            mesh_name=host.name,
            class_name=host.class_name,
            class_path=getattr(host, "class_path", None),
            rank=host.rank.rank,
            coords=str(host.rank),
            actor=host.display_name,
            proc=self.runtime.name if self.runtime is not None else self.kernel.proc_id,
            cause=cause,
            category=category,
            chain=chain,
            host=this_proc_and_host()[1],
        )
        if host.init_error is not None:
            report["init"] = True  # its __init__ raised (``_supervision._run_hook``)
        owner = host.owner
        if owner is None or owner[0] == self.kernel.proc_id:
            self.handle_report(report)
            return report
        payload, bufs = _serial.dumps(report)
        self.kernel.send(owner[0], owner[1], W.K_CONTROL, 0, C.encode(C.Supervise()), payload, bufs)
        return report

    def on_supervise(self, m: C.Supervise, payload: Any, buffers: list, sender: str) -> None:
        try:
            report = _serial.loads(payload, buffers)
        except Exception:
            logger.exception("undecodable supervision report from %s", sender)
            return
        self.handle_report(report)

    def register_supervised(self, rec: Supervised) -> None:
        self.supervised[rec.key] = rec

    def unregister_supervised(self, key: str) -> None:
        """This process stops (and so gives up) the mesh ``key``: a failure of
        one of its actors reported from now on is a consequence of the stop
        (:meth:`handle_report`)."""
        if self.supervised.pop(key, None) is not None:
            released = self._released
            released[key] = None
            if len(released) > RELEASED_KEPT:
                released.popitem(last=False)

    def handle_report(self, report: dict) -> None:
        """A mesh this process owns lost a rank (any thread): mark it, and hand
        the failure to the owner (``__supervise__``, or the root's hook)."""
        from monarch_core._proc import _supervision as S

        rec = self.supervised.get(report["mesh_key"])
        if rec is None:
            if report.get("init"):  # its callers were told (a mesh stopped since: the client ending, say)
                logger.info("failure in __init__ of actor %s, whose mesh this process does not own (any more)",
                            report["actor"])
                return
            if report["mesh_key"] in self._released:
                # this process stopped the mesh: its actors fail as their peers stop first (a job's kill, a
                # host mesh's shutdown); the failure is no news to whoever asked for the stop
                cause = report["cause"].strip().splitlines()
                logger.info("failure of actor %s while this process stopped its mesh: %s", report["actor"],
                            cause[-1] if cause else "")
                return
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
        self.runtime.events.emit("supervision_event", failure=failure, report=report, owner_host=rec.owner_host,
                                 runtime=self.runtime)
        logger.info("supervision: %s", failure.report().splitlines()[0])
        if rec.owner_host is not None:
            rec.owner_host.supervise(failure)
        elif self.runtime is not None and self.runtime.is_client:
            S.deliver_to_root(failure)
        else:
            S.proc_level_unhandled(failure)

    def on_register_owner(self, m: C.RegisterOwner, payload: Any, buffers: list, sender: str) -> None:
        proc_id = m.proc_id
        self.proc_owners.setdefault(proc_id, set()).add(m.owner)
        if proc_id in self.kernel.dead:  # already gone: tell it now
            self._tell_owners(proc_id, self.kernel.dead[proc_id], self.kernel.exit_expected(proc_id))

    def _tell_owners(self, proc_id: str, reason: str, stopped: bool) -> None:
        for owner in self.proc_owners.pop(proc_id, ()):
            self.kernel.send(owner[0], owner[1], W.K_CONTROL, 0,
                             C.encode(C.ProcDied(proc_id, reason, stopped)), b"", [])

    def on_proc_stopping(self, m: C.ProcStopping, payload: Any, buffers: list, sender: str) -> None:
        """A proc we talk to is stopping on purpose: its end is not a failure,
        and it waits for what it sends to be acknowledged before it goes."""
        self.kernel.expect_exit(m.proc_id)
        self.kernel.ack_at_once(m.proc_id)

    def on_proc_failed(self, proc_id: str, reason: str, stopped: bool) -> None:
        """A proc died or was cut off: every actor on it, of every mesh this
        process owns, failed; the report says what was observed."""
        self._last_pong.pop(proc_id, None)
        cause = self._failure_causes.pop(proc_id, None)
        seen_dead = self._seen_dead(proc_id)
        self._reported_dead.discard(proc_id)
        self.runtime.events.emit("proc_ended", proc_id=proc_id, reason=reason, stopped=stopped)
        if proc_id in self.proc_owners:
            self._tell_owners(proc_id, reason, stopped)
        if stopped:
            return
        from monarch_core._proc import _supervision as S
        from monarch_core._proc._port import this_proc_and_host

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
                        cause=S.proc_failure_cause(reason, cause=cause, seen_dead=seen_dead,
                                                   could_not_start=slot.failed if slot.pid is None else None),
                        category=S.INFRASTRUCTURE,
                        host=host,
                    )
                )

    def note_failure_cause(self, proc_id: str, cause: str) -> None:
        """What was observed of ``proc_id``'s coming failure, for its reports
        (``host lost: ...``); set just before ``Kernel.proc_failed``."""
        self._failure_causes[proc_id] = cause

    def _seen_dead(self, proc_id: str) -> bool:
        """Was ``proc_id``'s process seen to end: its exit status read here
        (one of our children), or its worker loop reported it (``proc_died``)?"""
        entry = self.kernel.children().get(proc_id)
        return (entry is not None and "status" in entry) or proc_id in self._reported_dead

    def return_ref(self) -> tuple:
        """This process's port for undeliverable messages sent outside any actor."""
        if self._return_port is None:
            pid = self.kernel.add_port(ReturnPort(self))
            self._return_port = (self.kernel.proc_id, self.kernel.address, pid)
        return self._return_port

    def undeliverable(self, exc: BaseException) -> None:
        """A message sent from outside any actor could not be delivered."""
        from monarch_core._proc import _supervision as S

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

    def on_proc_died(self, m: C.ProcDied, payload: Any, buffers: list, sender: str) -> None:
        """A worker loop reports that a proc it started for us ended (it saw
        the exit, or killed it; loop thread).  The end is reported once the
        proc's own connections to this one were read to their end: a reply
        it sent just before it ended, on its connection, resolves its call
        rather than losing a race with the worker loop's report, on another."""
        self._reported_dead.add(m.proc_id)
        self.kernel.start_task(self._died, m)

    async def _died(self, m: C.ProcDied) -> None:
        await self.kernel.inbound_drained(m.proc_id, DRAIN_WAIT)
        self.kernel.proc_failed(m.proc_id, m.reason, m.stopped)

    # ---------------------------------------------------------------- heartbeats
    def watch_child(self, proc_id: str) -> None:
        """Start heartbeating a child proc (loop thread)."""
        self._last_pong[proc_id] = time.monotonic()
        self.ensure_heartbeat()

    def watch_host(self, proc_id: str, address: str, on_silent: Callable[[str], None]) -> None:
        """Heartbeat the worker loop ``proc_id`` at ``address`` (loop thread;
        nothing when heartbeats are off).  When it answers none for
        ``MONARCH_HOST_HEARTBEAT_TIMEOUT`` s, ``on_silent(reason)`` is called
        once, on the loop thread, and the watch ends; it ends too when the
        worker loop is known gone, or on :meth:`unwatch_host`."""
        if HEARTBEAT_INTERVAL <= 0 or proc_id in self._hosts:
            return
        w = _WatchedHost(proc_id, address, on_silent)
        w.port_id = self.kernel.add_port(_HostPong(w))
        w.header = C.encode(C.Ping((self.kernel.proc_id, self.kernel.address, w.port_id)))
        self._hosts[proc_id] = w
        self.ensure_heartbeat()

    def unwatch_host(self, proc_id: str) -> None:
        """Stop heartbeating worker loop ``proc_id`` (loop thread)."""
        w = self._hosts.pop(proc_id, None)
        if w is not None:
            self.kernel.remove_port(w.port_id)

    def heard_from(self, proc_id: str) -> None:
        """A heartbeated child proc ``proc_id`` was heard from: its hung clock
        restarts now (nothing when it is not heartbeated)."""
        if proc_id in self._last_pong:
            self._last_pong[proc_id] = time.monotonic()

    def ensure_heartbeat(self) -> None:
        """Start the heartbeat task if it is not running (loop thread)."""
        if not self._heartbeat_started and HEARTBEAT_INTERVAL > 0:
            self._heartbeat_started = True
            self.kernel.start_task(self._heartbeat)

    async def _heartbeat(self) -> None:
        import trio

        kernel = self.kernel
        pong = _Pong(self)
        port_id = kernel.add_port(pong)
        header = C.encode(C.Ping((kernel.proc_id, kernel.address, port_id)))
        host_limit = max(HOST_HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_INTERVAL)  # a few heartbeats at least
        tick = time.monotonic()
        rounds = 0
        while True:
            await trio.sleep(HEARTBEAT_INTERVAL)
            rounds += 1
            child_every = ping_every(len(self._last_pong), HEARTBEAT_TIMEOUT)
            host_every = ping_every(len(self._hosts), host_limit)
            now = time.monotonic()
            late = now - tick - HEARTBEAT_INTERVAL
            tick = now
            paused = late if late > max(1.0, PAUSE_FACTOR * HEARTBEAT_INTERVAL) else None
            if paused is not None:
                # We were stopped (or our loop stalled): the silence was ours.
                # Nobody is blamed for it; everyone gets a full timeout again.
                logger.warning(
                    "%s did not run for %.1fs (stopped and continued, or its loop stalled): not blaming its "
                    "procs or hosts for the silence; checking them again from now", kernel.proc_id, paused,
                )
                for p in self._last_pong:
                    self._last_pong[p] = now
                for w in self._hosts.values():
                    w.last = now
            for proc_id, last in list(self._last_pong.items()):
                if proc_id in kernel.dead:
                    self._last_pong.pop(proc_id, None)
                    continue
                if now - last > HEARTBEAT_TIMEOUT:
                    self._last_pong.pop(proc_id, None)
                    kernel.kill_hung(proc_id, HEARTBEAT_TIMEOUT)
                    continue
                if ping_due(proc_id, rounds, child_every):
                    kernel.send(proc_id, None, W.K_CONTROL, 0, header, b"", [], None)
            for proc_id, w in list(self._hosts.items()):
                if proc_id in kernel.dead:
                    self.unwatch_host(proc_id)
                    continue
                if now - w.last > host_limit:
                    self.unwatch_host(proc_id)
                    reason = (
                        f"its worker loop at {w.address} answered no heartbeat for {now - w.last:.0f}s "
                        f"(MONARCH_HOST_HEARTBEAT_TIMEOUT={HOST_HEARTBEAT_TIMEOUT:g}s): the host is frozen or "
                        "cut off"
                    )
                    logger.warning("%s", reason)
                    try:
                        w.on_silent(reason)
                    except Exception:
                        logger.exception("the lost-host callback of %s raised", proc_id)
                    continue
                if ping_due(proc_id, rounds, host_every):
                    kernel.send(proc_id, w.address, W.K_CONTROL, 0, w.header, b"", [], None)
            self._owner.heartbeat_tick(now, paused)

    def on_ping(self, m: C.Ping, payload: Any, buffers: list, sender: str) -> None:
        send_to_port(m.reply, -1, W.S_VALUE, self.kernel.proc_id)


class _WatchedHost:
    """A worker loop heartbeated by :meth:`ProcWatch.watch_host`."""

    __slots__ = ("proc_id", "address", "on_silent", "last", "port_id", "header")

    def __init__(self, proc_id: str, address: str, on_silent: Callable[[str], None]) -> None:
        self.proc_id = proc_id
        self.address = address
        self.on_silent = on_silent
        self.last = time.monotonic()
        self.port_id = 0
        self.header = b""


class _HostPong:
    """The port a watched worker loop answers our heartbeats on."""

    def __init__(self, w: _WatchedHost) -> None:
        self.w = w

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        self.w.last = time.monotonic()

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        return None


class _Pong:
    def __init__(self, agent: ProcWatch) -> None:
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
