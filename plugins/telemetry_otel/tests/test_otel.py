"""The OpenTelemetry exporter, with the SDK's in-memory exporter and metric
reader: real procs, the plugin found through its entry point, spans linked
across processes with monarch's ids, exact endpoint counters, lifecycle events."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK (pip install opentelemetry-sdk) is not installed")

PLUGIN = Path(__file__).resolve().parents[1]
REPO = PLUGIN.parents[1]

CLIENT = r"""
import json, sys
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

spans_out = InMemorySpanExporter()
tp = TracerProvider(resource=Resource.create({"service.name": "otel-test"}))
tp.add_span_processor(SimpleSpanProcessor(spans_out))
reader = InMemoryMetricReader()
mp = MeterProvider(metric_readers=[reader])
if sys.argv[1] == "plugin":       # the user's own configuration, before the first mesh: the plugin finds it
    trace.set_tracer_provider(tp)
    metrics.set_meter_provider(mp)

from monarch_core import telemetry
from monarch_core.actor import Actor, ActorError, endpoint, this_host, traced

if sys.argv[1] == "explicit":
    from monarch_telemetry_otel import OtelSink
    telemetry.add_sink(OtelSink(tracer_provider=tp, meter_provider=mp))

@traced
def inner(x):
    return x * 10

class A(Actor):
    @endpoint
    def f(self, x):
        return inner(x)
    @endpoint
    def bad(self):
        raise LookupError("missing")

pm = this_host().spawn_procs({"gpus": 2})
m = pm.spawn("otel", A)
one = m.slice(gpus=1)
for i in range(3):
    assert one.f.call_one(i).get() == 10 * i
for _ in range(2):
    try:
        one.bad.call_one().get()
    except ActorError:
        pass
telemetry.flush()
pm.stop().get()
telemetry.flush()

spans = [{"name": s.name, "kind": s.kind.name, "trace": f"{s.context.trace_id:032x}", "id": f"{s.context.span_id:016x}",
          "parent": f"{s.parent.span_id:016x}" if s.parent else None, "status": s.status.status_code.name,
          "proc_name": s.resource.attributes.get("monarch.proc_name"), "service": s.resource.attributes.get("service.name"),
          "attrs": {k: v for k, v in s.attributes.items()}} for s in spans_out.get_finished_spans()]
sums = {}
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        for metric in sm.metrics:
            for p in metric.data.data_points:
                a = dict(p.attributes)
                if metric.name == "monarch.lifecycle.events":
                    key = (metric.name, a["monarch.event"])
                else:
                    key = (metric.name, a.get("monarch.side"), a.get("monarch.endpoint"), a.get("error.type"))
                sums["|".join(str(k) for k in key)] = getattr(p, "value", None) if hasattr(p, "value") else p.count
print(json.dumps({"spans": spans, "sums": sums}))
"""


def _env(tmp_path: Path) -> dict[str, str]:
    sys.path.insert(0, str(REPO / "tests"))
    from _helpers.clients import child_env

    path = [PLUGIN]
    try:
        metadata.version("monarch-telemetry-otel")
    except metadata.PackageNotFoundError:  # not installed: a dist-info of ours points its entry point at the checkout
        dist = tmp_path / "monarch_telemetry_otel-0.1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: monarch-telemetry-otel\nVersion: 0.1.0\n")
        (dist / "entry_points.txt").write_text("[monarch]\ntelemetry_otel = monarch_telemetry_otel.plugin\n")
        path.append(tmp_path)
    return child_env(path=path)


def run(mode: str, tmp_path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CLIENT, mode], capture_output=True, text=True, timeout=120,
                         env=_env(tmp_path), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["plugin", "explicit"])
def test_spans_metrics_and_lifecycle_reach_the_sdk(mode: str, tmp_path: Path) -> None:
    got = run(mode, tmp_path)
    spans = got["spans"]
    by_id = {s["id"]: s for s in spans}
    calls = [s for s in spans if s["name"] == "otel.f" and s["kind"] == "CLIENT"]
    served = [s for s in spans if s["name"] == "otel.f" and s["kind"] == "SERVER"]
    inner = [s for s in spans if s["name"] == "inner"]
    assert len(calls) == len(served) == len(inner) == 3
    for s in served:
        client = by_id[s["parent"]]
        assert client["kind"] == "CLIENT" and client["trace"] == s["trace"]
        assert s["proc_name"] == "procs0{'gpus': 1/2}" and client["proc_name"] == "client"
        assert s["attrs"]["monarch.endpoint"] == "f" and s["attrs"]["monarch.rank"] == 1
    for s in inner:
        assert by_id[s["parent"]]["kind"] == "SERVER" and s["kind"] == "INTERNAL"
    bad = {s["kind"]: s for s in spans if s["name"] == "otel.bad"}
    assert bad["SERVER"]["status"] == "ERROR" and bad["SERVER"]["attrs"]["error.type"] == "LookupError"
    assert bad["CLIENT"]["attrs"]["error.type"] == "ActorError"
    assert {s["service"] for s in spans} == {"otel-test"}, "the user's resource is kept"
    assert any(s["name"] == "proc.ready" for s in spans), "lifecycle events are spans too"
    sums = got["sums"]
    assert sums["monarch.endpoint.calls|server|f|None"] == 3
    assert sums["monarch.endpoint.calls|client|f|None"] == 3
    assert sums["monarch.endpoint.errors|server|bad|LookupError"] == 2
    assert sums["monarch.endpoint.errors|client|bad|ActorError"] == 2
    assert sums["monarch.endpoint.duration|server|f|None"] == 3  # histogram: its count
    assert sums["monarch.lifecycle.events|proc_mesh.stopped"] == 1


def test_the_plugin_stays_out_of_a_program_that_does_not_configure_opentelemetry(tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "from monarch_core.actor import this_host\n"
        "from monarch_core._telemetry._hub import hub\n"
        "from monarch_core._plugins import registry\n"
        "pm = this_host().spawn_procs()\n"
        "pm.initialized.get()\n"
        "loaded = registry().pm.get_plugin('telemetry_otel') is not None\n"
        "print(json.dumps([loaded] + [repr(s) for s, _k in hub.entries] + [m for m in sys.modules if m.startswith('opentelemetry')]))\n"
        "pm.stop().get()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_env(tmp_path), cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True], "loaded, no sink, no OpenTelemetry import"


def test_bad_providers_are_refused_with_the_fix() -> None:
    sys.path.insert(0, str(PLUGIN))
    from opentelemetry.trace import NoOpTracerProvider

    from monarch_telemetry_otel import OtelSink

    with pytest.raises(ValueError, match="tracer_provider or a meter_provider"):
        OtelSink()
    with pytest.raises(TypeError, match="configure the SDK"):
        OtelSink(tracer_provider=NoOpTracerProvider())
