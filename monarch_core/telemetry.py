"""Observability of a monarch-core program: endpoint metrics, spans, lifecycle events.

What is recorded (``docs/observability.md`` has the walk-through):

* **Endpoint metrics**, on by default, for every endpoint of every actor
  mesh, on both sides: calls, errors by exception type, a latency histogram
  (p50/p99) and request/reply bytes, per mesh, endpoint and rank.  Each process
  aggregates its own and ships them to the client in batches (never a message
  per call); :func:`endpoint_metrics` reads them, :func:`metrics_table`
  prints them.  ``@endpoint(instrument=False)`` turns them off for one
  endpoint, ``MONARCH_TELEMETRY=0`` turns all instrumentation off.
* **Spans**, when a sink wants them (:func:`record_trace`,
  ``MONARCH_TRACE_FILE``, a plugin sink): a client span per call, a server
  span per endpoint invocation (its child, across processes: the trace context
  travels in the message header) and :func:`traced` spans nested inside.
* **Lifecycle and supervision events** (:data:`LIFECYCLE` lists them with
  their attributes).

Everything reaches the client's sinks: :class:`JsonLinesSink`,
:class:`ChromeTraceSink` (Perfetto UI, ``chrome://tracing``), the
``monarch_telemetry_sinks`` plugins (``monarch-telemetry-otel`` exports to
OpenTelemetry), and any object given to :func:`add_sink`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Optional

from monarch_core._telemetry import _metrics
from monarch_core._telemetry._events import LIFECYCLE, LOG_FIELDS
from monarch_core._telemetry._metrics import EndpointMetrics, Latency
from monarch_core._telemetry._spans import traced

if TYPE_CHECKING:
    from monarch_core._telemetry._sinks import ChromeTraceSink, JsonLinesSink

__all__ = [
    "LIFECYCLE",
    "LOG_FIELDS",
    "ChromeTraceSink",
    "EndpointMetrics",
    "JsonLinesSink",
    "Latency",
    "add_sink",
    "endpoint_metrics",
    "flush",
    "metrics_table",
    "record_events",
    "record_trace",
    "remove_sink",
    "reset_metrics",
    "traced",
]

_SIDES = ("client", "server")


def flush(timeout: float = 5.0) -> None:
    """Ask every proc that reports to this client for what it holds now, wait
    for the answers (at most ``timeout`` s in all), and hand everything to the
    sinks.  Procs also report on their own, once per
    ``MONARCH_TELEMETRY_INTERVAL`` (1 s) and when they stop."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"flush(timeout=...) must be a number of seconds >= 0, got {timeout!r}")
    from monarch_core._telemetry import _reporting

    _reporting.flush(float(timeout))


def endpoint_metrics(
    mesh: Optional[str] = None,
    endpoint: Optional[str] = None,
    side: Optional[str] = None,
    *,
    per_rank: bool = True,
    refresh: bool = True,
    timeout: float = 5.0,
) -> list[EndpointMetrics]:
    """The endpoint metrics known to this client: its own (client side, and
    server side of actors it hosts) and what its procs reported.

    ``mesh`` / ``endpoint`` / ``side`` (``"client"`` or ``"server"``) filter;
    ``per_rank=False`` sums the ranks (and procs) of each (side, mesh,
    endpoint) into one row.  ``refresh`` first asks the procs for their latest
    figures (:func:`flush`, within ``timeout`` s).  Totals count from each
    process's start (or :func:`reset_metrics`)."""
    if side is not None and side not in _SIDES:
        raise ValueError(f"endpoint_metrics(side={side!r}): side is 'client' or 'server' (or None for both)")
    if refresh:
        flush(timeout)
    rows = [r for r in _metrics.all_metrics()
            if (mesh is None or r.mesh == mesh) and (endpoint is None or r.endpoint == endpoint)
            and (side is None or r.side == side)]
    if not per_rank:
        rows = _metrics.combine(rows)
    rows.sort(key=lambda r: (r.side, r.mesh, r.endpoint, -1 if r.rank is None else r.rank, r.adverb, r.proc))
    return rows


def metrics_table(top: int = 20, *, per_rank: bool = False, refresh: bool = True, timeout: float = 5.0) -> str:
    """A text table of the endpoints with the most total time: calls, errors,
    total / p50 / p99 / mean latency in ms, request and reply bytes."""
    from monarch_core._telemetry import _summary

    return _summary.table(endpoint_metrics(refresh=refresh, timeout=timeout), top, per_rank)


def reset_metrics() -> None:
    """Forget the endpoint metrics this client holds (its own and the procs'
    reports so far; a proc's next report brings its totals since it started)."""
    _metrics.forget()


def add_sink(sink: Any) -> None:
    """Install ``sink`` in this client: an object with ``emit(events)`` (a
    batch of :class:`~monarch_core.hookspecs.TelemetryEvent`) and optionally
    ``close()`` and ``kinds`` (the event kinds it wants: ``"span"``,
    ``"metric"``, ``"lifecycle"``; default all).  A sink that wants spans
    turns on tracing of every call.  See ``monarch_core.hookspecs.TelemetrySink``."""
    from monarch_core._telemetry._hub import hub

    hub.add(sink)


def remove_sink(sink: Any, *, close: bool = True) -> bool:
    """Hand ``sink`` what is recorded so far, uninstall it and ``close()`` it
    (unless ``close=False``); False if it was not installed."""
    from monarch_core._telemetry._hub import hub

    return hub.remove(sink, close)


@contextlib.contextmanager
def record_trace(path: str, *, timeout: float = 5.0) -> Iterator[ChromeTraceSink]:
    """Record a Chrome trace-event file of what runs inside the ``with`` block::

        with record_trace("run.json"):
            mesh.step.call().get()

    Every call in the block is traced (client and server spans, ``@traced``
    spans, lifecycle events).  At the end the procs are asked for what they
    hold (:func:`flush`) and the file is completed; open it in
    https://ui.perfetto.dev or ``chrome://tracing``, or summarize it with
    ``monarch summary run.json``."""
    from monarch_core._telemetry._sinks import ChromeTraceSink

    with _recording(ChromeTraceSink(path), timeout) as sink:
        yield sink


@contextlib.contextmanager
def record_events(path: str, *, kinds: Optional[list[str]] = None, timeout: float = 5.0) -> Iterator[JsonLinesSink]:
    """Like :func:`record_trace`, into a JSON-lines file (:class:`JsonLinesSink`):
    spans, endpoint metrics and lifecycle events (or only ``kinds``)."""
    from monarch_core._telemetry._sinks import JsonLinesSink

    with _recording(JsonLinesSink(path, kinds), timeout) as sink:
        yield sink


@contextlib.contextmanager
def _recording(sink: Any, timeout: float) -> Iterator[Any]:
    """``sink`` added for the block; at its end, what the procs hold is
    flushed (within ``timeout`` s) and the sink removed."""
    add_sink(sink)
    try:
        yield sink
    finally:
        try:
            flush(timeout)
        finally:
            remove_sink(sink)


def __getattr__(name: str) -> Any:
    # The sink classes subclass hookspecs.TelemetrySink (pluggy): imported on first use.
    if name in ("JsonLinesSink", "ChromeTraceSink"):
        from monarch_core._telemetry import _sinks

        return getattr(_sinks, name)
    raise AttributeError(f"module 'monarch_core.telemetry' has no attribute {name!r}")
