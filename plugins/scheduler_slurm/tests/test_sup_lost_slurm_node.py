"""A Slurm node whose slurmd is SIGKILLed: once the client declares the
host lost (slurmctld's node failure, after ``SlurmdTimeout``, 10 s in the
testbed), the worker loop there hears no more heartbeats and ends itself,
its procs and so the step's tasks on that node (``_node``), while slurmd is
still dead -- nothing is left running until the client shuts down.

Takes about a minute (Slurm's node-failure verdict).  Only the last node's
(h7's) slurmd is killed, and it is restarted in ``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import slurm_helpers as H  # noqa: E402 - the Slurm suite's helpers

from _helpers.clients import PY, LineReader  # noqa: E402
from _helpers.testbed import RT_RUN, SlurmTestbed, netns, pid_alive, slurm  # noqa: E402,F401 - fixtures
from _helpers.testbed import Testbed as _Testbed  # noqa: E402 - (a Test* name would be collected)

pytest.importorskip("hostlist")

PROGRAM = r'''
import json, os, socket, sys, threading, time
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint, hosts_from_config

causes, cond = [], threading.Condition()
def hook(failure):
    with cond:
        if not failure.notice:
            causes.append([failure.events[0]["proc"], failure.events[0]["cause"]])
        cond.notify_all()
api.unhandled_fault_hook = hook

class Where(Actor):
    @endpoint
    def where(self):
        return [socket.gethostname(), os.getpid()]

def say(kind, **kw):
    print(kind + " " + json.dumps(kw), flush=True)

hm = hosts_from_config("lost")
pm = hm.spawn_procs()
w = pm.spawn("where", Where)
say("READY", job=hm.hosts[0].labels["job"], where=w.where.call().get(timeout=120).values())
sys.stdin.readline()  # the test has killed the last node's slurmd
with cond:
    cond.wait_for(lambda: any("@LAST@" in c for _p, c in causes), timeout=150)
say("LOST", causes=causes, table=hm.to_table())
sys.stdin.readline()  # the test has looked at that node
hm.shutdown().get(timeout=60)
'''.replace("@LAST@", H.N3)

TOML = f"""
[hosts.lost]
scheduler = "slurm"
job_name = "{H.JOB_NAME}"
time = "00:05:00"
nodes = 3
"""


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


@pytest.mark.timeout(300)
def test_a_killed_slurmd_leaves_nothing_of_the_job_running_on_its_node(
    slurm: SlurmTestbed, netns: _Testbed, tmp_path: Path  # noqa: F811
) -> None:
    H.write_project(tmp_path, PROGRAM, TOML)
    env = H.env({"MONARCH_DELIVERY_TIMEOUT": "4", "MONARCH_HEARTBEAT_INTERVAL": "0.5"})
    p = subprocess.Popen([PY, "prog.py"], cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    out, err = LineReader(p.stdout, "slurm-lost"), LineReader(p.stderr, "slurm-lost-err")

    def get(kind: str, timeout: float) -> dict:
        try:
            _, line = out.wait_for(lambda s: s if s.startswith(kind + " ") else None, timeout)
        except (EOFError, TimeoutError) as e:
            raise AssertionError(f"no {kind} line ({e}); rc {p.poll()}\nstdout:\n{out.text()[-3000:]}\n"
                                 f"stderr:\n{err.text()[-6000:]}") from None
        return json.loads(line[len(kind) + 1:])

    def tell() -> None:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()

    killed = False
    try:
        ready = get("READY", H.CLIENT_TIMEOUT)
        assert sorted(h for h, _ in ready["where"]) == list(H.NODES), ready
        procs = [pid for h, pid in ready["where"] if h == H.N3]
        step = [q for q in netns.ns_pids(H.NODE_NUMBERS[-1])
                if "monarch_scheduler_slurm._node" in _cmd(q) or "monarch_core.worker" in _cmd(q)]
        assert len(step) >= 2, f"no step task and worker loop found in {H.N3}: {[(q, _cmd(q)) for q in step]}"
        watched = procs + step
        pid = int((RT_RUN / "pids" / f"slurmd-{H.N3}.pid").read_text())
        assert pid_alive(f"slurmd-{H.N3}")
        os.kill(pid, signal.SIGKILL)
        killed = True
        tell()
        lost = get("LOST", 200)
        # slurmd is still dead: the worker loop (no heartbeat for its 4 s delivery timeout),
        # its proc and the step's task end on their own
        deadline = time.monotonic() + 40
        while any(_alive(q) for q in watched) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [(q, _cmd(q)[:120]) for q in watched if _alive(q)]
        assert not left, f"still running in {H.N3} after it was declared lost: {left}"
        last = [c for proc, c in lost["causes"] if proc.endswith(f"on host {H.N3}")]
        assert last and all(c.startswith(f"host lost: {H.N3}: ") for c in last), lost
        tell()
        assert p.wait(90) == 0, err.text()[-4000:]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(30)
        H.cancel_our_jobs()  # first: the restart waits for every node to be idle
        if killed:
            deadline = time.monotonic() + 60
            while (set(H.our_jobs().values()) & {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}
                   and time.monotonic() < deadline):
                H.cancel_our_jobs()
                time.sleep(0.5)
            slurm.restart()
