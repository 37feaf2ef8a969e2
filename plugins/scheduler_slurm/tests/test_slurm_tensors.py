"""Distributed tensors inside a real ``sbatch`` job on the Slurm testbed
(3 nodes, 2 procs each, no configuration file): collectives over the node
dimension, the local one and both; the module's ``cluster`` fixture checks
that nothing is left on the nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import slurm_helpers as H

pytest.importorskip("hostlist")
pytest.importorskip("torch")
pytest.importorskip("monarch_tensor_engine", reason="pip install -e plugins/tensor_engine (scripts/test.sh does)")

PROGRAM = r'''
import json
from pathlib import Path
import torch
import monarch_core as monarch
from monarch_core.actor import hosts_from_config

hm = hosts_from_config("nodes")          # no monarch.toml: the job's nodes
pm = hm.spawn_procs(per_host={"gpus": 2})
with pm.activate():
    r = pm.rank_tensor("hosts") * 2 + pm.rank_tensor("gpus")
    x = torch.ones(4) * r
    out = {
        "every": monarch.inspect(x.reduce(("hosts", "gpus"), "sum"), hosts=2, gpus=1).tolist(),
        "per_host": [monarch.inspect(x.reduce("gpus", "sum"), hosts=h).tolist()[0] for h in range(3)],
        "across": monarch.inspect(x.reduce("hosts", "stack"), hosts=1, gpus=1)[:, 0].tolist(),
    }
hm.shutdown().get(timeout=60)
(Path(__file__).resolve().parent / "results.json").write_text(json.dumps(out))
'''


def test_collectives_inside_an_sbatch_job_across_its_nodes(cluster: Any, tmp_path: Path) -> None:
    H.write_project(tmp_path, PROGRAM, None)
    _job, res = H.sbatch_wait(tmp_path, 3)
    out = H.results(tmp_path)
    assert out["every"] == [15.0] * 4
    assert out["per_host"] == [1.0, 5.0, 9.0]
    assert out["across"] == [1.0, 3.0, 5.0]
