"""``endpoint.raised``: an endpoint's exception reaches the client's sinks with
its type, message, rank and a traceback that starts in the endpoint's own code;
an endpoint raising in a tight loop is reported a bounded number of times per
telemetry interval, the rest counted in ``skipped`` (and, as always, in the metrics)."""

from __future__ import annotations

import json
from pathlib import Path

from monarch_core._telemetry import _raised

SCRIPT = r"""
import json, sys
import monarch_core.actor as A
from monarch_core import telemetry

events = []

class Recorder:
    kinds = frozenset({"lifecycle"})
    def emit(self, batch):
        events.extend(dict(e.attributes) for e in batch if e.name == "endpoint.raised")
    def close(self):
        pass

telemetry.add_sink(Recorder())

class W(A.Actor):
    @A.endpoint
    def step(self, i):
        if A.current_rank().rank == 1:
            raise ValueError(f"bad batch {i}")
        return i

pm = A.this_host().spawn_procs({"gpus": 2})
w = pm.spawn("w", W)
for i in range(int(sys.argv[2])):
    try:
        w.step.call(i).get(timeout=30)
    except A.ActorError:
        pass
telemetry.flush(10)
errors = sum(m.error_count for m in telemetry.endpoint_metrics("w", "step", "server", refresh=False))
pm.stop().get(timeout=30)
json.dump({"events": events, "errors": errors}, open(sys.argv[1], "w"))
"""


def test_an_endpoints_exception_arrives_with_message_traceback_and_rank_bounded(client_script, tmp_path: Path) -> None:
    out_path = tmp_path / "out.json"
    n = 40
    # a long interval: the whole loop falls in one or two windows, so most raises are left out
    out = client_script(SCRIPT, str(out_path), str(n), timeout=180, env={"MONARCH_TELEMETRY_INTERVAL": "30"})
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out_path.read_text())
    events = got["events"]
    assert got["errors"] == n  # the metrics count every one
    assert 1 <= len(events) <= 2 * _raised.PER_WINDOW, len(events)
    first = events[0]
    assert (first["mesh"], first["endpoint"], first["rank"], first["error_type"]) == ("w", "step", 1, "ValueError")
    assert first["message"] == "bad batch 0"
    tb = first["traceback"]
    assert tb.startswith("Traceback (most recent call last):\n  File ") and "client.py" in tb.splitlines()[1], tb
    assert 'raise ValueError(f"bad batch {i}")' in tb and tb.rstrip().endswith("ValueError: bad batch 0")
    assert "_proc" not in tb  # the runtime's frames that ran the endpoint are left out
    assert [e["message"] for e in events[: _raised.PER_WINDOW]] == [f"bad batch {i}" for i in range(_raised.PER_WINDOW)]
    assert all(e["skipped"] == 0 for e in events[: _raised.PER_WINDOW])
