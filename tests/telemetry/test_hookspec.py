"""The telemetry hookspec tells the truth: its worked example, installed as a
real plugin (an entry point in a distribution on the path), receives every
documented event kind in the client -- spans, endpoint metrics, lifecycle
events -- from the procs as well as from the client, with the documented
attributes; and the sinks that ship implement the contract."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import monarch_core.hookspecs as hs
from monarch_core import telemetry


def example_code() -> str:
    doc = hs.monarch_telemetry_sinks.__doc__ or ""
    m = re.search(r"Complete example.*?::\n\n(.*?)\n\n    with ", doc, re.S)
    assert m, "the monarch_telemetry_sinks docstring has no complete example"
    return textwrap.dedent(m.group(1))


def install_plugin(root: Path) -> None:
    pkg = root / "span_lines"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text(example_code())
    dist = root / "span_lines-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: span-lines\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[monarch]\nspan_lines = span_lines.plugin\n")


CLIENT = """
import json, os
from monarch_core.actor import Actor, endpoint, this_host, traced
from monarch_core import telemetry
from monarch_core._telemetry._hub import hub

@traced
def inner():
    return 7

class A(Actor):
    @endpoint
    def f(self):
        return inner()

pm = this_host().spawn_procs({"gpus": 2})
m = pm.spawn("hooked", A)
assert m.f.call().get().values() == [7, 7]
pm.stop().get()
telemetry.flush()
sink = next(s.wrapped for s, _k in hub.entries if type(getattr(s, "wrapped", s)).__name__ == "SpanLines")  # plugin sinks are guarded
print(json.dumps(dict(sink.counts)))
"""


def test_the_documented_example_sink_receives_every_event_kind(client_script, tmp_path: Path) -> None:
    install_plugin(tmp_path)
    out_file = tmp_path / "spans.jsonl"
    out = client_script(CLIENT, env={"SPAN_LINES": str(out_file)}, path=[tmp_path], timeout=120)
    assert out.returncode == 0, out.stderr
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(counts) == {"span", "metric", "lifecycle"} and all(counts.values()), counts
    spans = [json.loads(line) for line in out_file.read_text().splitlines()]
    names = {(s["name"], s["proc"].split("{")[0]) for s in spans}
    assert ("hooked.f", "client") in names and ("hooked.f", "procs0") in names and ("inner", "procs0") in names
    roots = {(s["name"], s["proc"].split("{")[0]) for s in spans if s["parent"] is None}
    # only the client's spans are roots (its calls, and the spawn, whose __init__ s are children)
    assert roots == {("hooked.f", "client"), ("hooked.__init__", "client")}, roots
    assert ("hooked.__init__", "procs0") in names


def test_the_plugin_is_listed_and_blockable(tmp_path: Path) -> None:
    import subprocess
    import sys

    from _helpers.clients import child_env

    install_plugin(tmp_path)
    env = child_env(path=[tmp_path])
    out = subprocess.run([sys.executable, "-m", "monarch_core.cli", "plugins"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert re.search(r"^span_lines \(span-lines==0\.1\)  hooks: monarch_telemetry_sinks$", out.stdout, re.M), out.stdout


def test_shipped_sinks_follow_the_contract(tmp_path: Path) -> None:
    from monarch_core.telemetry import ChromeTraceSink, JsonLinesSink

    for cls in (JsonLinesSink, ChromeTraceSink):
        assert issubclass(cls, hs.TelemetrySink)
    j = JsonLinesSink(str(tmp_path / "a.jsonl"), kinds=["lifecycle"])
    assert j.kinds == {"lifecycle"}
    j.emit([hs.TelemetryEvent("lifecycle", "proc.ready", 5, 0, {"mesh": "m"}), hs.TelemetryEvent("span", "x", 1, 2)])
    j.close()
    rows = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert rows == [{"kind": "lifecycle", "name": "proc.ready", "start_ns": 5, "duration_ns": 0,
                     "attributes": {"mesh": "m"}}]
    c = ChromeTraceSink(str(tmp_path / "t.json"))
    c.emit([hs.TelemetryEvent("span", "work", 2000, 1000, {"proc": "p", "proc_name": "p0", "host": "h", "pid": 3,
                                                            "thread": "t", "span_kind": "internal",
                                                            "span_id": "00000000000000ab"})])
    c.close()
    events = json.loads((tmp_path / "t.json").read_text())
    x = [e for e in events if e["ph"] == "X"]
    assert x == [{"name": "work", "cat": "internal", "ph": "X", "ts": 2.0, "dur": 1.0, "pid": 1, "tid": 1,
                  "args": {"trace_id": None, "span_id": "00000000000000ab", "parent_id": None}}]
    import pytest

    with pytest.raises(ValueError, match="unknown kind"):
        JsonLinesSink(str(tmp_path / "b.jsonl"), kinds=["spans"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ChromeTraceSink(str(tmp_path / "no" / "such" / "dir.json"))
    assert set(telemetry.LIFECYCLE) and all(isinstance(v[1], tuple) for v in telemetry.LIFECYCLE.values())
