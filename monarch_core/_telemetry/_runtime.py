"""What telemetry gives the runtime: its instrumentation, and its listeners of the runtime's events.

The runtime's builders hand a :class:`Telemetry` to ``build_runtime(instrumentation=...)``
(the client's in ``_launch._start``, a proc's in ``_launch._proc_main``), and
call :func:`subscribe` on the runtime's bus (``rt.events``) right after.

* :class:`Telemetry` implements the runtime's per-call interface
  (``_proc._instrumentation.Instrumentation``): its methods are the
  functions of :mod:`._instrument` (calls and endpoint runs) and
  :mod:`._reporting` (control messages, ``logging_option``) themselves, not
  wrappers: a call costs what the function costs.
* :func:`subscribe` makes telemetry a listener of the runtime's events
  (``_proc._runtime_events``): each becomes its lifecycle record
  (``monarch_core.telemetry.LIFECYCLE``) or retires what stopped.

All state is the process's (:data:`._core.state`, the stores of
:mod:`._metrics`, :data:`._hub.hub`).
"""

from __future__ import annotations

import functools

from monarch_core._kernel._events import EventBus
from monarch_core._telemetry import _core, _events, _instrument, _reporting, _spans

__all__ = ["Telemetry", "subscribe"]


class Telemetry:
    """Records endpoint metrics and spans, and answers telemetry's control
    messages (the runtime's ``Instrumentation``)."""

    current_span = _spans.current_span
    # calls, in the caller
    client_side = staticmethod(_instrument.client_side)
    spawn_trace = staticmethod(_instrument.spawn_trace)
    # endpoint runs, in the actor's proc
    server_stat = staticmethod(_instrument.server_stat)
    server_span = staticmethod(_instrument.server_span)
    end_server_span = staticmethod(_instrument.end_server_span)
    init_span = staticmethod(_instrument.init_span)
    run_init = staticmethod(_instrument.run_init)
    # error log records
    log_extra = staticmethod(_events.log_extra)
    # telemetry's control messages
    on_telemetry = staticmethod(_reporting.on_telemetry)
    on_flush = staticmethod(_reporting.on_flush)
    on_log_option = staticmethod(_reporting.on_log_option)
    log_option = staticmethod(_reporting.log_option)


def subscribe(events: EventBus) -> None:
    """Telemetry listens to the runtime's bus ``events`` (``ProcRuntime.events``):
    lifecycle records of host meshes, proc meshes, procs, actor meshes,
    failures and supervision; an actor mesh's client-side figures and an
    actor's server-side ones retired when they stop; a stopping proc's last
    batch and output sent.  Called once, where the runtime is assembled."""
    lc = _core.lifecycle
    for event, listener in (
        ("host_mesh_spawned", functools.partial(lc, "host_mesh.spawned")),
        ("host_lost", functools.partial(lc, "host_mesh.lost_host")),
        ("host_mesh_stopping", functools.partial(lc, "host_mesh.stopping")),
        ("host_mesh_stopped", functools.partial(lc, "host_mesh.stopped")),
        ("proc_mesh_spawned", _reporting.register_procs),
        ("proc_ready", _reporting.proc_ready),
        ("proc_ended", _reporting.proc_ended),
        ("proc_mesh_stopping", functools.partial(lc, "proc_mesh.stopping")),
        ("proc_mesh_stopped", functools.partial(lc, "proc_mesh.stopped")),
        ("proc_ending", _reporting.final_flush),
        ("actor_mesh_spawned", _reporting.actor_mesh_spawned),
        ("actor_mesh_stopping", _reporting.actor_mesh_stopping),
        ("actor_mesh_released", _instrument.retire_when_stopped),
        ("actor_failed", _reporting.actor_failed),
        ("actor_finished", _instrument.retire_server),
        ("supervision_event", _reporting.supervision_event),
        ("supervision_handled", _reporting.supervision_handled),
    ):
        events.subscribe(event, listener)
