"""docs/observability.md stays true: its walk-through runs and produces the
trace it describes, and its lifecycle table is the one the code declares."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from monarch_core._telemetry import _events

from _helpers.clients import child_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


def block(marker: str) -> str:
    m = re.search(rf"<!-- run: {marker} -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert m, f"docs/observability.md has no runnable block {marker!r}"
    return m.group(1)


def test_the_walkthrough_runs_and_writes_the_trace_it_describes(client_script, tmp_path: Path) -> None:
    out = client_script(block("walkthrough"), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "trainers.step" in out.stdout  # the metrics table
    events = json.loads((tmp_path / "run.json").read_text())
    procs = [e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert len(procs) == 3 and any(p.startswith("client") for p in procs)
    assert any(p.startswith("procs0{'gpus': 1/2} (localhost, pid ") for p in procs)
    threads = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"trainers{'gpus': 0/2}", "trainers{'gpus': 1/2}", "MainThread"} <= threads
    spans = [e for e in events if e["ph"] == "X"]
    assert sum(1 for s in spans if s["name"] == "trainers.step" and s["cat"] == "client") == 20
    server = {s["args"]["span_id"] for s in spans if s["name"] == "trainers.step" and s["cat"] == "server"}
    pre = [s for s in spans if s["name"] == "preprocess"]
    assert len(server) == len(pre) == 40 and {s["args"]["parent_id"] for s in pre} == server
    instants = {e["name"] for e in events if e["ph"] == "i"}
    assert {"proc_mesh.stopping", "proc.stopped", "proc_mesh.stopped"} <= instants, instants
    summary = subprocess.run([sys.executable, "-m", "monarch_core.cli", "summary", str(tmp_path / "run.json")],
                             capture_output=True, text=True, env=child_env(), timeout=60)
    assert summary.returncode == 0, summary.stderr
    rows = {tuple(line.split()[:3]) for line in summary.stdout.splitlines()[2:]}
    assert ("client", "trainers.step", "20") in rows and ("server", "trainers.step", "40") in rows


def test_the_lifecycle_table_is_generated_from_the_declarations() -> None:
    m = re.search(r"<!-- lifecycle -->\n(.*?)<!-- /lifecycle -->", DOC.read_text(), re.S)
    assert m and m.group(1) == _events.markdown_table(), (
        "docs/observability.md's lifecycle table drifted from monarch_core/_telemetry/_events.py: paste "
        "_events.markdown_table() between the markers"
    )
