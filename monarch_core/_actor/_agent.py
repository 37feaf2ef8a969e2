"""The proc agent: the control plane of one process.

Handles control messages (spawn/stop actors, run the proc's bootstrap, stop
the proc, controllers), holds messages that arrive for an actor before its
spawn message, starts local child procs, and owns the meshes this process
created outside any actor.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import trio

from monarch_core._actor import _serial, _state
from monarch_core._actor._port import send_to_port, wrap_exception
from monarch_core._kernel import _wire as W
from monarch_core.errors import SupervisionError, UndeliverableMessageError

if TYPE_CHECKING:
    from monarch_core._actor._host import ActorHost
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.proc")

#: Seconds a message for a not-yet-spawned actor is held before it is
#: returned as undeliverable.
HOLD_TIMEOUT = 30.0
STOP_GRACE = float(os.environ.get("MONARCH_STOP_GRACE", "10"))


class ProcAgent:
    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.runtime: Any = None
        self.proc_ready = threading.Event()
        self.init_error: BaseException | None = None
        self.held: dict[str, collections.deque] = {}
        self.gone: dict[str, str] = {}  # actor key -> why it is gone
        self.owned: list[Any] = []  # ProcMesh/ActorMesh objects created outside any actor
        self.owned_lock = threading.Lock()
        self.controllers: dict[str, Any] = {}
        self.controller_waiters: dict[str, list] = {}
        self._sweeper_started = False
        self.stopping = False

    # ---------------------------------------------------------------- dispatch (loop thread)
    def handle_control(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        op = h[0]
        try:
            handler = getattr(self, "_op_" + op)
        except AttributeError:
            logger.warning("unknown control op %r from %s", op, sender)
            return
        try:
            handler(h, payload, buffers, sender)
        except Exception:
            logger.exception("control op %r from %s failed", op, sender)

    def _op_spawn(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        from monarch_core._actor._host import ActorHost

        _op, key, mesh_name, rank, labels, sizes, init_reply, class_name = h
        if key in self.kernel.actors:
            logger.warning("duplicate spawn of actor %s from %s ignored", key, sender)
            return
        host = ActorHost(
            self,
            key,
            mesh_name,
            rank,
            tuple(labels),
            tuple(sizes),
            tuple(init_reply) if init_reply else None,
            payload,
            buffers,
            class_name,
        )
        self.kernel.actors[key] = host
        held = self.held.pop(key, None)
        if held:
            for _t, hh, p, b in held:
                host.enqueue(hh, p, b)

    def _op_stop_actor(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        _op, key, reply, reason = h
        host = self.kernel.actors.get(key)
        if host is None:
            if reply:
                send_to_port(tuple(reply), -1, W.S_VALUE, None)
            return
        host.request_stop(reason, tuple(reply) if reply else None)

    def _op_init(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        _op, reply, rank = h
        reply = tuple(reply)

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
                logger.error("proc bootstrap failed: %r", e)
                send_to_port(reply, rank, W.S_ERROR, self.init_error)
            else:
                send_to_port(reply, rank, W.S_VALUE, ("ready", self.kernel.proc_id))
            finally:
                self.proc_ready.set()

        threading.Thread(target=run, name="monarch-proc-bootstrap", daemon=True).start()

    def _op_stop_proc(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        _op, reason, grace = h
        if self.stopping:
            return
        self.stopping = True
        threading.Thread(
            target=self._stop_proc, args=(reason, float(grace)), name="monarch-proc-stop", daemon=True
        ).start()

    def _stop_proc(self, reason: str, grace: float) -> None:
        try:
            self.stop_everything(reason, grace)
            try:  # let replies already queued (stop acknowledgements) reach their ports
                self.kernel.run(self.kernel.flush, 1.0)
            except Exception:  # pragma: no cover - the loop is already gone
                pass
        finally:
            self.kernel.stop_loop()

    def _op_controller(self, h: tuple, payload: Any, buffers: list, sender: str) -> None:
        _op, name, reply = h
        reply = tuple(reply)
        existing = self.controllers.get(name)
        if existing is not None:
            send_to_port(reply, -1, W.S_VALUE, existing)
            return
        waiters = self.controller_waiters.get(name)
        if waiters is not None:
            waiters.append(reply)
            return
        self.controller_waiters[name] = [reply]
        from monarch_core._actor._mesh import spawn_local_controller

        spawn_local_controller(self, name, payload, buffers)

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
        the actor is gone, else hold it until the spawn arrives (any thread)."""
        key = h[0]
        why = self.gone.get(key)
        if why is not None:
            self._reply_error(h, SupervisionError(f"actor {h[0]!r} is gone ({why}); {h[1]} was not run"))
            return
        if not self.kernel.in_loop():
            self.kernel.call_soon(self.no_such_actor, h, payload, buffers, sender)
            return
        host = self.kernel.actors.get(key)
        if host is not None:  # spawned while this hopped onto the loop
            host.enqueue(h, payload, buffers)
            return
        q = self.held.get(key)
        if q is None:
            q = self.held[key] = collections.deque()
        q.append((time.monotonic(), h, payload, buffers))
        self._ensure_sweeper()

    def _ensure_sweeper(self) -> None:
        if not self._sweeper_started:
            self._sweeper_started = True
            self.kernel.start_task(self._sweep)

    async def _sweep(self) -> None:
        while True:
            await trio.sleep(1.0)
            now = time.monotonic()
            for key in list(self.held):
                q = self.held[key]
                while q and now - q[0][0] > HOLD_TIMEOUT:
                    _t, h, _p, _b = q.popleft()
                    self._reply_error(
                        h,
                        UndeliverableMessageError(
                            f"no actor {key!r} on proc {self.kernel.proc_id} after {HOLD_TIMEOUT:.0f}s; "
                            f"{h[1]} was not delivered"
                        ),
                    )
                if not q:
                    del self.held[key]

    def _reply_error(self, h: tuple, exc: BaseException) -> None:
        reply = h[2]
        if reply:
            send_to_port(tuple(reply), h[3], W.S_ERROR, exc)

    def reply_gone(self, h: tuple, host: ActorHost) -> None:
        self._reply_error(h, SupervisionError(f"actor {host.display_name} is gone; {h[1]} was not run"))

    # ---------------------------------------------------------------- lifecycle of actors
    def actor_failed(self, host: ActorHost, why: str, err: BaseException) -> None:
        """An actor died (any thread).  Later calls to it fail with the cause."""
        from monarch_core._actor import _supervision

        _supervision.actor_failed(self, host, why, err)

    def actor_stopped(self, host: ActorHost, reason: str) -> None:
        self.gone[host.key] = f"stopped: {reason}"
        self.kernel.actors.pop(host.key, None)

    async def stop_owned_async(self, host: ActorHost) -> None:
        """Stop the meshes an actor owns (from the actor's loop)."""
        owned = list(host.owned)
        host.owned.clear()
        if not owned:
            return
        import asyncio

        await asyncio.get_running_loop().run_in_executor(None, _stop_meshes, owned, STOP_GRACE)

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


def _run_proc_setup(rt: Any) -> None:
    """Run plugins' ``monarch_proc_setup`` hooks in this (new) proc."""
    from monarch_core._plugins import registry

    reg = registry()
    if reg.pm.hook.monarch_proc_setup.get_hookimpls():
        reg.pm.hook.monarch_proc_setup(proc_name=rt.name, rank=rt.point.rank)


def bootstrap_env_json(info: dict) -> str:
    return json.dumps(info, separators=(",", ":"))
