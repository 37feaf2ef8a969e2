"""monarch-telemetry-otel: monarch-core's telemetry through the OpenTelemetry SDK.

Install it, configure OpenTelemetry as usual (a ``TracerProvider`` with your
span processors and exporters, a ``MeterProvider`` with your metric readers,
set as the global providers) before the program's first mesh, and the spans,
endpoint metrics and lifecycle events of every proc are exported with it:
OTLP, Prometheus, the console, whatever the SDK is configured with.  Or
install a sink explicitly::

    from monarch_core import telemetry
    from monarch_telemetry_otel import OtelSink
    telemetry.add_sink(OtelSink(tracer_provider=tp, meter_provider=mp))

See ``README.md`` for what is exported under which names.
"""

from monarch_telemetry_otel._sink import OtelSink

__all__ = ["OtelSink"]
