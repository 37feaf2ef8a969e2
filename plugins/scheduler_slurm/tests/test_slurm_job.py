"""``monarch_core.job.SlurmJob`` on the testbed's cluster: from the login
node (the root namespace) the first program submits the job and leaves it
running; a second program reattaches to the same Slurm job from
``.monarch/job_state.pkl`` and ``kill()`` cancels it; batch mode runs the
client inside the allocation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import slurm_helpers as H

pytest.importorskip("hostlist")

PROGRAM = f'''
import json, socket, sys
from monarch_core.actor import Actor, endpoint
from monarch_core.job import SlurmJob


class Where(Actor):
    @endpoint
    def where(self):
        return socket.gethostname()


job = SlurmJob({{"trainers": 1, "loaders": 1}}, time_limit="00:10:00", job_name="{H.JOB_NAME}")
state = job.state()
trainers = state.trainers.spawn_procs(per_host={{"gpus": 2}}).spawn("where", Where).where.call().get(timeout=120)
loaders = state.loaders.spawn_procs().spawn("where", Where).where.call().get(timeout=120)
print("RESULT " + json.dumps({{"job": job._running.job_id, "apply": job.apply_id, "trainers": trainers.values(),
                              "loaders": loaders.values()}}), flush=True)
if sys.argv[1] == "kill":
    job.kill()
'''


def _result(res: Any) -> dict:
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"no RESULT line; rc {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}")


def test_slurm_job_keeps_running_a_second_program_reattaches_and_kill_cancels(cluster: Any, netns: Any,
                                                                             tmp_path: Path) -> None:
    H.write_project(tmp_path, PROGRAM, None)
    first = H.client(tmp_path, "keep")
    assert first.returncode == 0, first.stderr[-6000:]
    one = _result(first)
    job = one["job"]
    assert one["trainers"] == [H.N1, H.N1] and one["loaders"] == [H.N2]
    assert H.job_state(job) == "RUNNING", "the job outlives the program that applied it"
    second = H.client(tmp_path, "kill")
    assert second.returncode == 0, second.stderr[-6000:]
    two = _result(second)
    assert two["job"] == job and two["apply"] == one["apply"], "the same Slurm job, from the saved state"
    assert two["trainers"] == [H.N1, H.N1] and two["loaders"] == [H.N2]
    assert H.wait_state(job, {"CANCELLED"}) == "CANCELLED"


BATCH_CLIENT = f'''
import json, os, socket
from monarch_core.actor import Actor, endpoint
from monarch_core.job import SlurmJob


class Where(Actor):
    @endpoint
    def where(self):
        return socket.gethostname()


job = SlurmJob({{"trainers": 2}}, job_name="{H.JOB_NAME}")
state = job.state()
where = state.trainers.spawn_procs().spawn("where", Where).where.call().get(timeout=120).values()
with open("results.json", "w") as f:
    json.dump({{"where": where, "job": os.environ.get("SLURM_JOB_ID")}}, f)
'''

BATCH = f'''
from monarch_core.job import SlurmJob

job = SlurmJob({{"trainers": 2}}, job_name="{H.JOB_NAME}")
job.apply(client_script="batch_client.py")
print("JOB", job.job_id, flush=True)
'''


def test_slurm_job_batch_mode_runs_the_client_in_the_allocation(cluster: Any, tmp_path: Path) -> None:
    H.write_project(tmp_path, BATCH, None)
    (tmp_path / "batch_client.py").write_text(BATCH_CLIENT)
    res = H.client(tmp_path)
    assert res.returncode == 0, res.stderr[-6000:]
    job = res.stdout.split("JOB ", 1)[1].split()[0]
    state = H.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=H.CLIENT_TIMEOUT)
    out = "".join(p.read_text() for p in tmp_path.glob("slurm_*.out"))
    assert state == "COMPLETED", out[-6000:]
    got = H.results(tmp_path)
    assert got == {"where": [H.N1, H.N2], "job": job}, out[-3000:]
