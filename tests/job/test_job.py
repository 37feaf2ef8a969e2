"""``monarch_core.job`` end to end, each program a real child interpreter in
a fresh folder: ``LocalJob`` and ``ProcessJob`` meshes spawn procs and
actors; a second program reattaches to the worker loops the first one
started (same pids, same apply id, from ``.monarch/job_state.pkl``);
``kill()`` and ``monarch kill`` leave nothing running; ``monarch apply``;
batch mode; ``spmd.serve(...).run_spmd()`` with a torch.distributed (gloo)
script; ``enable_admin`` / ``enable_telemetry`` URLs that answer HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from _helpers.clients import PY, child_env
from _helpers.procs import pid_running, wait_pids_gone

TIMEOUT = 240

ACTOR = '''
import json, os, sys
from monarch_core.actor import Actor, endpoint


class Who(Actor):
    @endpoint
    def who(self):
        return os.getpid()

    @endpoint
    def lineage(self):
        """This proc's pid and its ancestors' (by /proc)."""
        out, pid = [os.getpid()], os.getpid()
        while pid > 1:
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            out.append(pid)
        return out
'''


def _result(out: Any) -> dict:
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"no RESULT line; rc {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")




def _monarch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "monarch_core.cli", *args], cwd=tmp_path, env=child_env(path=[tmp_path]),
                          capture_output=True, text=True, timeout=TIMEOUT)


LOCAL = ACTOR + '''
from monarch_core.job import LocalJob

job = LocalJob(("trainers", "loaders"))
state = job.state()
pm = state.trainers.spawn_procs(per_host={"gpus": 2})
pids = pm.spawn("who", Who).who.call().get(timeout=60).values()
loaders = state.loaders.spawn_procs().spawn("who", Who).who.call().get(timeout=60).values()
try:
    state.evaluators
except AttributeError as e:
    missing = str(e)
print("RESULT " + json.dumps({"procs": pids, "loaders": loaders, "missing": missing,
                              "saved": os.path.exists(".monarch/job_state.pkl")}), flush=True)
job.kill()
print("RESULT " + json.dumps({"after": [p for p in pids + loaders if os.path.exists(f"/proc/{p}")]}), flush=True)
'''


def test_local_job_meshes_are_this_host_and_kill_stops_their_procs(client_script: Any) -> None:
    out = client_script(LOCAL, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-6000:]
    lines = [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    first, after = lines
    assert len(set(first["procs"])) == 2 and len(first["loaders"]) == 1
    assert first["missing"] == "'evaluators' is not a valid host mesh name. Available names: loaders, trainers"
    assert first["saved"]
    assert wait_pids_gone(first["procs"] + first["loaders"], timeout=30) == []


PROCESS = ACTOR + '''
from monarch_core.job import ProcessJob

job = ProcessJob({"trainers": 2, "loaders": 1})
state = job.state()
pm = state.trainers.spawn_procs(per_host={"gpus": 2})
lines = pm.spawn("who", Who).lineage.call().get(timeout=60).values()
loader_lines = state.loaders.spawn_procs().spawn("who", Who).lineage.call().get(timeout=60).values()
print("RESULT " + json.dumps({"apply": job.apply_id, "workers": job._running.worker_pids,
                              "procs": [x[0] for x in lines], "loaders": [x[0] for x in loader_lines],
                              "lineage": lines + loader_lines}), flush=True)
if sys.argv[1:] == ["kill"]:
    job.kill()
'''


def test_process_job_reattaches_from_the_saved_state_and_monarch_kill_ends_it(client_script: Any,
                                                                             tmp_path: Path) -> None:
    first = client_script(PROCESS, timeout=TIMEOUT)
    assert first.returncode == 0, first.stderr[-6000:]
    one = _result(first)
    workers = one["workers"]
    try:
        assert sorted(workers) == ["loaders_0", "trainers_0", "trainers_1"]
        assert all(pid_running(p) for p in workers.values()), "the worker loops outlive the first program"
        for line in one["lineage"][:4]:  # each trainer proc runs under a trainer host's worker loop
            assert {workers["trainers_0"], workers["trainers_1"]} & set(line[1:]), f"{line}: not a worker's"
        assert workers["loaders_0"] in one["lineage"][4][1:]
        assert wait_pids_gone(one["procs"] + one["loaders"], timeout=30) == [], "a client's procs end with it"
        assert (tmp_path / ".monarch" / "job_state.pkl").exists()

        second = client_script(PROCESS, timeout=TIMEOUT)
        assert second.returncode == 0, second.stderr[-6000:]
        two = _result(second)
        assert two["workers"] == workers and two["apply"] == one["apply"], "the second run reattached"
        assert not set(two["procs"]) & set(one["procs"])
        assert workers["loaders_0"] in two["lineage"][4][1:]
    finally:
        killed = _monarch(tmp_path, "kill")
    assert killed.returncode == 0 and "Killed job" in killed.stdout, killed.stderr[-3000:]
    assert wait_pids_gone(list(workers.values()), timeout=30) == []
    assert not (tmp_path / ".monarch" / "job_state.pkl").exists()
    again = _monarch(tmp_path, "kill")
    assert again.returncode == 1 and "no job saved here" in again.stderr


def test_monarch_apply_then_a_program_attaches_and_kill_leaves_nothing(client_script: Any, tmp_path: Path) -> None:
    (tmp_path / "myjob.py").write_text("from monarch_core.job import ProcessJob\n"
                                       "job = ProcessJob({'trainers': 2, 'loaders': 1})\n")
    applied = _monarch(tmp_path, "apply", "myjob.job")
    assert applied.returncode == 0, applied.stderr[-6000:]
    assert "Job is ready" in applied.stdout and "trainers: 2 host(s)" in applied.stdout
    out = client_script(PROCESS, "kill", timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-6000:]
    res = _result(out)
    assert res["apply"] in applied.stdout, "the program used the job monarch apply started"
    everything = list(res["workers"].values()) + res["procs"] + res["loaders"]
    assert wait_pids_gone(everything, timeout=30) == []
    bad = _monarch(tmp_path, "apply", "myjob.nothing")
    assert bad.returncode == 2 and "has no attribute 'nothing'" in bad.stderr


BATCH_CLIENT = ACTOR + '''
from monarch_core.job import LocalJob

state = LocalJob().state()
names = sorted(state._hosts)
pid = state.batch_launched_hosts.spawn_procs().spawn("who", Who).who.call_one().get(timeout=60)
print("RESULT " + json.dumps({"names": names, "batch": os.environ.get("MONARCH_BATCH_JOB"), "pid": pid}),
      flush=True)
'''

BATCH = '''
import sys
from monarch_core.job import LocalJob

job = LocalJob(("batch_launched_hosts",))
job.apply(client_script="batch_client.py")
print("RC", job.process.wait(timeout=200), job._log_dir, flush=True)
'''


def test_batch_mode_runs_the_client_script_against_the_job(client_script: Any, tmp_path: Path) -> None:
    (tmp_path / "batch_client.py").write_text(textwrap.dedent(BATCH_CLIENT))
    out = client_script(BATCH, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-6000:]
    rc, log_dir = out.stdout.split("RC ", 1)[1].split()
    stdout = (tmp_path / log_dir / "stdout.log").read_text()
    assert rc == "0", stdout + (tmp_path / log_dir / "stderr.log").read_text()
    res = json.loads(stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert res["names"] == ["batch_launched_hosts"] and res["batch"] == "1" and res["pid"] > 0


TRAIN = '''
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.txt"), "w") as f:
    f.write(f"{dist.get_world_size()} {t.item()} {os.environ['LOCAL_RANK']}")
dist.destroy_process_group()
'''

SPMD = '''
import sys
from monarch_core.job import job_load
from monarch_core.job.spmd import serve

if sys.argv[1] == "serve":
    job = serve(["torchrun", "--nproc-per-node=2", "--standalone", "train.py", sys.argv[2]], scheduler="process")
else:
    job = job_load(".monarch/job_state.pkl")
print("ATTEMPTS", job.run_spmd(), flush=True)
print("WORKERS", sorted(job._job._running.worker_pids.values()), flush=True)
if sys.argv[1] == "again":
    job.kill()
'''


@pytest.mark.timeout(600)
def test_spmd_serve_runs_a_gloo_script_and_a_second_program_reruns_it_on_the_same_hosts(
        client_script: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(textwrap.dedent(TRAIN))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    first = client_script(SPMD, "serve", str(out_dir), timeout=TIMEOUT)
    assert first.returncode == 0, first.stderr[-6000:]
    assert "ATTEMPTS 1" in first.stdout
    ranks = sorted(p.read_text() for p in out_dir.glob("rank*.txt"))
    assert ranks == ["2 3.0 0", "2 3.0 1"]
    workers = first.stdout.split("WORKERS ", 1)[1].splitlines()[0]
    for p in out_dir.glob("rank*.txt"):
        p.unlink()
    second = client_script(SPMD, "again", str(out_dir), timeout=TIMEOUT)
    assert second.returncode == 0, second.stderr[-6000:]
    assert second.stdout.split("WORKERS ", 1)[1].splitlines()[0] == workers, "the same hosts, not new ones"
    assert sorted(p.read_text() for p in out_dir.glob("rank*.txt")) == ["2 3.0 0", "2 3.0 1"]
    assert wait_pids_gone(json.loads(workers), timeout=30) == []


ADMIN = '''
import json, sys, urllib.request
from monarch_core.job import LocalJob, ProcessJob, TelemetryConfig

job = ProcessJob({"trainers": 1}).enable_admin()
state = job.state(cached_path=None)
# the token in the URL becomes a cookie (a redirect): a browser's way, with a cookie jar
opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
status = opener.open(state.admin_url, timeout=30).status
other = LocalJob().enable_telemetry(TelemetryConfig(dashboard_port=0, include_dashboard=True))
s2 = other.state(cached_path=None)
page = opener.open(s2.dashboard_url, timeout=30).read().decode()
print("RESULT " + json.dumps({"admin": state.admin_url, "status": status, "dashboard": s2.dashboard_url,
                              "telemetry": s2.telemetry_url, "page": "monarch" in page.lower(),
                              "plain": LocalJob().state(cached_path=None).admin_url}), flush=True)
job.kill()
'''


def test_enable_admin_gives_an_admin_url_that_answers_on_loopback(client_script: Any) -> None:
    pytest.importorskip("monarch_dashboard")
    out = client_script(ADMIN, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-6000:]
    res = _result(out)
    assert res["admin"].startswith("http://127.0.0.1:") and "token=" in res["admin"] and res["status"] == 200
    assert res["dashboard"] == res["telemetry"] == res["admin"], "one dashboard per client"
    assert res["page"] and res["plain"] is None


def test_enable_admin_without_the_dashboard_says_what_to_install(client_script: Any) -> None:
    out = client_script("from monarch_core.job import LocalJob\nLocalJob().enable_admin().state(cached_path=None)\n",
                        env={"MONARCH_DISABLED_PLUGINS": "dashboard"}, timeout=TIMEOUT)
    assert out.returncode != 0 and "MONARCH_DISABLED_PLUGINS turns off" in out.stderr, out.stderr[-3000:]


KILL_WHILE_CALLING = '''
import asyncio, time
from monarch_core.actor import Actor, endpoint
from monarch_core.job import ProcessJob

class Waiter(Actor):
    def __init__(self):
        self.asked = 0

    @endpoint
    async def ask(self, i: int) -> int:
        self.asked += 1
        return i

    @endpoint
    async def count(self) -> int:
        return self.asked

class Caller(Actor):
    @endpoint
    async def run(self, waiter) -> None:
        i = 0
        while True:  # until its proc stops: a call to the waiter stopped first raises here
            await waiter.ask.call_one(i)
            i += 1
            await asyncio.sleep(0.005)

job = ProcessJob({"hosts": 1})
hosts = job.state(cached_path=None).hosts
waiter = hosts.spawn_procs(name="w").spawn("waiter", Waiter)
callers = hosts.spawn_procs(per_host={"r": 3}, name="c").spawn("callers", Caller)
callers.run.broadcast(waiter)
deadline = time.monotonic() + 120
while waiter.count.call_one().get(timeout=60) < 30 and time.monotonic() < deadline:
    time.sleep(0.1)
job.kill()
print("killed", flush=True)
'''


def test_kill_while_actors_call_each_other_reports_no_failure(client_script: Any) -> None:
    # the reference's dining_philosophers.py: job.kill() stops every proc at once; an actor whose peer's
    # proc stopped first fails calling it, and that failure, a consequence of the kill, is no news to
    # the program that asked for the kill (no warning, no traceback in its output)
    out = client_script(KILL_WHILE_CALLING, timeout=TIMEOUT)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    assert "killed" in out.stdout
    assert "Traceback" not in text and "failure of actor" not in text, text[-6000:]
