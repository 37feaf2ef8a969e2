"""Distributed tensors across three SSH hosts (h1..h3, real sshd, TLS) with
two procs each: element-wise work and collectives over the host dimension,
the local one and both, whose groups meet through the first proc's store at
its address on the hosts' network (gloo bound to each proc's own address)."""

from __future__ import annotations

from typing import Any

import pytest
import ssh_helpers as H

pytest.importorskip("torch")
pytest.importorskip("monarch_tensor_engine", reason="pip install -e plugins/tensor_engine (scripts/test.sh does)")

HOSTS = ("h1", "h2", "h3")

PRELUDE = r'''
import torch
import monarch_core as monarch
from monarch_core.actor import hosts_from_config
hm = hosts_from_config("lab")
pm = hm.spawn_procs(per_host={"gpus": 2})
'''


@pytest.fixture(scope="module")
def lab(sshd: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("ssh-tensors")
    tag = H.new_tag()
    H.write_config(d, {"lab": H.entry(tag, d, hosts=list(HOSTS))})
    client = H.Client(PRELUDE, cwd=d, env={"MONARCH_CONFIG": str(d / "monarch.toml")})
    try:
        yield client
    finally:
        client.close()
        H.wait_tagged_gone(tag, (1, 2, 3))


def test_collectives_across_hosts_over_each_subset_of_dimensions(lab: Any) -> None:
    out = lab.run("""
        with pm.activate():
            r = pm.rank_tensor("hosts") * 2 + pm.rank_tensor("gpus")
            x = torch.ones(4) * r
            every = x.reduce(("hosts", "gpus"), "sum")
            per_host = x.reduce("gpus", "sum")
            across = x.reduce("hosts", "stack")
            result = {
                "every": monarch.inspect(every, hosts=2, gpus=1).tolist(),
                "per_host": [monarch.inspect(per_host, hosts=h, gpus=0).tolist()[0] for h in range(3)],
                "across": monarch.inspect(across, hosts=1, gpus=1)[:, 0].tolist(),
            }
    """, timeout=240)
    assert out["every"] == [15.0] * 4            # 0+1+...+5
    assert out["per_host"] == [1.0, 5.0, 9.0]     # (0+1), (2+3), (4+5)
    assert out["across"] == [1.0, 3.0, 5.0]       # gpus=1 on h1, h2, h3


def test_a_pipeline_between_hosts_and_a_reduction_on_a_comms_stream(lab: Any) -> None:
    out = lab.run("""
        stages = [pm.slice(hosts=h) for h in range(3)]     # one stage per host
        with stages[0].activate():
            h = (torch.arange(3.0) + stages[0].rank_tensor("gpus")).to_mesh(stages[1])   # h1 -> h2, over gloo
        with stages[1].activate():
            h = (h * 10).to_mesh(stages[2])                                              # h2 -> h3
        with stages[2].activate():
            piped = [monarch.inspect(h, gpus=g).tolist() for g in range(2)]
        comms = monarch.Stream("comms")
        with pm.activate():
            g = torch.ones(2) * (pm.rank_tensor("hosts") + 1)
            rg, borrow = comms.borrow(g, mutable=True)
            with comms.activate():
                rg.reduce_("hosts", "sum")
            borrow.drop()
            result = {"piped": piped, "reduced": monarch.inspect(g * 1, hosts=2, gpus=1).tolist()}
    """, timeout=240)
    assert out["piped"] == [[0.0, 10.0, 20.0], [10.0, 20.0, 30.0]]
    assert out["reduced"] == [6.0, 6.0]            # 1+2+3, on the comms stream's own group
