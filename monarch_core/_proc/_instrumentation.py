"""The runtime's instrumentation: the per-call points telemetry records at, a declared interface.

A :class:`~._state.ProcRuntime` holds one :class:`Instrumentation`
(``rt.instrumentation``), handed to it where it is built
(``_launch._start.build_runtime``): telemetry's
(``monarch_core._telemetry._runtime.Telemetry``) in a client and in a proc,
:class:`NoInstrumentation` otherwise (a worker loop).  The runtime and the
mesh API call it directly, on the per-call path -- a call issued and its
reply collectors, an endpoint run and its span, an actor's ``__init__`` --
and for telemetry's control messages and the ``extra=`` of error log
records; they import nothing of telemetry.

It is a component's interface, not a place to plug in: what the runtime
*tells* (a proc ready, a mesh spawned or stopping, an actor failed, a
supervision event) are the runtime's events (:mod:`._runtime_events`, on
``rt.events``), which telemetry subscribes to like any listener.  What is
here either runs per call (an event bus has no place on that path) or
answers its caller: a value, an answer sent to a reply port, an error
raised.

:class:`NoInstrumentation` records nothing: its per-call methods answer "not
instrumented" (``False`` / ``None``) once, and the endpoint or actor keeps
that answer, so the call path then only tests a kept value.  Methods run on
whichever thread reaches the point (an actor's, a caller's, the kernel's
loop) and must not block, except :meth:`Instrumentation.log_option`, which
waits for the procs' answers.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

__all__ = ["Instrumentation", "NoInstrumentation"]


class Instrumentation(Protocol):
    """What the runtime calls per call and per telemetry control message
    (telemetry's ``Telemetry`` implements it; :class:`NoInstrumentation` is
    the null one)."""

    #: The context variable holding the span the running code is part of
    #: (the invoker sets it around an endpoint run with a span from
    #: :meth:`server_span`); None where nothing is ever traced.
    current_span: Any

    # ------------------------------------------------------------ calls, in the caller
    def client_side(self, ep: Any) -> Any:
        """The instrumentation of endpoint ``ep`` of an actor mesh in this
        process (its ``one``/``gather``/``stream``/``cast`` make the reply
        collectors of a call), or False: not instrumented (kept by the endpoint)."""
        ...

    def spawn_trace(self, mesh: str) -> tuple[Optional[bytes], Any]:
        """The trace context a spawn of actor mesh ``mesh`` carries and the
        callback to run once every ``__init__`` returned; ``(None, None)``:
        the spawn is not traced."""
        ...

    # ------------------------------------------------------------ endpoint runs, in the actor's proc
    def server_stat(self, host: Any, method: str, prop: Any) -> Any:
        """The stat that endpoint ``method`` of actor ``host`` records its runs
        into (``add``, ``record``, ``fold``), or False: not instrumented (kept
        by the actor's invoker)."""
        ...

    def server_span(self, h: tuple) -> Optional[tuple]:
        """The span of one run of an instrumented endpoint (its header ``h``), or None."""
        ...

    def end_server_span(self, sp: tuple, host: Any, method: str, t0: int, dt: int, error: Optional[str]) -> None:
        """The run of ``method`` on ``host`` with span ``sp`` took ``dt`` ns from
        ``t0`` (``error``: the type name of what it raised, or None)."""
        ...

    def init_span(self, ctx: Optional[bytes]) -> Optional[tuple]:
        """The span of an actor's ``__init__`` under the spawn's trace context ``ctx``, or None."""
        ...

    def run_init(self, host: Any, sp: tuple, init: Any, args: tuple, kwargs: dict) -> None:
        """Run ``init(*args, **kwargs)`` inside span ``sp`` (from :meth:`init_span`);
        what it raises propagates."""
        ...

    # ------------------------------------------------------------ error log records
    def log_extra(self, category: str, *, actor: Optional[str] = None, endpoint: Optional[str] = None,
                  mesh: Optional[str] = None, rank: Optional[int] = None, proc: Optional[str] = None,
                  host: Optional[str] = None) -> dict:
        """The ``extra=`` of an error log record about a failure of ``category``
        (``monarch_core.telemetry.LOG_FIELDS``); the proc and host default to this process's."""
        ...

    # ------------------------------------------------------------ telemetry's control messages
    def on_telemetry(self, payload: Any, sender: str) -> None:
        """A ``Telemetry`` control message (a proc's batch, from ``sender``) reached this process."""
        ...

    def on_flush(self, reply: tuple) -> None:
        """A ``TelemetryFlush`` asks for what this proc holds; answer ``reply`` (a port reference)."""
        ...

    def on_log_option(self, reply: tuple, stream: bool, level: int) -> None:
        """A ``LogOption`` reached this proc: apply it, and answer ``reply``."""
        ...

    def log_option(self, mesh: str, slots: list, stream: bool, level: int, window: Optional[float],
                   timeout: float) -> None:
        """``ProcMesh.logging_option`` of proc mesh ``mesh``: apply it to the
        procs of ``slots`` and wait (at most ``timeout`` s) until each did;
        ``RuntimeError`` naming those that did not."""
        ...


class NoInstrumentation:
    """The null instrumentation: nothing is recorded, every call is "not instrumented"."""

    current_span: Any = None

    def client_side(self, ep: Any) -> Any:
        return False

    def spawn_trace(self, mesh: str) -> tuple[Optional[bytes], Any]:
        return None, None

    def server_stat(self, host: Any, method: str, prop: Any) -> Any:
        return False

    def server_span(self, h: tuple) -> Optional[tuple]:
        return None

    def end_server_span(self, sp: tuple, host: Any, method: str, t0: int, dt: int, error: Optional[str]) -> None:
        return None

    def init_span(self, ctx: Optional[bytes]) -> Optional[tuple]:
        return None

    def run_init(self, host: Any, sp: tuple, init: Any, args: tuple, kwargs: dict) -> None:
        init(*args, **kwargs)

    def log_extra(self, category: str, *, actor: Optional[str] = None, endpoint: Optional[str] = None,
                  mesh: Optional[str] = None, rank: Optional[int] = None, proc: Optional[str] = None,
                  host: Optional[str] = None) -> dict:
        return {}

    def on_telemetry(self, payload: Any, sender: str) -> None:
        return None

    def on_flush(self, reply: tuple) -> None:
        return None

    def on_log_option(self, reply: tuple, stream: bool, level: int) -> None:
        return None

    def log_option(self, mesh: str, slots: list, stream: bool, level: int, window: Optional[float],
                   timeout: float) -> None:
        return None
