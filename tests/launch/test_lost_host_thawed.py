"""A host declared lost ends its worker loop and procs as soon as it runs again.

Two ``local`` hosts (worker loops started for the client's allocation, with
``--exit-with-parent``).  Host 0 -- its worker loop, fork server and procs --
is frozen with SIGSTOP for longer than the client's loss deadline
(``MONARCH_HOST_HEARTBEAT_TIMEOUT=3``), so the client declares it lost and
stops heartbeating it; then it is thawed.  Its worker loop must see that it
was silent for longer than the client waits for a host and, hearing no fresh
heartbeat, end its procs and itself within seconds -- not a
``MONARCH_DELIVERY_TIMEOUT`` later (set to 300 s here, so the old behaviour,
which waited that long, fails the bounded wait).  Host 1 keeps answering.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _helpers.clients import child_env, describe
from _helpers.config import write_hosts_config
from _helpers.procs import wait_pids_gone

CLIENT = r"""
import json, os, signal, sys, time
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint, hosts_from_config

failures = []
api.unhandled_fault_hook = failures.append  # the frozen host's procs: expected

class Where(Actor):
    @endpoint
    def where(self):
        return os.getpid()

def tree(root):
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out

freeze_s = float(sys.argv[1])
hm = hosts_from_config("two", timeout=120)
pm = hm.spawn_procs(per_host={"gpus": 2})
w = pm.spawn("w", Where)
procs = list(w.where.call().get(timeout=120).values())
frozen = tree(int(hm.hosts[0].labels["pid"]))  # worker loop, fork server, procs
for p in frozen:
    os.kill(p, signal.SIGSTOP)
end = time.monotonic() + 60
while len(failures) < 2 and time.monotonic() < end:
    time.sleep(0.1)
time.sleep(freeze_s)
for p in frozen:
    os.kill(p, signal.SIGCONT)
print("THAWED " + json.dumps({"frozen": frozen, "procs": procs, "lost": [f.report() for f in failures]}), flush=True)
sys.stdin.readline()  # the test checks host 0's processes meanwhile
other = list(w.slice(hosts=1).where.call().get(timeout=60).values())
hm.shutdown().get(timeout=120)
print("RESULT " + json.dumps({"other": other}), flush=True)
"""


def test_a_host_thawed_after_it_was_declared_lost_ends_its_worker_loop_and_procs(tmp_path: Path) -> None:
    write_hosts_config(tmp_path, "two", hosts=2)
    env = child_env({
        "MONARCH_CONFIG": str(tmp_path / "monarch.toml"),
        "MONARCH_HEARTBEAT_INTERVAL": "0.5",
        "MONARCH_HOST_HEARTBEAT_TIMEOUT": "3",
        # the worker loops inherit it: the old behaviour waited this long after the thaw
        "MONARCH_DELIVERY_TIMEOUT": "300",
    })
    p = subprocess.Popen([sys.executable, "-c", CLIENT, "4"], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdin is not None
        line = ""
        while not line.startswith("THAWED "):
            line = p.stdout.readline()
            assert line, f"the client ended before the thaw:\n{p.stderr.read() if p.stderr else ''}"
        thawed = json.loads(line[len("THAWED "):])
        assert len(thawed["lost"]) == 2, thawed["lost"]  # host 0's two procs were failed ...
        assert all("host lost: local0" in r for r in thawed["lost"]), thawed["lost"]  # ... as a lost host
        # everything of host 0 ends on its own (well before the 300 s delivery timeout)
        left = wait_pids_gone(thawed["frozen"], 60.0)
        assert left == [], f"host 0 declared lost and thawed, but still running: {left} of {thawed['frozen']}"
        p.stdin.write("\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)
    res = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert p.returncode == 0, describe(res)
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert len(result["other"]) == 2 and not set(result["other"]) & set(thawed["frozen"]), result
    assert set(result["other"]) <= set(thawed["procs"]), result  # host 1's procs, still the same
    assert "the client declared this host lost" in err, err[-4000:]


SUSPENDED = r"""
import json, os, sys
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint, hosts_from_config

failures = []
api.unhandled_fault_hook = failures.append

class Where(Actor):
    @endpoint
    def where(self):
        return os.getpid()

hm = hosts_from_config("two", timeout=120)
pm = hm.spawn_procs(per_host={"gpus": 1})
w = pm.spawn("w", Where)
before = sorted(w.where.call().get(timeout=120).values())
print("UP " + json.dumps(before), flush=True)
sys.stdin.readline()  # the test freezes this client and its hosts, then thaws them
after = sorted(w.where.call().get(timeout=120).values())
hm.shutdown().get(timeout=120)
print("RESULT " + json.dumps({"before": before, "after": after, "failures": [f.report() for f in failures]}),
      flush=True)
"""


def test_a_machine_suspended_as_a_whole_keeps_its_hosts_and_procs(tmp_path: Path) -> None:
    """The client and its hosts all stopped past the loss deadline, then all
    continued (a suspended machine): the client declared nothing lost, so it
    still heartbeats, and the worker loops' recheck keeps every proc."""
    from _helpers.procs import descendants

    write_hosts_config(tmp_path, "two", hosts=2)
    env = child_env({
        "MONARCH_CONFIG": str(tmp_path / "monarch.toml"),
        "MONARCH_HEARTBEAT_INTERVAL": "1",
        "MONARCH_HOST_HEARTBEAT_TIMEOUT": "3",
        "MONARCH_DELIVERY_TIMEOUT": "300",
    })
    p = subprocess.Popen([sys.executable, "-c", SUSPENDED], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    frozen: list[int] = []
    try:
        assert p.stdout is not None and p.stdin is not None
        line = ""
        while not line.startswith("UP "):
            line = p.stdout.readline()
            assert line, f"the client ended early:\n{p.stderr.read() if p.stderr else ''}"
        frozen = [p.pid] + descendants(p.pid)
        for q in frozen:
            os.kill(q, signal.SIGSTOP)
        time.sleep(8)  # past the 3 s loss deadline, for everyone
        for q in reversed(frozen):
            os.kill(q, signal.SIGCONT)
        frozen = []
        time.sleep(8)  # past every recheck window (1 s + 3 intervals of 1 s)
        p.stdin.write("\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=240)
    finally:
        for q in frozen:
            os.kill(q, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)
    res = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert p.returncode == 0, describe(res)
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert result["after"] == result["before"] and result["failures"] == [], result
    assert "the client declared this host lost" not in err, err[-4000:]
