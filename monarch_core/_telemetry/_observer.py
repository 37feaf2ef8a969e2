"""The runtime's observer with telemetry on: each hook of ``_proc._observer.Observer``, and who implements it.

The runtime's builders hand a :class:`Telemetry` to ``ProcRuntime(observer=...)``
(the client's in ``_launch._start``, a proc's in ``_launch._proc_main``); the
runtime and the mesh API call its hooks at the points they instrument.  The
hooks are the functions of :mod:`._instrument` (calls and endpoint runs) and
:mod:`._reporting` (lifecycle, reports to the root) themselves, not wrappers:
a hook costs what the function costs.  All state is the process's
(:data:`._core.state`, the stores of :mod:`._metrics`, :data:`._hub.hub`).
"""

from __future__ import annotations

from monarch_core._proc._observer import Observer
from monarch_core._telemetry import _core, _events, _instrument, _reporting, _spans


class Telemetry(Observer):
    """Records endpoint metrics, spans and lifecycle events, and reports them to the root."""

    current_span = _spans.current_span
    # calls, in the caller
    client_side = staticmethod(_instrument.client_side)
    spawn_trace = staticmethod(_instrument.spawn_trace)
    retire_when_stopped = staticmethod(_instrument.retire_when_stopped)
    # endpoint runs, in the actor's proc
    server_stat = staticmethod(_instrument.server_stat)
    server_span = staticmethod(_instrument.server_span)
    end_server_span = staticmethod(_instrument.end_server_span)
    init_span = staticmethod(_instrument.init_span)
    run_init = staticmethod(_instrument.run_init)
    retire_server = staticmethod(_instrument.retire_server)
    # lifecycle and failures
    lifecycle = staticmethod(_core.lifecycle)
    log_extra = staticmethod(_events.log_extra)
    actor_failed = staticmethod(_reporting.actor_failed)
    supervision_event = staticmethod(_reporting.supervision_event)
    supervision_handled = staticmethod(_reporting.supervision_handled)
    register_procs = staticmethod(_reporting.register_procs)
    proc_ready = staticmethod(_reporting.proc_ready)
    proc_ended = staticmethod(_reporting.proc_ended)
    actor_mesh_spawned = staticmethod(_reporting.actor_mesh_spawned)
    actor_mesh_stopping = staticmethod(_reporting.actor_mesh_stopping)
    after_procs_stopped = staticmethod(_reporting.after_procs_stopped)
    # what procs report to the root
    on_telemetry = staticmethod(_reporting.on_telemetry)
    on_flush = staticmethod(_reporting.on_flush)
    on_log_option = staticmethod(_reporting.on_log_option)
    log_option = staticmethod(_reporting.log_option)
    final_flush = staticmethod(_reporting.final_flush)
