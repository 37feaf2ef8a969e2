"""Heartbeats of the procs a worker loop starts.

A worker loop is its procs' parent: it heartbeats them and kills one that
stops answering (``MONARCH_HEARTBEAT_TIMEOUT``).  Their hello goes to the
client, so the worker loop has to learn their addresses some other way, or
every proc it starts is killed as "hung" one timeout after it started.

On 127.0.0.1 (no namespaces needed), over ``tcp`` and ``tls``; the worker loop
runs with ``MONARCH_HEARTBEAT_INTERVAL=0.2 MONARCH_HEARTBEAT_TIMEOUT=1``.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from _helpers.transport import REPO, free_port, pid_running, tls_env, wait_pids_gone

HEARTBEAT_ENV = {"MONARCH_HEARTBEAT_INTERVAL": "0.2", "MONARCH_HEARTBEAT_TIMEOUT": "1"}
IDLE_S = 3.5  # the client sends nothing for this long: three and a half heartbeat timeouts
CALLS, CALL_GAP_S = 8, 0.5  # then calls now and then, over four more timeouts

PRELUDE = """
import json, os, sys, time
import monarch_core.actor as mactor
from monarch_core.actor import enable_transport
from monarch_core.worker import attach_to_workers
from transport_actors import Hanger
faults = []
mactor.unhandled_fault_hook = lambda failure: faults.append(str(failure))  # expected here: record them
enable_transport("{scheme}://127.0.0.1:0")
hosts = attach_to_workers([{address!r}], timeout=30)
"""

HEALTHY_THEN_HUNG = PRELUDE + """
pm = hosts.spawn_procs(per_host={{"gpus": 2}})
h = pm.spawn("h", Hanger)
fine = pm.spawn("fine", Hanger)
print(json.dumps({{"where": h.where.call().get(timeout=60).values()}}), flush=True)
time.sleep({idle})  # idle: no message to the procs at all
out = {{"after_idle": h.echo.call("idle").get(timeout=30).values()}}
busy = []
for i in range({calls}):  # a call now and then
    busy.append(h.echo.call(i).get(timeout=30).values())
    time.sleep({gap})
out["busy"] = busy
out["where"] = h.where.call().get(timeout=60).values()
out["faults"] = list(faults)
print(json.dumps({{"healthy": out}}), flush=True)
fut = h.slice(gpus=1).hang.call_one()
t0 = time.monotonic()
try:
    call = "value: %r" % (fut.get(timeout=60),)
except Exception as e:
    call = "%s: %s" % (type(e).__name__, e)
detected = time.monotonic() - t0
try:
    other = fine.slice(gpus=0).echo.call_one("still here").get(timeout=30)
except Exception as e:
    other = "%s: %s" % (type(e).__name__, e)
end = time.monotonic() + 30  # the fault reaches the hook after the caller's error: wait for it
while not any("hung" in f for f in faults) and time.monotonic() < end:
    time.sleep(0.05)
print(json.dumps({{"hung": {{"call": call, "other": other, "faults": faults, "detected_s": detected}}}}), flush=True)
os._exit(0)  # keep the worker loop running (a clean exit would shut the attached hosts down)
"""


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
def test_worker_loop_procs_stay_healthy_across_heartbeat_timeouts_and_a_hung_one_is_killed(
    workers, clients, pki, scheme  # type: ignore[no-untyped-def]
) -> None:
    tls = pki.hosts[1] if scheme == "tls" else None  # its certificate names 127.0.0.1 too
    w = workers(f"{scheme}://127.0.0.1:{free_port()}", tls=tls, env=HEARTBEAT_ENV)
    c = clients(HEALTHY_THEN_HUNG.format(scheme=scheme, address=w.address, idle=IDLE_S, calls=CALLS, gap=CALL_GAP_S),
                env=tls_env(pki.client) if tls else None)
    where = c.expect("where")
    pids = [x["pid"] for x in where]
    # the procs run this checkout's code (the fix under test), under the worker loop
    assert all(x["monarch_core"].startswith(str(REPO) + os.sep) for x in where), where
    assert sorted(pids) == sorted(w.children())

    out = c.expect("healthy", timeout=90)
    assert out["after_idle"] == ["idle", "idle"]
    assert out["busy"] == [[i, i] for i in range(CALLS)]
    assert [x["pid"] for x in out["where"]] == pids  # the same procs: none was killed and replaced
    assert out["faults"] == []
    assert all(pid_running(p) for p in pids)
    assert "heartbeat" not in w.output(), w.output()

    hung = c.expect("hung", timeout=90)
    print(f"\nworker loop ({scheme}): SIGSTOPped proc -> client's call failed after {hung['detected_s'] * 1000:.0f} ms "
          f"(heartbeat interval 0.2 s, timeout 1 s)")
    assert hung["call"].startswith("SupervisionError: "), hung
    assert "was hung: it answered no heartbeat for 1s and was killed" in hung["call"], hung
    assert wait_pids_gone([pids[1]], 30) == [], "the hung proc was reported but is still there"
    assert hung["other"] == "still here"  # the other proc was not touched
    assert pid_running(pids[0])
    assert [f for f in hung["faults"] if "'h'" in f and "hung" in f], hung["faults"]
    assert w.popen.poll() is None, w.output()


# ---------------------------------------------------------------- figures (printed, not asserted)

SIGKILL_DETECTION = PRELUDE + """
n = {n}
pm = hosts.spawn_procs(per_host={{"gpus": n}})
h = pm.spawn("h", Hanger)
pids = [x["pid"] for x in h.where.call().get(timeout=60).values()]
times, errors = [], []
for i in range(n):
    fut = h.slice(gpus=i).sleep.call_one(60)
    time.sleep(0.3)  # the call is being served
    t0 = time.monotonic()
    os.kill(pids[i], 9)
    try:
        fut.get(timeout=60)
        errors.append("returned")
    except Exception as e:
        times.append(time.monotonic() - t0)
        errors.append(type(e).__name__)
print(json.dumps({{"result": {{"times": times, "errors": errors}}}}), flush=True)
os._exit(0)
"""

HOLD = PRELUDE + """
pm = hosts.spawn_procs(per_host={{"gpus": 2}})
h = pm.spawn("h", Hanger)
print(json.dumps({{"pids": [x["pid"] for x in h.where.call().get(timeout=60).values()]}}), flush=True)
sys.stdin.readline()  # killed while waiting here
"""


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def test_worker_loop_failure_detection_figures(workers, clients) -> None:  # type: ignore[no-untyped-def]
    """How fast a SIGKILLed proc's caller hears of it, and how fast a killed
    client's procs go, on a worker loop (with the default heartbeat)."""
    w = workers(f"tcp://127.0.0.1:{free_port()}")
    c = clients(SIGKILL_DETECTION.format(scheme="tcp", address=w.address, n=3))
    out = c.expect("result", timeout=120)
    assert out["errors"] == ["SupervisionError"] * 3, out
    kill_ms = [t * 1000 for t in out["times"]]

    gone_ms = []
    for _ in range(3):
        c = clients(HOLD.format(scheme="tcp", address=w.address))
        pids = c.expect("pids")
        t0 = time.monotonic()
        c.popen.send_signal(signal.SIGKILL)
        deadline = t0 + 30
        while any(pid_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.002)
        assert not any(pid_running(p) for p in pids), "a dead client's procs are still running"
        gone_ms.append((time.monotonic() - t0) * 1000)
        c.popen.wait(30)
    assert w.popen.poll() is None, w.output()
    print(f"\nworker loop: SIGKILLed proc -> caller's SupervisionError: {', '.join(f'{t:.1f}' for t in kill_ms)} ms "
          f"(median {_median(kill_ms):.1f})")
    print(f"worker loop: client SIGKILLed -> its procs gone: {', '.join(f'{t:.0f}' for t in gone_ms)} ms "
          f"(median {_median(gone_ms):.0f})")
    print(json.dumps({"sigkill_detection_ms": kill_ms, "client_death_to_procs_gone_ms": gone_ms}))
