"""``monarch summary FILE``: top endpoints by total time, p50/p99 and errors,
from a recorded Chrome trace or JSON-lines telemetry file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from monarch_core import telemetry
from monarch_core.actor import Actor, ActorError, endpoint

from _helpers.clients import child_env


class S(Actor):
    @endpoint
    def fast(self) -> int:
        return 1

    @endpoint
    def slow(self) -> int:
        import time

        time.sleep(0.02)
        return 2

    @endpoint
    def bad(self) -> None:
        raise OSError("disk")


def summary(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monarch_core.cli", "summary", *args], capture_output=True,
                          text=True, env=child_env(), timeout=60)


def cells(text: str) -> list[list[str]]:
    """The table's cells, cut where its dashed line says the columns are."""
    lines = text.splitlines()
    spans, pos = [], 0
    for dash in lines[1].split("  "):
        spans.append((pos, pos + len(dash)))
        pos += len(dash) + 2
    return [[line[a:b].strip() for a, b in spans] for line in lines[2:]]


def rows_of(text: str) -> dict[tuple[str, str], list[str]]:
    return {(c[0], c[1]): c for c in cells(text)}


def test_summary_of_a_trace_and_of_an_events_file(procs, tmp_path: Path) -> None:
    m = procs.spawn("summed", S).slice(gpus=0)
    m.fast.call_one().get()  # the actor is up (its first call waits for __init__)
    trace, events = tmp_path / "run.json", tmp_path / "run.jsonl"
    with telemetry.record_trace(str(trace)), telemetry.record_events(str(events)):
        for _ in range(10):
            m.fast.call_one().get()
        for _ in range(3):
            m.slow.call_one().get()
        for _ in range(2):
            try:
                m.bad.call_one().get()
            except ActorError:
                pass
    for path in (trace, events):
        # every row (--top 0): endpoints of earlier tests in this process can fill the default top 20
        out = summary(str(path), "--top", "0")
        assert out.returncode == 0, out.stderr
        rows = rows_of(out.stdout)
        totals = [float(c[4]) for c in cells(out.stdout)]
        assert totals == sorted(totals, reverse=True), out.stdout  # most total time first
        # (the metrics count from the process's start: endpoints of earlier tests in this process may be listed too)
        assert len([c for c in cells(out.stdout) if c[1].startswith("summed.")]) == 6, out.stdout
        assert rows[("server", "summed.fast")][2] == ("10" if path == trace else "11")  # metrics count from the start
        assert rows[("client", "summed.slow")][2] == "3"
        assert "OSError 2" in out.stdout and ("ActorError 2" in out.stdout)
        p50 = float(rows[("server", "summed.slow")][5])
        assert 15 <= p50 <= 200, out.stdout  # ms: the endpoint sleeps 20 ms
    server_only = summary(str(trace), "--side", "server", "--top", "1")
    assert server_only.returncode == 0
    body = server_only.stdout.splitlines()[2:]
    assert len(body) == 1 and body[0].split()[:2] == ["server", "summed.slow"], server_only.stdout
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    assert {x["kind"] for x in lines} >= {"span", "metric"}


def test_summary_of_a_file_that_is_neither_says_so(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    out = summary(str(bad))
    assert out.returncode == 1 and "not a Chrome trace" in out.stderr
    out = summary(str(tmp_path / "missing.json"))
    assert out.returncode == 1 and "no such file" in out.stderr
