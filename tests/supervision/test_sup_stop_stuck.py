"""Stopping an actor whose thread never comes back (``__init__`` or an
endpoint blocked forever) completes after the stop grace period.

A thread cannot be killed: the stop completes without it.  The actor becomes
unreachable (calls fail with a clear "stopped" error naming what it was stuck
in), the proc keeps serving its other actors, and the proc's own stop ends
it.  The client runs in a child interpreter with ``MONARCH_STOP_GRACE=3``
(inherited by its procs), so that the grace is short; the timeouts below
only guard against hangs, nothing asserts how long anything took.
"""

from __future__ import annotations

import json

from _helpers.procs import kill_pids, wait_pids_gone

STUCK_CLIENT = r'''
import json, logging, os, threading
from monarch_core.actor import Actor, Channel, endpoint, this_host
import monarch_core.actor as mactor
from monarch_core.errors import SupervisionError

faults = []
mactor.unhandled_fault_hook = faults.append
escalations = []


class Escalations(logging.Handler):
    def emit(self, record):
        if "did not stop within the grace period" in record.getMessage():
            escalations.append(record.getMessage())


logging.getLogger("monarch.mesh").addHandler(Escalations())
out = {}


class Stuck(Actor):
    def __init__(self, block_init):
        if block_init:
            threading.Event().wait()  # never returns

    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def hang(self, notify):
        notify.send("hanging")
        threading.Event().wait()  # never returns


class Fine(Actor):
    @endpoint
    def pid(self):
        return os.getpid()


def err(fut):
    exc = fut.exception(timeout=30)
    return None if exc is None else f"{type(exc).__name__}: {exc}"


pm = this_host().spawn_procs(per_host={"gpus": 1})
fine = pm.spawn("fine", Fine)
pid = fine.pid.call_one().get(timeout=60)
out["pid"] = pid

# ---- __init__ blocked forever
stuck_init = pm.spawn("stuck_init", Stuck, True)
queued = stuck_init.pid.call_one()  # waits behind __init__
out["fine_while_init_stuck"] = fine.pid.call_one().get(timeout=30) == pid
stuck_init.stop("making room").get(timeout=60)
out["init_stop_done"] = True
out["init_queued"] = err(queued)
out["init_later"] = err(stuck_init.pid.call_one())
out["init_initialized"] = err(stuck_init.initialized)

# ---- an endpoint blocked forever
stuck_ep = pm.spawn("stuck_ep", Stuck, False)
notify, notified = Channel.open(once=True)
in_flight = stuck_ep.hang.call_one(notify)
assert notified.recv().get(timeout=30) == "hanging"
behind = stuck_ep.pid.call_one()
out["fine_while_ep_stuck"] = fine.pid.call_one().get(timeout=30) == pid
stuck_ep.stop().get(timeout=60)
out["ep_stop_done"] = True
out["ep_in_flight"] = err(in_flight)
out["ep_behind"] = err(behind)
out["ep_later"] = err(stuck_ep.pid.call_one())
out["fine_after"] = fine.pid.call_one().get(timeout=30) == pid

# ---- the proc's own stop ends it, stuck threads and all
pm.stop().get(timeout=60)
out["proc_stop_done"] = True
out["escalations"] = list(escalations)  # (of this stop: pm2 below may escalate, see its comment)
out["faults"] = [str(f) for f in faults]

# ---- a proc whose actor is stuck when the proc itself is stopped: the proc gives its actors
# grace - 0.5 s, abandons the stuck one and exits; on a loaded machine its exit can overrun the
# remaining 0.5 s and the client then escalates (SIGTERM) -- either way the proc is gone (checked below)
pm2 = this_host().spawn_procs(per_host={"gpus": 1})
s2 = pm2.spawn("stuck_at_proc_stop", Stuck, False)
pid2 = s2.pid.call_one().get(timeout=60)
notify2, notified2 = Channel.open(once=True)
s2.hang.broadcast(notify2)
assert notified2.recv().get(timeout=30) == "hanging"
pm2.stop().get(timeout=60)
out["pid2"] = pid2
out["proc2_stop_done"] = True
print("RESULT " + json.dumps(out), flush=True)
'''


def test_stopping_a_stuck_actor_completes_and_the_proc_stop_ends_it(client_script) -> None:
    r = client_script(STUCK_CLIENT, env={"MONARCH_STOP_GRACE": "3"}, timeout=240)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    out = json.loads(lines[0][len("RESULT "):])
    pids = [out["pid"], out["pid2"]]
    try:
        assert wait_pids_gone(pids, 10.0) == [], "the procs outlived their stop"
    finally:
        kill_pids(pids)

    # the proc kept serving its other actor throughout
    assert out["fine_while_init_stuck"] and out["fine_while_ep_stuck"] and out["fine_after"]

    # __init__ never returned: the stop completed; calls say it was stopped, and why
    assert out["init_stop_done"]
    for key in ("init_queued", "init_later", "init_initialized"):
        text = out[key]
        assert text and text.startswith("SupervisionError: "), f"{key}: {text}"
        assert "stopped" in text and "making room" in text, f"{key}: {text}"
    assert "its __init__ did not return within the 3s stop grace period" in out["init_queued"]
    assert "stuck_init" in out["init_later"] and "(Stuck)" in out["init_later"]
    assert "__init__ did not complete" in out["init_initialized"]

    # an endpoint never returned: the same, naming the endpoint
    assert out["ep_stop_done"]
    for key in ("ep_in_flight", "ep_behind", "ep_later"):
        text = out[key]
        assert text and text.startswith("SupervisionError: "), f"{key}: {text}"
        assert "stopped" in text, f"{key}: {text}"
    assert "its endpoint hang did not return within the 3s stop grace period" in out["ep_later"]
    assert "hang did not complete" in out["ep_in_flight"]
    assert "pid was not run" in out["ep_behind"]

    # the proc's own stop ended it without escalating to signals; nothing was a failure
    assert out["proc_stop_done"] and out["escalations"] == []
    assert out["faults"] == []
    assert out["proc2_stop_done"]
