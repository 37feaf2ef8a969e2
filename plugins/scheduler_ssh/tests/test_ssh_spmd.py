"""``monarch_core.spmd`` across three SSH hosts (h1..h3, real sshd in each
namespace) with two procs each: the DDP script through
``setup_torch_elastic_env`` + ``SPMDActor.main`` gives exactly the
single-process parameters, the rendezvous is an address of h1 the other
hosts reach (never loopback), and ``monarch torchrun --hosts`` with a
failing rank exits with its status and leaves nothing on any host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import ssh_helpers as H

pytest.importorskip("torch")

HOSTS = ("h1", "h2", "h3")
PROGRAMS = Path(__file__).resolve().parents[3] / "plugins" / "spmd" / "tests" / "programs"
TRAIN = str(PROGRAMS / "train_ddp.py")

PRELUDE = r'''
import json, os, socket
from monarch_core.actor import hosts_from_config
from monarch_core.spmd import setup_torch_elastic_env
hm = hosts_from_config("lab")
pm = hm.spawn_procs(per_host={"gpus": 2})
am = setup_torch_elastic_env(pm)
'''


@pytest.fixture(scope="module")
def lab(sshd: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("ssh-spmd")
    tag = H.new_tag()
    H.write_config(d, {"lab": H.entry(tag, d, hosts=list(HOSTS))})
    client = H.Client(PRELUDE, cwd=d, env={"MONARCH_CONFIG": str(d / "monarch.toml")})
    try:
        yield {"client": client, "tag": tag, "dir": d}
    finally:
        client.close()
        H.wait_tagged_gone(tag, (1, 2, 3))


def test_ddp_on_three_hosts_of_two_procs_gives_exactly_the_single_process_parameters(lab: Any, tmp_path: Path) -> None:
    out = tmp_path / "ddp.json"
    got = lab["client"].run(f"""
        addr, port = am.slice(hosts=0, gpus=0).get_host_port.call_one(None).get(timeout=60)
        ok = am.main.call(addr, port, [{TRAIN!r}, "--sum", "--out", {str(out)!r}]).get(timeout=240).values()
        result = [addr, port, ok]
    """, timeout=300)
    addr, _, ok = got
    assert ok == [True] * 6
    assert addr == "10.250.0.11", addr  # h1's address on the hosts' network, where its proc listens
    single = tmp_path / "single.json"
    subprocess.run([sys.executable, TRAIN, "--single", "--sum", "--world", "6", "--out", str(single)], check=True, timeout=120)
    assert json.loads(out.read_text()) == json.loads(single.read_text())


def test_every_rank_gets_its_host_and_local_rank(lab: Any, tmp_path: Path) -> None:
    out = tmp_path / "env"
    lab["client"].run(f"""
        addr, port = am.slice(hosts=0, gpus=0).get_host_port.call_one(None).get(timeout=60)
        am.main.call(addr, port, [{str(PROGRAMS / "envdump.py")!r}, {str(out)!r}]).get(timeout=120)
    """, timeout=180)
    envs = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(6)]
    assert [(e["GROUP_RANK"], e["LOCAL_RANK"]) for e in envs] == [(str(r // 2), str(r % 2)) for r in range(6)]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_WORLD_SIZE"], e["MASTER_ADDR"]) for e in envs} == {
        ("6", "2", "3", "10.250.0.11")}


def test_the_command_across_hosts_exits_with_the_failing_ranks_status_and_leaves_nothing(sshd: Any,
                                                                                       tmp_path: Path) -> None:
    tag = H.new_tag()
    H.write_config(tmp_path, {"lab": H.entry(tag, tmp_path, hosts=list(HOSTS))})
    env = H._clients.child_env({"MONARCH_CONFIG": str(tmp_path / "monarch.toml")}, drop=("MONARCH_",))
    res = subprocess.run([sys.executable, "-m", "monarch_core.cli", "torchrun", "--hosts", "lab", "--nnodes", "3",
                          "--nproc-per-node", "2", TRAIN, "--exit-rank", "4", "--exit-code", "7"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    H.wait_tagged_gone(tag, (1, 2, 3))  # nothing of it on any host
    assert res.returncode == 7, out[-4000:]
    assert "first failure rank 4 {'hosts': 2, 'gpus': 0}: exit status 7" in out, out[-4000:]
    assert "on host h3" in out, out[-4000:]
    for h in HOSTS:  # every rank's output came back, prefixed with its host
        assert f" {h}] rank " in out, out[-4000:]


def test_a_sigkilled_rank_on_another_host_ends_the_command_with_137_and_leaves_nothing(sshd: Any,
                                                                                       tmp_path: Path) -> None:
    import os
    import re
    import signal

    from _helpers.clients import LineReader

    tag = H.new_tag()
    H.write_config(tmp_path, {"lab": H.entry(tag, tmp_path, hosts=list(HOSTS))})
    env = H._clients.child_env({"MONARCH_CONFIG": str(tmp_path / "monarch.toml")}, drop=("MONARCH_",))
    p = subprocess.Popen([sys.executable, "-m", "monarch_core.cli", "torchrun", "--hosts", "lab", "--nproc-per-node",
                          "2", TRAIN, "--hang-rank", "3", "--steps", "100000"], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = LineReader(p.stdout, "torchrun-ssh")
    try:
        _, m = reader.wait_for(lambda s: re.search(r"h2\] rank 3 pid (\d+) waits to be killed", s), 240)
        os.kill(int(m.group(1)), signal.SIGKILL)  # the namespace hosts share this machine's pid space
        rc = p.wait(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    reader.join(30)
    H.wait_tagged_gone(tag, (1, 2, 3))
    out = reader.text()
    assert rc == 128 + signal.SIGKILL, out[-4000:]
    assert "first failure rank 3 {'hosts': 1, 'gpus': 1}: exit status 137" in out, out[-4000:]
