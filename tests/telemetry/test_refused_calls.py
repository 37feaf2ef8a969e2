"""A call refused before sending -- its view already has a failed rank --
counts on the endpoint's client-side stat as a failed call, so the
dashboard shows it as a **caller** error (it used to count nowhere).

A real proc is killed; once the client knows (its fault hook ran), a
``call_one`` to the dead rank, a ``call``, a ``broadcast`` and a ``stream``
to the whole mesh are refused with ``SupervisionError`` ("cannot call ...", nothing
sent); the script prints the client-side metrics and what the dashboard's
model (fed by a real sink of the client) makes of them."""

from __future__ import annotations

import json

SCRIPT = r"""
import json, os, signal, sys, time
import monarch_core.actor as api
from monarch_core import telemetry
from monarch_core.actor import Actor, endpoint, this_host
from monarch_core.errors import SupervisionError
from monarch_dashboard._model import JobModel

model = JobModel()

class ToModel:                        # a sink: the dashboard's model is fed what the client's sinks get
    def emit(self, batch):
        model.ingest(list(batch))
    def close(self):
        pass

telemetry.add_sink(ToModel())
handled = []
api.unhandled_fault_hook = lambda failure: handled.append(failure.mesh_name)   # the client goes on

class Worker(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

pm = this_host().spawn_procs({"gpus": 2})
w = pm.spawn("w", Worker)
pids = [pid for _point, pid in w.pid.call().get(timeout=60)]
os.kill(pids[1], signal.SIGKILL)
deadline = time.time() + 60
while not handled and time.time() < deadline:
    time.sleep(0.05)
assert handled, "the client never heard of the killed proc"

refused = []
def expect_refused(fn):
    try:
        fn()
    except SupervisionError as e:
        refused.append(str(e).split(":", 1)[0])
    else:
        refused.append("not refused")

expect_refused(lambda: w.slice(gpus=1).pid.call_one().get(timeout=30))
expect_refused(lambda: w.slice(gpus=1).pid.call_one().get(timeout=30))
expect_refused(lambda: w.pid.call().get(timeout=30))
expect_refused(lambda: w.pid.broadcast())
expect_refused(lambda: [f.get(timeout=30) for f in w.pid.stream()])
alive = w.slice(gpus=0).pid.call_one().get(timeout=30)   # the live rank still answers

rows = [r.as_dict() for r in telemetry.endpoint_metrics("w", "pid", side="client", timeout=10)]
telemetry.flush(10)
(row,) = model.endpoint_rows()
print(json.dumps({"refused": refused, "alive": alive == pids[0], "client": rows,
                  "caller_errors": row.caller_errors, "errors": row.errors,
                  "rank_caller_errors": {k.rank: k.caller_errors for k in row.ranks}}))
pm.stop().get(timeout=60)
"""


def test_a_call_refused_for_a_failed_rank_counts_as_a_caller_failure(client_script) -> None:
    out = client_script(SCRIPT, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["refused"] == ["cannot call w.pid"] * 5, res["refused"]  # refused before sending, all five
    assert res["alive"]
    by = {(r["adverb"], r["rank"]): r for r in res["client"]}
    # call_one to rank 1: two refused calls on rank 1's stat, no latency sample, no bytes
    one = by[("call_one", 1)]
    assert one["calls"] == 2 and one["errors"] == {"SupervisionError": 2}, one
    assert one["latency_count"] == 0 and one["request_bytes"] == 0, one
    assert by[("call", None)]["errors"] == {"SupervisionError": 1}, by[("call", None)]
    assert by[("broadcast", None)]["errors"] == {"SupervisionError": 1}, by[("broadcast", None)]
    stream = by[("stream", None)]
    assert stream["errors"] == {"SupervisionError": 1} and stream["latency_count"] == 0, stream
    assert by[("call_one", 0)]["errors"] == {}, by[("call_one", 0)]  # the live rank's call succeeded
    # the dashboard: caller badges, on the row and on rank 1 (the endpoint itself raised nothing)
    assert res["errors"] == {}, res
    assert res["caller_errors"] == {"SupervisionError": 5}, res
    assert res["rank_caller_errors"].get("1") == {"SupervisionError": 2}, res
