"""What the proc runtime tells whoever observes it: the points it instruments.

A :class:`~._state.ProcRuntime` holds one observer (``rt.observer``), handed
to it where the runtime is built; the runtime and the mesh API call it at each
point they instrument -- a call issued, its reply, an endpoint run, an actor's
``__init__``, a failure, a proc's birth and end, a control message for it --
and never reach into telemetry otherwise.  :class:`Observer` is the null
observer (the default: every hook does nothing, costs one call, and per-call
hooks answer "not instrumented" once, so the call path then skips them);
``monarch_core._telemetry._observer.Telemetry`` is the one that records.

Hooks that return something say so; the others return None.  They run on
whichever thread reaches the point (an actor's, a caller's, the kernel's loop)
and must not block.
"""

from __future__ import annotations

from typing import Any, Optional


class Observer:
    """The null observer: nothing is recorded."""

    #: The context variable holding the span the running code is part of
    #: (set around an endpoint run with a span from :meth:`server_span`).
    current_span: Any = None

    # ------------------------------------------------------------ calls, in the caller
    def client_side(self, ep: Any) -> Any:
        """The instrumentation of endpoint ``ep`` of an actor mesh in this
        process (its ``one``/``gather``/``stream``/``cast`` make the reply
        collectors of a call), or False: not instrumented (kept by the endpoint)."""
        return False

    def spawn_trace(self, mesh: str) -> tuple[Optional[bytes], Any]:
        """The trace context a spawn of actor mesh ``mesh`` carries and the
        callback to run once every ``__init__`` returned (``(None, None)``)."""
        return None, None

    def retire_when_stopped(self, cell: Any, mesh_key: str, class_name: str) -> None:
        """The caller's figures of actor mesh ``mesh_key`` end when ``cell`` (its stop) resolves."""

    # ------------------------------------------------------------ endpoint runs, in the actor's proc
    def server_stat(self, host: Any, method: str, prop: Any) -> Any:
        """The stat that endpoint ``method`` of actor ``host`` records its runs
        into (``add``, ``record``, ``fold``), or False (kept by the host)."""
        return False

    def server_span(self, h: tuple) -> Optional[tuple]:
        """The span of one run of an instrumented endpoint (its header ``h``), or None."""

    def end_server_span(self, sp: tuple, host: Any, method: str, t0: int, dt: int, error: Optional[str]) -> None:
        """The run of ``method`` on ``host`` with span ``sp`` took ``dt`` ns from ``t0``."""

    def init_span(self, ctx: Optional[bytes]) -> Optional[tuple]:
        """The span of an actor's ``__init__`` under the spawn's trace context ``ctx``, or None."""

    def run_init(self, host: Any, sp: tuple, init: Any, args: tuple, kwargs: dict) -> None:
        """Run ``init(*args, **kwargs)`` inside span ``sp`` (from :meth:`init_span`)."""

    def retire_server(self, host: Any) -> None:
        """Actor ``host`` stopped: its endpoints' figures leave this process."""

    # ------------------------------------------------------------ lifecycle and failures
    def lifecycle(self, name: str, **attributes: Any) -> None:
        """Lifecycle event ``name`` (``monarch_core.telemetry.LIFECYCLE``) happened."""

    def log_extra(self, category: str, *, actor: Optional[str] = None, endpoint: Optional[str] = None,
                  mesh: Optional[str] = None, rank: Optional[int] = None, proc: Optional[str] = None,
                  host: Optional[str] = None) -> dict:
        """The ``extra=`` of an error log record about a failure of ``category``
        (``monarch_core.telemetry.LOG_FIELDS``); the proc and host default to this process's."""
        return {}

    def actor_failed(self, host: Any, cause: str, category: str) -> None:
        """An actor of this proc died."""

    def supervision_event(self, failure: Any, report: dict, owner_host: Any, rt: Any) -> None:
        """A failure reached the owner of its mesh, here."""

    def supervision_handled(self, mesh: str, handled_by: str, handled: bool) -> None:
        """The owner of ``mesh`` decided about its failure."""

    def register_procs(self, mesh: str, slots: list, extent: Any, host_mesh: str) -> None:
        """This process spawned proc mesh ``mesh`` (its ``ProcSlot`` s)."""

    def proc_ready(self, proc_id: str, pid: Any, last: bool) -> None:
        """A proc this process spawned is ready (``last``: its mesh's last one)."""

    def proc_ended(self, proc_id: str, reason: str, stopped: bool) -> None:
        """A proc this process knows ended."""

    def actor_mesh_spawned(self, mesh: Any, proc_mesh: str, init: Any) -> None:
        """``mesh`` was spawned on ``proc_mesh``; ``init`` collects its ``__init__`` answers."""

    def actor_mesh_stopping(self, mesh: Any, reason: str, cell: Any) -> Any:
        """``mesh`` is being stopped, done when ``cell`` resolves; returns ``cell``."""
        return cell

    async def after_procs_stopped(self, kernel: Any, mesh: str) -> None:
        """The procs of proc mesh ``mesh`` are gone (on the kernel's loop)."""

    # ------------------------------------------------------------ what procs report to the root
    def on_telemetry(self, payload: Any, sender: str) -> None:
        """A ``Telemetry`` control message (a proc's batch) reached this process."""

    def on_flush(self, reply: tuple) -> None:
        """A ``TelemetryFlush`` asks for what this proc holds; answer ``reply``."""

    def on_log_option(self, reply: tuple, stream: bool, level: int) -> None:
        """A ``LogOption`` reached this proc; answer ``reply``."""

    def log_option(self, mesh: str, slots: list, stream: bool, level: int, window: Optional[float],
                   timeout: float) -> None:
        """``ProcMesh.logging_option`` of proc mesh ``mesh``: apply it to the procs of ``slots``."""

    def final_flush(self) -> None:
        """This proc stops: what it holds goes out now."""
