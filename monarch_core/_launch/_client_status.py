"""The client's status record (:mod:`monarch_core._status`, read by ``monarch
status``), kept up to date from the runtime's events.

``_start`` calls :func:`subscribe` on a client's runtime (``rt.events``),
after telemetry's listeners (procs have no record).  The listeners update the
record at the events that change what ``monarch status`` shows: a host mesh
spawned, stopping or stopped, a proc mesh spawned, each proc ready or ended, a
proc mesh stopping or stopped, an actor mesh spawned (running once every
``__init__`` returned), stopping or stopped.  The record is written whether
telemetry is on or not; without one (``_status.current()`` is None) they do
nothing.
"""

from __future__ import annotations

from typing import Any, Optional

from monarch_core import _status
from monarch_core._kernel._events import EventBus
from monarch_core._telemetry._instrument import when_resolved

__all__ = ["subscribe"]


def subscribe(events: EventBus) -> None:
    """This client's status record listens to its runtime's bus ``events``
    (``ProcRuntime.events``).  Called once, where the client's runtime is assembled."""
    for event, listener in (
        ("host_mesh_spawned", _host_mesh_spawned),
        ("host_mesh_stopping", _host_mesh_stopping),
        ("host_mesh_stopped", _host_mesh_stopped),
        ("proc_mesh_spawned", _proc_mesh_spawned),
        ("proc_ready", _proc_ready),
        ("proc_ended", _proc_ended),
        ("proc_mesh_stopping", _proc_mesh_stopping),
        ("proc_mesh_stopped", _proc_mesh_stopped),
        ("actor_mesh_spawned", _actor_mesh_spawned),
        ("actor_mesh_stopping", _actor_mesh_stopping),
    ):
        events.subscribe(event, listener)


def _host_mesh_spawned(mesh: str, hosts: list, scheduler: Optional[str]) -> None:
    rec = _status.current()
    if rec is not None:
        rec.host_mesh(str(mesh), "running", len(hosts) if isinstance(hosts, list) else None, scheduler)


def _host_mesh_stopping(mesh: str, shutdown: bool) -> None:
    rec = _status.current()
    if rec is not None:
        rec.host_mesh(str(mesh), "stopping", None, None)


def _host_mesh_stopped(mesh: str, shutdown: bool) -> None:
    rec = _status.current()
    if rec is not None:
        rec.host_mesh(str(mesh), "stopped", None, None)


def _proc_mesh_spawned(mesh: str, slots: list, extent: Any, host_mesh: str) -> None:
    rec = _status.current()
    if rec is not None:
        rec.proc_mesh_spawned(mesh, [s.proc_id for s in slots], host_mesh, dict(zip(extent.labels, extent.sizes)))


def _proc_ready(proc_id: str, pid: Any, last: bool) -> None:
    rec = _status.current()
    if rec is not None:
        rec.proc_ready(proc_id)


def _proc_ended(proc_id: str, reason: str, stopped: bool) -> None:
    rec = _status.current()
    if rec is not None:
        rec.proc_ended(proc_id, stopped)


def _proc_mesh_stopping(mesh: str, reason: str) -> None:
    rec = _status.current()
    if rec is not None:
        rec.proc_mesh_state(str(mesh), "stopping")


def _proc_mesh_stopped(mesh: str) -> None:
    rec = _status.current()
    if rec is not None and mesh:
        rec.proc_mesh_state(mesh, "stopped")


def _actor_mesh_spawned(mesh: Any, proc_mesh: str, init: Any) -> None:
    rec = _status.current()
    if rec is None:
        return
    region = mesh._region_
    rec.actor_mesh(mesh._key, "starting", name=mesh._name, class_name=mesh._class.__qualname__,
                   proc_mesh=proc_mesh, extent=dict(zip(region.labels, region.sizes)))

    def done() -> None:
        if init.count == init.n:  # every __init__ returned (an error resolves it early)
            rec.actor_mesh(mesh._key, "running")

    when_resolved(init.cell, done)


def _actor_mesh_stopping(mesh: Any, reason: str, done: Any) -> None:
    rec = _status.current()
    if rec is not None:
        rec.actor_mesh(mesh._key, "stopping")
        when_resolved(done, rec.actor_mesh, mesh._key, "stopped")
