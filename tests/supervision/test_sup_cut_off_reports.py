"""Failure reports say what was observed: a proc that stopped acknowledging
(SIGSTOPped, alive) is "lost contact with its process (not seen to exit): ...
nothing acknowledged for N s", never "its process died"."""

from __future__ import annotations

import json

from _helpers.clients import describe, run_code

CODE = r'''
import json, os, signal, time
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint, this_host

failures = []
api.unhandled_fault_hook = failures.append

class A(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

pm = this_host().spawn_procs(per_host={"gpus": 1})
a = pm.spawn("a", A)
pid = a.pid.call_one().get(timeout=60)
os.kill(pid, signal.SIGSTOP)  # alive, but it acknowledges nothing
def state():
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
deadline = time.monotonic() + 10
while state() not in ("T", "t") and time.monotonic() < deadline:  # the stop takes effect
    time.sleep(0.01)
try:
    try:
        a.pid.call_one().get(timeout=30)
        err = None
    except Exception as e:
        err = str(e)
    deadline = time.monotonic() + 20
    while not failures and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = state() not in ("Z", "X")
    print("RESULT " + json.dumps({"err": err, "causes": [f.events[0]["cause"] for f in failures], "alive": alive}))
finally:
    os.kill(pid, signal.SIGCONT)
'''


def test_a_proc_that_stops_acknowledging_is_reported_cut_off_not_dead() -> None:
    res = run_code(CODE, env={"MONARCH_DELIVERY_TIMEOUT": "2", "MONARCH_HEARTBEAT_TIMEOUT": "120",
                              "MONARCH_HEARTBEAT_INTERVAL": "0.5"}, timeout=120)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, describe(res)
    out = json.loads(line[len("RESULT "):])
    assert out["err"] and "nothing acknowledged for 2s" in out["err"], out
    assert out["alive"], out  # it was not killed: only cut off
    assert len(out["causes"]) == 1, out
    cause = out["causes"][0]
    assert cause.startswith("lost contact with its process (not seen to exit): "), cause
    assert "nothing acknowledged for 2s" in cause and "died" not in cause, cause
