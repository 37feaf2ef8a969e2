"""``monarch torchrun`` inside a real ``sbatch`` job on the Slurm testbed
(3 nodes, 2 procs each), with no configuration file: ``--hosts`` names any
host mesh and gets the job's nodes.  The DDP script gives exactly the
single-process parameters; a rank that exits 7 makes the command exit 7
inside the job; every rank's output reaches the job's output with its node;
the module's ``cluster`` fixture checks that nothing is left on the nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import slurm_helpers as H

# The first test's budget covers the module fixture's sbatch, which may take up to its own
# 460 s limit (two torchrun runs of at most 200 s each, and Slurm's scheduling), plus the test.
pytestmark = pytest.mark.timeout(600)

pytest.importorskip("hostlist")
pytest.importorskip("torch")

PROGRAMS = Path(__file__).resolve().parents[3] / "plugins" / "spmd" / "tests" / "programs"
TRAIN = str(PROGRAMS / "train_ddp.py")
MONARCH = Path(sys.executable).parent / "monarch"


@pytest.fixture(scope="module")
def job(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    d = tmp_path_factory.mktemp("sbatch-spmd")
    run = f"{MONARCH} torchrun --hosts trainers --nnodes 3 --nproc-per-node 2"
    script = (f"#!/bin/sh\ncd {d}\n"
              f"timeout -k 5 200 {run} {TRAIN} --sum --out {d}/ddp.json; echo $? > {d}/rc_ok\n"
              f"timeout -k 5 200 {run} {TRAIN} --exit-rank 3 --exit-code 7; echo $? > {d}/rc_fail\n")
    res = H.run(["sbatch", "--wait", "--parsable", "--nodes=3", f"--job-name={H.JOB_NAME}", f"--output={d}/out.txt"],
                460, input=script, env=H.env())
    return d, res


def test_a_ddp_job_in_sbatch_gives_exactly_the_single_process_parameters(job: Any) -> None:
    d, res = job
    out = (d / "out.txt").read_text() if (d / "out.txt").exists() else res.stderr
    assert (d / "rc_ok").read_text().strip() == "0", out[-4000:]
    single = d / "single.json"
    subprocess.run([sys.executable, TRAIN, "--single", "--sum", "--world", "6", "--out", str(single)], check=True,
                   timeout=120)
    assert json.loads((d / "ddp.json").read_text()) == json.loads(single.read_text())
    for node in H.NODES:  # every node's ranks printed, prefixed with the node
        assert f" {node}] rank " in out, out[-4000:]


def test_a_failing_rank_in_sbatch_makes_the_command_exit_with_its_status(job: Any) -> None:
    d, res = job
    out = (d / "out.txt").read_text()
    assert (d / "rc_fail").read_text().strip() == "7", out[-4000:]
    assert "first failure rank 3 {'hosts': 1, 'gpus': 1}: exit status 7" in out and f"on host {H.N2}" in out, out[-4000:]
