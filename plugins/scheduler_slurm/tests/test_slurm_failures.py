"""A running job's failures on the real cluster, each reported at the owner
(the client's ``unhandled_fault_hook``) and none hanging: ``scancel``, the
time limit (after the warning signal's notice), a requeue (the job is kept),
and a killed slurmd on the last node, h7 (only its procs fail).

The time-limit test takes about a minute and a half: Slurm's smallest time
limit is one minute (``--time=1``), and its background loop checks limits every
30 s.  The warning (``--signal=USR2@20``) comes at the first check with at most
20 + 30 s left, 10-40 s after the start, when the worker step runs.  ``@50``
would be due at the first check after the start, which can come before the
step exists; the signal then reaches no step.
The slurmd test takes ~30 s: slurmctld declares a silent node down after
``SlurmdTimeout`` (10 s in the testbed).  Daemons are killed on h7 only and
restarted in ``finally``.
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

import slurm_helpers as H
from _helpers.clients import PY, LineReader
from _helpers.testbed import RT_RUN, pid_alive

pytest.importorskip("hostlist")

PROGRAM = r'''
import json, os, socket, subprocess, sys, threading, time
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint, hosts_from_config

events, cond = [], threading.Condition()


def hook(failure):  # records every supervision event (failures and notices) that reaches the client
    with cond:
        events.append({"notice": failure.notice, "report": failure.report(),
                       "proc": failure.events[0]["proc"], "cause": failure.events[0]["cause"]})
        cond.notify_all()


api.unhandled_fault_hook = hook


def wait_for(pred, timeout, what, count=1):
    deadline = time.monotonic() + timeout
    with cond:
        while sum(1 for e in events if pred(e)) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"no {what} within {timeout}s; events: {events}")
            cond.wait(left)


def say(kind, **kw):
    print(kind + " " + json.dumps(kw), flush=True)


class Where(Actor):
    @endpoint
    def where(self):
        return socket.gethostname()


scenario = sys.argv[1]
hm = hosts_from_config(scenario)
job = hm.hosts[0].labels["job"]
pm = hm.spawn_procs()
w = pm.spawn("where", Where)
say("READY", job=job, where=w.where.call().get(timeout=120).values())
if scenario == "cancel":
    subprocess.run(["timeout", "30", "scancel", job], check=True)
    # one failure per rank: the cancel (the scheduler's verdict on the host), or, when a worker
    # loop saw Slurm's SIGTERM end its proc first, that death; the scheduler names the cancel
    # on every host either way (the test reads it in stderr)
    wait_for(lambda e: not e["notice"], 60, "a failure of each rank", count=2)
    time.sleep(1)  # the scheduler's verdict on the second host, when a proc death came first
elif scenario == "timelimit":
    wait_for(lambda e: e["notice"], 90, "notice")
    t_notice = time.monotonic()
    after_notice = w.where.call().get(timeout=60).values()  # a notice fails nothing
    # one failure per rank: the time limit (the scheduler's verdict on the host), or, when the
    # proc's connection closed before that verdict came, the lost contact; the scheduler names
    # the time limit on every host either way (the test reads it in stderr)
    wait_for(lambda e: not e["notice"], 120, "a failure of each rank", count=2)
    time.sleep(1)  # the scheduler's verdict on the second host, when a lost contact came first
    say("TIMES", after_notice=after_notice, notice_to_end=time.monotonic() - t_notice)
elif scenario == "requeue":
    subprocess.run(["timeout", "30", "scontrol", "requeue", job], check=True)
    # one failure per rank: the requeue's verdict on the host, or (when a worker loop saw
    # Slurm's SIGTERM end its proc first) that death; the scheduler names the requeue either way
    wait_for(lambda e: not e["notice"], 60, "a failure of each rank", count=2)
    time.sleep(1)  # the scheduler's verdict on the second host, when a proc death came first
elif scenario == "slurmd":
    sys.stdin.readline()  # the test has killed the last node's slurmd
    wait_for(lambda e: "node failure on @LAST@" in e["cause"], 120, "failure naming @LAST@'s node failure")
    time.sleep(1)
    say("REST", h1=w.slice(hosts=0).where.call().get(timeout=60).values(),
        h2=w.slice(hosts=1).where.call().get(timeout=60).values(), table=hm.to_table())
say("EVENTS", events=events)
hm.shutdown().get(timeout=60)
'''.replace("@LAST@", H.N3)

TOML = f"""
[defaults]
scheduler = "slurm"
job_name = "{H.JOB_NAME}"
time = "00:05:00"

[hosts.cancel]
nodes = 2

[hosts.timelimit]
nodes = 2
time = 1
signal = "USR2@20"

[hosts.requeue]
nodes = 2
requeue = true

[hosts.slurmd]
nodes = 3
"""


class Client:
    """The program in a child interpreter, its output read as it comes."""

    def __init__(self, d: Path, scenario: str) -> None:
        self.p = subprocess.Popen([PY, "prog.py", scenario], cwd=d, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=H.env())
        self.out = LineReader(self.p.stdout, f"slurm-{scenario}")
        self.err = LineReader(self.p.stderr, f"slurm-{scenario}-err")

    def get(self, kind: str, timeout: float) -> dict:
        try:
            _, line = self.out.wait_for(lambda s: s if s.startswith(kind + " ") else None, timeout)
        except (EOFError, TimeoutError) as e:
            raise AssertionError(f"no {kind} line ({e}); rc {self.p.poll()}\nstdout:\n{self.out.text()[-3000:]}\n"
                                 f"stderr:\n{self.err.text()[-6000:]}") from None
        return json.loads(line[len(kind) + 1:])

    def finish(self, timeout: float = 90) -> int:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            raise AssertionError(f"the client did not end; stderr:\n{self.err.text()[-6000:]}") from None


@pytest.fixture
def project(cluster: Any, tmp_path: Path) -> Path:
    H.write_project(tmp_path, PROGRAM, TOML)
    return tmp_path


def _failures(events: list[dict]) -> list[dict]:
    return [e for e in events if not e["notice"]]


def test_a_job_cancelled_while_running_fails_every_host_saying_it_was_cancelled(project: Path) -> None:
    c = Client(project, "cancel")
    job = c.get("READY", H.CLIENT_TIMEOUT)["job"]
    events = c.get("EVENTS", 90)["events"]
    assert c.finish() == 0, c.err.text()[-4000:]
    fails = _failures(events)
    assert {e["proc"].rsplit(" ", 1)[-1] for e in fails} == {H.N1, H.N2}, events
    cancelled = f"Slurm job {job} was cancelled"
    # each rank failed, saying the cancel (the host's verdict) or how Slurm's cancel ended its
    # proc, when the worker loop's report of that came first (the SIGTERM and the scheduler's
    # word of the cancel travel separately: the same race as the requeue's, below)
    for e in fails:
        assert cancelled in e["cause"] or "killed by SIGTERM" in e["cause"], e
    err = c.err.text()
    for node in (H.N1, H.N2):  # and the scheduler's verdict on every host names the cancel
        assert f"reports host '{node}' lost: {cancelled}" in err, err[-3000:]
    assert "ProcessLookupError" not in err, err[-3000:]  # no node wrapper crashed forwarding the SIGTERM
    assert H.job_state(job) == "CANCELLED"


@pytest.mark.timeout(300)  # Slurm ends a 1-minute job 60-100 s in; the test waits up to 200 s for it
def test_the_time_limit_warns_first_then_fails_every_host_saying_so(project: Path) -> None:
    c = Client(project, "timelimit")
    job = c.get("READY", H.CLIENT_TIMEOUT)["job"]
    times = c.get("TIMES", 200)
    events = c.get("EVENTS", 30)["events"]
    assert c.finish() == 0, c.err.text()[-4000:]
    notices = [e for e in events if e["notice"]]
    assert len(notices) == 1, events
    assert f"Slurm job {job} will be preempted or end soon" in notices[0]["report"], notices
    assert "SIGUSR2" in notices[0]["report"] and "--signal=USR2@20" in notices[0]["report"], notices
    assert sorted(times["after_notice"]) == [H.N1, H.N2]  # the notice failed nothing
    assert times["notice_to_end"] > 5
    fails = _failures(events)
    assert {e["proc"].rsplit(" ", 1)[-1] for e in fails} == {H.N1, H.N2}, events
    limit = f"Slurm job {job} reached its time limit"
    assert all(limit in e["cause"] or e["cause"].startswith("lost contact with its process") for e in fails), events
    err = c.err.text()
    for node in (H.N1, H.N2):  # the scheduler's verdict on every host names the time limit
        assert f"reports host '{node}' lost: {limit}" in err, err[-3000:]
    assert H.job_state(job) == "TIMEOUT"


def test_a_requeued_job_fails_its_hosts_saying_so_and_is_kept_for_a_restarted_client(project: Path) -> None:
    c = Client(project, "requeue")
    job = c.get("READY", H.CLIENT_TIMEOUT)["job"]
    try:
        events = c.get("EVENTS", 90)["events"]
        assert c.finish() == 0, c.err.text()[-4000:]
        fails = _failures(events)
        requeued = f"Slurm job {job} was requeued"
        # each rank failed, saying the requeue (the host's verdict) or how Slurm's requeue ended
        # its proc, when the worker loop's report of that came first (a race the client cannot
        # order: the SIGTERM and srun's word of the requeue travel separately)
        assert len(fails) == 2 and all(requeued in e["cause"] or "killed by SIGTERM" in e["cause"]
                                       for e in fails), events
        err = c.err.text()
        for node in (H.N1, H.N2):  # and the scheduler's verdict on every host names the requeue
            assert f"reports host '{node}' lost: {requeued}" in err, err[-3000:]
        assert f"job_id = {job}" in err
        assert "is kept (requeue = true)" in err, err[-3000:]
        assert H.job_state(job) in ("PENDING", "REQUEUED", "RUNNING", "CONFIGURING")
    finally:
        H.run(["scancel", job], 30, env=H.env())


def test_a_killed_slurmd_fails_only_the_procs_of_its_node(project: Path, cluster: Any) -> None:
    c = Client(project, "slurmd")
    try:
        ready = c.get("READY", H.CLIENT_TIMEOUT)
        assert sorted(ready["where"]) == list(H.NODES)
        pid = int((RT_RUN / "pids" / f"slurmd-{H.N3}.pid").read_text())
        assert pid_alive(f"slurmd-{H.N3}")
        os.kill(pid, signal.SIGKILL)
        c.p.stdin.write("go\n")
        c.p.stdin.flush()
        rest = c.get("REST", 150)
        events = c.get("EVENTS", 30)["events"]
        assert c.finish() == 0, c.err.text()[-4000:]
    finally:
        cluster.restart()
        if c.p.poll() is None:
            c.p.kill()
    assert rest["h1"] == [H.N1] and rest["h2"] == [H.N2]
    fails = _failures(events)
    assert fails and {e["proc"].rsplit(" ", 1)[-1] for e in fails} == {H.N3}, events
    assert f"Slurm reports a node failure on {H.N3}" in fails[0]["cause"], fails
    assert f"LOST (Slurm reports a node failure on {H.N3}" in rest["table"], rest["table"]
