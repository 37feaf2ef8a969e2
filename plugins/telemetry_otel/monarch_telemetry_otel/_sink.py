"""``OtelSink``: monarch-core telemetry events into the OpenTelemetry SDK.

* spans -- each becomes an SDK ``ReadableSpan`` with monarch's own trace and
  span ids (so client, server and ``@traced`` spans of every proc link up),
  its proc as the ``Resource`` (``monarch.proc``, ``monarch.proc_name``,
  ``host.name``, ``process.pid`` added to the provider's), kind ``CLIENT`` /
  ``SERVER`` / ``INTERNAL``, status ``ERROR`` with the exception type when it
  raised; handed to the tracer provider's span processors (your exporters).
* endpoint metrics -- counters ``monarch.endpoint.calls``,
  ``monarch.endpoint.errors`` (attribute ``error.type``),
  ``monarch.endpoint.request.size`` and ``monarch.endpoint.reply.size``
  (bytes), and the histogram ``monarch.endpoint.duration`` (seconds; each
  sample at the middle of its monarch histogram bucket, within 6.25 %), with
  attributes ``monarch.side``, ``monarch.mesh``, ``monarch.endpoint``,
  ``monarch.rank``, ``monarch.adverb``, ``monarch.proc``, ``host.name``.
* lifecycle events -- a zero-length ``INTERNAL`` span each, named for the event
  (``proc.failed`` ...) with its attributes under ``monarch.``, and the counter
  ``monarch.lifecycle.events`` (attribute ``monarch.event``).

Nothing here runs per call: the sink gets batches from the client's telemetry
thread.  Exceptions are mapped to ``TypeError`` / ``ValueError`` at
construction; ``emit`` failures are logged by monarch and the sink is kept.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from monarch_core.hookspecs import TelemetryEvent, TelemetrySink

logger = logging.getLogger("monarch.telemetry.otel")

SCOPE = "monarch_core"
_IDENT = ("proc", "proc_name", "host", "pid", "thread")
_IDS = ("trace_id", "span_id", "parent_id", "span_kind", "error")


def _value(v: Any) -> Any:
    """An OpenTelemetry attribute value for ``v`` (None: leave the attribute out)."""
    if v is None or isinstance(v, (bool, str, int, float)):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return list(v)
    return json.dumps(v, default=str, sort_keys=True)


def _attrs(a: Mapping[str, Any], skip: Sequence[str] = ()) -> dict[str, Any]:
    out = {}
    for k, v in a.items():
        if k in skip:
            continue
        val = _value(v)
        if val is not None:
            out[f"monarch.{k}"] = val
    return out


def _bucket_mid_s(i: int) -> float:
    if i < 16:
        return i / 1e9
    b = (i >> 3) + 3
    lo = (8 + (i & 7)) << (b - 4)
    return (lo + (1 << (b - 5) if b > 4 else 0)) / 1e9


class OtelSink(TelemetrySink):
    """Export through ``tracer_provider`` (an ``opentelemetry.sdk.trace.TracerProvider``)
    and ``meter_provider`` (an ``opentelemetry.sdk.metrics.MeterProvider``);
    either may be None (that signal is not exported).  ``kinds`` follows: no
    tracer provider, no spans wanted (calls stay untraced)."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        if tracer_provider is None and meter_provider is None:
            raise ValueError("OtelSink needs a tracer_provider or a meter_provider (the SDK's, configured with exporters)")
        if tracer_provider is not None:
            from opentelemetry.sdk.trace import TracerProvider

            if not isinstance(tracer_provider, TracerProvider):
                raise TypeError(
                    f"OtelSink(tracer_provider=...) must be an opentelemetry.sdk.trace.TracerProvider, got "
                    f"{type(tracer_provider).__name__}; the API's default provider exports nothing: configure the SDK"
                )
        if meter_provider is not None:
            from opentelemetry.sdk.metrics import MeterProvider

            if not isinstance(meter_provider, MeterProvider):
                raise TypeError(
                    f"OtelSink(meter_provider=...) must be an opentelemetry.sdk.metrics.MeterProvider, got "
                    f"{type(meter_provider).__name__}"
                )
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        kinds = {"lifecycle"} if tracer_provider is not None or meter_provider is not None else set()
        if tracer_provider is not None:
            kinds.add("span")
        if meter_provider is not None:
            kinds.add("metric")
        self.kinds = frozenset(kinds)
        self._resources: dict[Any, Any] = {}
        self._last: dict[tuple, dict] = {}  # metric key -> the last cumulative totals
        self._instruments: Optional[dict[str, Any]] = None

    # ---------------------------------------------------------------- spans
    def _resource(self, a: Mapping[str, Any]) -> Any:
        proc = a.get("proc")
        r = self._resources.get(proc)
        if r is None:
            from opentelemetry.sdk.resources import Resource

            own: dict[str, str | int] = {"monarch.proc": str(proc), "monarch.proc_name": str(a.get("proc_name")),
                   "host.name": str(a.get("host")), "process.pid": int(a.get("pid") or 0)}
            r = self._resources[proc] = self.tracer_provider.resource.merge(Resource(own))
        return r

    def _span(self, e: TelemetryEvent) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

        a = e.attributes
        trace_id = int(a["trace_id"], 16)
        ctx = SpanContext(trace_id, int(a["span_id"], 16), is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        parent = None
        if a.get("parent_id"):
            parent = SpanContext(trace_id, int(a["parent_id"], 16), is_remote=True,
                                 trace_flags=TraceFlags(TraceFlags.SAMPLED))
        kind = {"client": SpanKind.CLIENT, "server": SpanKind.SERVER}.get(str(a.get("span_kind")), SpanKind.INTERNAL)
        attrs = _attrs(a, _IDENT + _IDS)
        if a.get("thread"):
            attrs["thread.name"] = str(a["thread"])
        status = Status(StatusCode.UNSET)
        if a.get("error"):
            attrs["error.type"] = str(a["error"])
            status = Status(StatusCode.ERROR, str(a["error"]))
        span = ReadableSpan(
            name=e.name, context=ctx, parent=parent, resource=self._resource(a), attributes=attrs, kind=kind,
            status=status, start_time=e.start_ns, end_time=e.start_ns + e.duration_ns,
            instrumentation_scope=InstrumentationScope(SCOPE),
        )
        self.tracer_provider._active_span_processor.on_end(span)

    def _lifecycle_span(self, e: TelemetryEvent) -> None:
        import random

        a = dict(e.attributes)
        a.update(trace_id=f"{random.getrandbits(128) or 1:032x}", span_id=f"{random.getrandbits(64) or 1:016x}",
                 parent_id=None, span_kind="internal")
        self._span(TelemetryEvent("span", e.name, e.start_ns, 0, a))

    # ---------------------------------------------------------------- metrics
    def _meters(self) -> dict[str, Any]:
        if self._instruments is None:
            m = self.meter_provider.get_meter(SCOPE)
            self._instruments = {
                "calls": m.create_counter("monarch.endpoint.calls", unit="{call}",
                                          description="endpoint calls (client: adverb calls; server: invocations)"),
                "errors": m.create_counter("monarch.endpoint.errors", unit="{error}",
                                           description="endpoint calls that failed, by error.type"),
                "req": m.create_counter("monarch.endpoint.request.size", unit="By",
                                        description="pickled arguments, once per actor reached"),
                "rep": m.create_counter("monarch.endpoint.reply.size", unit="By", description="pickled results"),
                "dur": m.create_histogram("monarch.endpoint.duration", unit="s",
                                          description="client: send to reply; server: the endpoint's run"),
                "life": m.create_counter("monarch.lifecycle.events", unit="{event}",
                                         description="lifecycle and supervision events"),
            }
        return self._instruments

    def _metric(self, e: TelemetryEvent) -> None:
        a = e.attributes
        key = (a.get("proc"), a.get("side"), a.get("mesh_key"), a.get("endpoint"), a.get("rank"), a.get("adverb"))
        last = self._last.get(key) or {}
        self._last[key] = dict(a)
        ins = self._meters()
        attrs: dict[str, str | int] = {"monarch.side": str(a.get("side")), "monarch.mesh": str(a.get("mesh")),
                 "monarch.endpoint": str(a.get("endpoint")), "monarch.adverb": str(a.get("adverb") or ""),
                 "monarch.proc": str(a.get("proc")), "host.name": str(a.get("host"))}
        if a.get("rank") is not None:
            attrs["monarch.rank"] = int(a["rank"])
        for name, field in (("calls", "calls"), ("req", "request_bytes"), ("rep", "reply_bytes")):
            d = int(a.get(field) or 0) - int(last.get(field) or 0)
            if d > 0:
                ins[name].add(d, attrs)
        old_errors = last.get("errors") or {}
        for t, n in (a.get("errors") or {}).items():
            d = int(n) - int(old_errors.get(t, 0))
            if d > 0:
                ins["errors"].add(d, {**attrs, "error.type": str(t)})
        old = last.get("latency_buckets") or {}
        for i, c in (a.get("latency_buckets") or {}).items():
            d = int(c) - int(old.get(i, 0))
            if d > 0:
                v = _bucket_mid_s(int(i))
                for _ in range(d):
                    ins["dur"].record(v, attrs)

    # ---------------------------------------------------------------- the sink
    def emit(self, events: Sequence[TelemetryEvent]) -> None:
        for e in events:
            if e.kind == "span" and self.tracer_provider is not None:
                self._span(e)
            elif e.kind == "metric" and self.meter_provider is not None:
                self._metric(e)
            elif e.kind == "lifecycle":
                if self.tracer_provider is not None:
                    self._lifecycle_span(e)
                if self.meter_provider is not None:
                    self._meters()["life"].add(1, {"monarch.event": e.name})

    def close(self) -> None:
        """Flush the providers (they stay the program's: not shut down)."""
        for p in (self.tracer_provider, self.meter_provider):
            if p is not None:
                try:
                    p.force_flush()
                except Exception:  # noqa: BLE001 - an exporter that cannot flush at exit
                    logger.exception("flushing %r failed", p)

    def __repr__(self) -> str:
        return f"OtelSink(kinds={sorted(self.kinds)})"
