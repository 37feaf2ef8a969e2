"""The client's observer: telemetry's, plus this process's status record
(:mod:`monarch_core._status`, read by ``monarch status``).

``_start`` hands a :class:`ClientObserver` to the client's runtime (procs keep
the plain ``Telemetry``: only a client has a record).  Each hook does what
telemetry does, then updates the record at the points that change what
``monarch status`` shows: a host mesh spawned or stopped, a proc mesh spawned,
each proc ready or ended, a proc mesh stopping or stopped, an actor mesh
spawned or stopped.  The record is written whether telemetry is on or not.
"""

from __future__ import annotations

from typing import Any

from monarch_core import _status
from monarch_core._telemetry._instrument import when_resolved
from monarch_core._telemetry._observer import Telemetry

#: host mesh lifecycle event -> the state ``monarch status`` shows
_HOST_STATES = {"host_mesh.spawned": "running", "host_mesh.stopping": "stopping", "host_mesh.stopped": "stopped"}


class ClientObserver(Telemetry):
    """:class:`Telemetry`, keeping this client's status record up to date."""

    def lifecycle(self, name: str, **attributes: Any) -> None:  # type: ignore[override]
        Telemetry.lifecycle(name, **attributes)
        rec = _status.current()
        if rec is None:
            return
        state = _HOST_STATES.get(name)
        if state is not None:
            hosts = attributes.get("hosts")
            rec.host_mesh(str(attributes.get("mesh")), state, len(hosts) if isinstance(hosts, list) else None,
                          attributes.get("scheduler"))
        elif name == "proc_mesh.stopping":
            rec.proc_mesh_state(str(attributes.get("mesh")), "stopping")

    def register_procs(self, mesh: str, slots: list, extent: Any, host_mesh: str) -> None:  # type: ignore[override]
        Telemetry.register_procs(mesh, slots, extent, host_mesh)
        rec = _status.current()
        if rec is not None:
            rec.proc_mesh_spawned(mesh, [s.proc_id for s in slots], host_mesh, dict(zip(extent.labels, extent.sizes)))

    def proc_ready(self, proc_id: str, pid: Any, last: bool) -> None:  # type: ignore[override]
        Telemetry.proc_ready(proc_id, pid, last)
        rec = _status.current()
        if rec is not None:
            rec.proc_ready(proc_id)

    def proc_ended(self, proc_id: str, reason: str, stopped: bool) -> None:  # type: ignore[override]
        Telemetry.proc_ended(proc_id, reason, stopped)
        rec = _status.current()
        if rec is not None:
            rec.proc_ended(proc_id, stopped)

    def actor_mesh_spawned(self, mesh: Any, proc_mesh: str, init: Any) -> None:  # type: ignore[override]
        Telemetry.actor_mesh_spawned(mesh, proc_mesh, init)
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

    def actor_mesh_stopping(self, mesh: Any, reason: str, cell: Any) -> Any:  # type: ignore[override]
        cell = Telemetry.actor_mesh_stopping(mesh, reason, cell)
        rec = _status.current()
        if rec is not None:
            rec.actor_mesh(mesh._key, "stopping")
            when_resolved(cell, rec.actor_mesh, mesh._key, "stopped")
        return cell

    async def after_procs_stopped(self, kernel: Any, mesh: str) -> None:  # type: ignore[override]
        await Telemetry.after_procs_stopped(kernel, mesh)
        rec = _status.current()
        if rec is not None and mesh:
            rec.proc_mesh_state(mesh, "stopped")
