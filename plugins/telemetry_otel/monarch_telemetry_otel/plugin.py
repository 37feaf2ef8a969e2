"""The plugin: a ``monarch_telemetry_sinks`` hook.

Loaded in every monarch process that loads plugins, it costs nothing until the
client's runtime starts and calls the hook: then, if the program has
configured OpenTelemetry's global providers with the SDK, it returns one
:class:`~monarch_telemetry_otel.OtelSink` for them; otherwise none (it never
imports OpenTelemetry in a program that has not).
"""

from __future__ import annotations

import sys
from typing import Any

from monarch_core.hookspecs import hookimpl


def configured_providers() -> tuple[Any, Any]:
    """The global tracer and meter providers when they are the SDK's (else None each)."""
    if "opentelemetry.trace" not in sys.modules and "opentelemetry.metrics" not in sys.modules:
        return None, None  # the program never touched OpenTelemetry: nothing can be configured
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    tp = trace.get_tracer_provider()
    mp = metrics.get_meter_provider()
    return (tp if isinstance(tp, TracerProvider) else None, mp if isinstance(mp, MeterProvider) else None)


@hookimpl
def monarch_telemetry_sinks() -> list[Any]:
    tp, mp = configured_providers()
    if tp is None and mp is None:
        return []
    from monarch_telemetry_otel._sink import OtelSink

    return [OtelSink(tracer_provider=tp, meter_provider=mp)]
