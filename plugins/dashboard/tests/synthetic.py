"""Telemetry events of a synthetic job, for the model tests and the 256-proc page.

They have the shape the core's telemetry gives the dashboard's sink (the same
names and attributes as ``monarch_core.telemetry.LIFECYCLE`` and the endpoint
metric events); nothing here runs a job.  Used where spawning hundreds of real
procs on a 2-core test machine would take minutes: the behavioural tests run
against real jobs (``dashboard_job.py``).
"""

from __future__ import annotations

import time
from typing import Any, Optional

from monarch_core.hookspecs import TelemetryEvent

CLIENT = {"proc": "client-1", "proc_name": "client", "host": "vm", "pid": 1}


def lifecycle(name: str, t: int, **a: Any) -> TelemetryEvent:
    return TelemetryEvent("lifecycle", name, t, 0, {**CLIENT, **a})


def coords(rank: int, hosts: int, per_host: int) -> str:
    return f"{{'hosts': {rank // per_host}/{hosts}, 'procs': {rank % per_host}/{per_host}}}"


def job(hosts: int, per_host: int, *, mesh: str = "trainers", killed: Optional[int] = None,
        t0: Optional[int] = None) -> list[TelemetryEvent]:
    """A host mesh of ``hosts`` hosts, a proc mesh of ``per_host`` procs on each, an
    actor mesh ``mesh`` on it, all running; ``killed``: that rank's proc is then
    killed (its proc.failed, the owner's supervision event and its handling).  ``t0``: when
    it started (ns; default two minutes ago), the kill a minute later."""
    if t0 is None:
        t0 = time.time_ns() - 120_000_000_000
    names = [f"node{h:02d}" for h in range(hosts)]
    n = hosts * per_host
    ev = [lifecycle("host_mesh.spawned", t0, mesh="cluster", hosts=names, scheduler="slurm"),
          lifecycle("proc_mesh.spawned", t0 + 1, mesh="procs0", host_mesh="cluster",
                    extent={"hosts": hosts, "procs": per_host}, hosts=names),
          lifecycle("actor_mesh.spawned", t0 + 2, mesh=mesh, mesh_key=f"{mesh}-1", class_name="Trainer",
                    proc_mesh="procs0", extent={"hosts": hosts, "procs": per_host})]
    for r in range(n):
        ev.append(lifecycle("proc.ready", t0 + 10 + r, mesh="procs0", proc_id=f"procs0-{r}", rank=r,
                            coords=coords(r, hosts, per_host), host_name=names[r // per_host], os_pid=10_000 + r))
    ev.append(lifecycle("proc_mesh.ready", t0 + 10 + n, mesh="procs0"))
    ev.append(lifecycle("actor_mesh.ready", t0 + 11 + n, mesh=mesh, mesh_key=f"{mesh}-1"))
    if killed is not None:
        c = coords(killed, hosts, per_host)
        host = names[killed // per_host]
        t = t0 + 60_000_000_000
        reason = f"proc procs0{c} on host {host} (pid {10_000 + killed}) was killed by SIGKILL"
        ev += [lifecycle("proc.failed", t, mesh="procs0", proc_id=f"procs0-{killed}", rank=killed, host_name=host,
                         exit_code=None, signal="SIGKILL", reason=reason),
               lifecycle("supervision.event", t + 5_000_000, mesh=mesh, mesh_key=f"{mesh}-1", ranks=[c],
                         category="infrastructure", owner="unhandled_fault_hook", chain=[f"{mesh}{c}"],
                         root_cause={"actor": f"{mesh}{c}", "mesh": mesh, "coords": c,
                                     "proc": f"proc procs0{c} on host {host}", "category": "infrastructure",
                                     "cause": f"its process died: {reason}"}),
               lifecycle("supervision.handled", t + 6_000_000, mesh=mesh, handled_by="unhandled_fault_hook",
                         handled=True)]
    return ev


def metric(side: str, rank: Optional[int], calls: int, mean_ns: int, *, mesh: str = "trainers",
           endpoint: str = "step", errors: Optional[dict] = None, proc: str = "p") -> TelemetryEvent:
    """The cumulative endpoint metric of one proc: ``calls`` calls of ``mean_ns`` each."""
    # the histogram bucket of ``mean_ns`` (``_metrics.bucket_of``)
    bl = mean_ns.bit_length()
    b = mean_ns if bl <= 4 else ((bl - 3) << 3) | ((mean_ns >> (bl - 4)) & 7)
    return TelemetryEvent("metric", "endpoint", 1, 0, {
        **CLIENT, "side": side, "mesh": mesh, "mesh_key": f"{mesh}-1", "endpoint": endpoint, "rank": rank,
        "adverb": "" if side == "server" else "call_one", "proc": proc, "calls": calls, "errors": errors or {},
        "request_bytes": 10 * calls, "reply_bytes": 5 * calls, "latency_count": calls,
        "latency_sum_ns": mean_ns * calls, "latency_min_ns": mean_ns, "latency_max_ns": mean_ns,
        "latency_buckets": {str(b): calls} if calls else {}})


def raised(rank: int, i: int, *, mesh: str = "trainers", endpoint: str = "step", t: int = 1_700_000_001_000_000_000
           ) -> TelemetryEvent:
    """One ``endpoint.raised`` event (``ValueError: bad batch <i>``) of ``rank``, recorded in its proc."""
    tb = (f'Traceback (most recent call last):\n  File "train.py", line 42, in step\n'
          f'    raise ValueError(f"bad batch {{i}}")\nValueError: bad batch {i}\n')
    return TelemetryEvent("lifecycle", "endpoint.raised", t + i, 0, {
        "proc": f"procs0-{rank}", "proc_name": f"procs0{{rank {rank}}}", "host": "node00", "pid": 10_000 + rank,
        "mesh": mesh, "mesh_key": f"{mesh}-1", "endpoint": endpoint, "rank": rank, "error_type": "ValueError",
        "message": f"bad batch {i}", "traceback": tb, "skipped": 0})
