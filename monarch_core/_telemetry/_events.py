"""The documented schema: lifecycle events and the fields of structured error logs.

Every lifecycle event also carries where it was recorded: ``proc`` (proc id),
``proc_name``, ``host`` and ``pid``.  The attributes below describe its
subject; ``host_name`` is a host's name in its host mesh (``HostHandle.name``),
``coords`` a rank's coordinates (``{'gpus': 1/4}``).  ``docs/observability.md``
renders this table; a test checks that every name is emitted.
"""

from __future__ import annotations

import re
from typing import Any, Optional

#: event name -> (what it means, its attributes)
LIFECYCLE: dict[str, tuple[str, tuple[str, ...]]] = {
    "host_mesh.spawned": ("a host mesh is allocated and its worker loops answer (or `this_host()`)",
                          ("mesh", "hosts", "scheduler")),
    "host_mesh.lost_host": ("a scheduler reported one of its hosts lost", ("mesh", "host_name", "reason")),
    "host_mesh.stopping": ("`stop()` / `shutdown()` began", ("mesh", "shutdown")),
    "host_mesh.stopped": ("its procs are gone (and, after `shutdown()`, its hosts released)", ("mesh", "shutdown")),
    "proc_mesh.spawned": ("`spawn_procs` asked for its procs", ("mesh", "host_mesh", "extent", "hosts")),
    "proc.ready": ("one proc runs (its bootstrap done)", ("mesh", "proc_id", "rank", "coords", "host_name", "os_pid")),
    "proc_mesh.ready": ("every proc of the mesh is ready", ("mesh",)),
    "proc_mesh.stopping": ("`stop()` began", ("mesh", "reason")),
    "proc.stopped": ("a proc ended when asked to", ("mesh", "proc_id", "rank", "host_name", "reason")),
    "proc.failed": ("a proc ended on its own, or was killed",
                    ("mesh", "proc_id", "rank", "host_name", "exit_code", "signal", "reason")),
    "proc_mesh.stopped": ("every proc of the mesh is gone", ("mesh",)),
    "actor_mesh.spawned": ("`ProcMesh.spawn` sent its actors",
                           ("mesh", "mesh_key", "class_name", "proc_mesh", "extent")),
    "actor_mesh.ready": ("every actor's `__init__` returned", ("mesh", "mesh_key")),
    "actor_mesh.stopping": ("`stop()` began", ("mesh", "mesh_key", "reason")),
    "actor_mesh.stopped": ("every actor stopped", ("mesh", "mesh_key")),
    "actor.failed": ("an actor died (recorded in its proc)",
                     ("mesh", "mesh_key", "actor", "actor_id", "rank", "coords", "class_name", "endpoint",
                      "category", "cause")),
    "supervision.event": ("a failure reached the owner of the mesh (recorded in the owner's process)",
                          ("mesh", "mesh_key", "ranks", "category", "owner", "root_cause", "chain")),
    "supervision.handled": ("the owner decided: `__supervise__` returned, or the client's `unhandled_fault_hook` ran",
                            ("mesh", "handled_by", "handled")),
    "endpoint.raised": ("an endpoint raised an exception (recorded in the actor's proc; at most 8 per endpoint and rank "
                        "per telemetry interval, `skipped` counts the others)",
                        ("mesh", "mesh_key", "endpoint", "rank", "error_type", "message", "traceback", "skipped")),
}

#: The fields of structured error log records (``logging`` ``extra``), for filtering.
LOG_FIELDS = ("category", "actor", "endpoint", "mesh", "rank", "proc", "host")

_EXIT = re.compile(r"exited with code (-?\d+)")
_SIGNAL = re.compile(r"killed by (SIG[A-Z0-9]+|signal \d+)")


def exit_status(reason: str) -> tuple[Optional[int], Optional[str]]:
    """``(exit_code, signal)`` read from a proc's end reason (``None`` when it says neither)."""
    m = _EXIT.search(reason)
    code = int(m.group(1)) if m else None
    s = _SIGNAL.search(reason)
    return code, (s.group(1) if s else None)


def log_extra(category: str, *, actor: Optional[str] = None, endpoint: Optional[str] = None,
              mesh: Optional[str] = None, rank: Optional[int] = None, proc: Optional[str] = None,
              host: Optional[str] = None) -> dict[str, Any]:
    """The ``extra=`` of an error log record about a failure (:data:`LOG_FIELDS`)."""
    from monarch_core._telemetry._core import state

    return {"category": category, "actor": actor, "endpoint": endpoint, "mesh": mesh, "rank": rank,
            "proc": proc or state.proc_id, "host": host or state.host}


def root_cause(events: list[dict]) -> dict[str, Any]:
    """The first failure of a supervision cascade, as event attributes."""
    if not events:
        return {}
    first = events[0]
    cause = str(first.get("cause", "")).strip()
    return {"actor": first.get("actor"), "mesh": first.get("mesh_name"), "coords": first.get("coords"),
            "proc": first.get("proc"), "category": first.get("category"),
            "cause": cause.splitlines()[-1] if cause else ""}


def markdown_table() -> str:
    """The lifecycle table of ``docs/observability.md`` (a test keeps them equal)."""
    rows = ["| event | when | attributes |", "|---|---|---|"]
    for name, (what, fields) in LIFECYCLE.items():
        rows.append(f"| `{name}` | {what} | {', '.join(f'`{f}`' for f in fields)} |")
    return "\n".join(rows) + "\n"
