"""Hung-but-alive procs: the parent's heartbeat notices a proc that stopped
answering, kills it, and reports that it was hung (a subprocess client, with
``MONARCH_HEARTBEAT_INTERVAL=0.2 MONARCH_HEARTBEAT_TIMEOUT=1``)."""

from __future__ import annotations

import json

from _helpers.procs import kill_pids, wait_pids_gone

HUNG_CLIENT = """
import json, os, signal, sys, threading
import monarch_core.actor as mactor
from monarch_core.actor import Actor, endpoint, this_host

got = []
ev = threading.Event()
def hook(failure):
    got.append(failure)
    ev.set()
mactor.unhandled_fault_hook = hook

class Hanger(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def hang(self):
        os.kill(os.getpid(), signal.SIGSTOP)   # the whole proc, trio loop included, stops
        # The signal stops this thread at its next return to user space, which
        # may come a moment after kill() returns: never reply in that window.
        threading.Event().wait()
        return "resumed?!"

class Fine(Actor):
    @endpoint
    def ok(self):
        return "fine"

pm = this_host().spawn_procs(per_host={"gpus": 2})
h = pm.spawn("hanger_mesh", Hanger)
fine = pm.spawn("fine_mesh", Fine)
pids = h.pid.call().get(timeout=30).values()
print("PIDS " + json.dumps(pids), flush=True)
fut = h.slice(gpus=1).hang.call_one()
out = {}
out["hook_called"] = ev.wait(20)
out["hook"] = [str(f) for f in got]
def gone(pid):
    try:
        st = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return st in ("Z", "X")
out["hung_pid_gone"] = gone(pids[1])
try:
    out["call"] = "value: %r" % (fut.get(timeout=20),)
except Exception as e:
    out["call"] = "%s: %s" % (type(e).__name__, e)
try:
    out["healthy"] = fine.slice(gpus=0).ok.call_one().get(timeout=20)
except Exception as e:
    out["healthy"] = "%s: %s" % (type(e).__name__, e)
print("RESULT " + json.dumps(out), flush=True)
"""


def test_hung_proc_is_killed_and_reported_as_hung(client_script) -> None:
    r = client_script(HUNG_CLIENT, env={"MONARCH_HEARTBEAT_INTERVAL": "0.2", "MONARCH_HEARTBEAT_TIMEOUT": "1"})
    pids = []
    try:
        lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in r.stdout.splitlines() if " " in ln}
        assert "RESULT" in lines, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
        pids = json.loads(lines["PIDS"])
        res = json.loads(lines["RESULT"])
        assert res["hook_called"], res
        hung = [t for t in res["hook"] if "hanger_mesh" in t]
        assert len(hung) == 1, res["hook"]
        text = hung[0]
        assert "{'gpus': 1/2}" in text
        assert "hung" in text and "killed" in text, text
        assert "heartbeat" in text
        assert res["call"].startswith("SupervisionError"), res["call"]
        assert "hung" in res["call"]
        assert res["hung_pid_gone"], "the hung proc was reported but is still there"
        assert res["healthy"] == "fine"  # the other proc was not touched
        assert r.returncode == 0, r.stderr
    finally:
        kill_pids(wait_pids_gone(pids, 5.0))
