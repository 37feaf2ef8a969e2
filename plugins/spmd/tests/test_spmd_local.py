"""``monarch_core.spmd`` on real procs of this machine with real
``torch.distributed`` (gloo, CPU): DDP through ``SPMDActor.main`` gives
exactly the parameters of one process on the concatenated batches, every
rank's variables equal what torchrun sets for the same layout, scripts run
as ``__main__`` with their argv, and failures name the rank and the exit
status instead of hanging."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from monarch_core.actor import ActorError, this_host  # noqa: E402
from monarch_core.errors import SupervisionError  # noqa: E402
from monarch_core.spmd import AddrType, ScriptError, SPMDActor, setup_torch_elastic_env  # noqa: E402

from _helpers.clients import PY, child_env  # noqa: E402
from _helpers.config import configured_host_mesh  # noqa: E402

PROGRAMS = Path(__file__).resolve().parent / "programs"
TRAIN = str(PROGRAMS / "train_ddp.py")


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    yield pm
    pm.stop().get(timeout=60)


@pytest.fixture
def spmd(procs):
    """A fresh SPMDActor mesh with torchrun's environment on the 4 procs, and its rendezvous."""
    am = setup_torch_elastic_env(procs)
    addr, port = am.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
    yield am, addr, port
    am.stop().get(timeout=60)


def single_process(tmp_path: Path, world: int, *extra: str) -> dict:
    out = tmp_path / "single.json"
    subprocess.run([PY, TRAIN, "--single", "--world", str(world), "--out", str(out), *extra], check=True,
                   timeout=120, env=child_env())
    return json.loads(out.read_text())


def test_ddp_on_four_procs_gives_exactly_the_single_process_parameters(spmd, tmp_path: Path) -> None:
    am, addr, port = spmd
    out = tmp_path / "ddp.json"
    assert am.main.call(addr, port, [TRAIN, "--steps", "5", "--out", str(out)]).get(timeout=180).values() == [True] * 4
    ddp = json.loads(out.read_text())
    assert ddp == single_process(tmp_path, 4, "--steps", "5")  # bit for bit: the data are exact in float64
    assert ddp["weight"] != [[i / 8 for i in range(4)], [i / 8 for i in range(4, 8)]]  # and it did train


def test_the_rendezvous_on_a_local_transport_is_loopback_and_the_port_is_free_there(spmd) -> None:
    am, addr, port = spmd
    assert addr == "127.0.0.1"
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))  # free (nothing else took it meanwhile, on a quiet machine)
    addr6, _ = am.slice(gpus=0).get_host_port.call_one(AddrType.IPv4).get(timeout=60)
    assert addr6 == "127.0.0.1"


def test_a_script_runs_as_main_with_its_argv_and_the_next_run_can_initialize_again(spmd, tmp_path: Path) -> None:
    am, addr, port = spmd
    probe = str(PROGRAMS / "argv_probe.py")
    for run in range(2):  # the first run's process group was released: the second initializes again
        out = tmp_path / f"probe{run}"
        am.main.call(addr, port, [probe, str(out), "--x", str(run)]).get(timeout=120)
        seen = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(4)]
        assert all(s["argv"] == [probe, str(out), "--x", str(run)] for s in seen)
        assert all(s["name"] == "__main__" and s["path0"] == str(PROGRAMS) for s in seen)
        assert all(s["sum"] == 0 + 1 + 2 + 3 for s in seen)


@pytest.fixture(scope="module")
def hosts2(tmp_path_factory):
    """Two hosts of this machine (the built-in ``local`` scheduler, from a configuration file)."""
    hm = configured_host_mesh(tmp_path_factory.mktemp("spmd_cfg"), "spmd_two", hosts=2)
    yield hm
    hm.shutdown().get(timeout=60)


def test_torchruns_variables_equal_ours_for_two_hosts_of_two_procs(hosts2, tmp_path: Path) -> None:
    pm = hosts2.spawn_procs(per_host={"gpus": 2})
    try:
        am = setup_torch_elastic_env(pm)
        addr, port = am.slice(hosts=0, gpus=0).get_host_port.call_one(None).get(timeout=60)
        am.main.call(addr, port, [str(PROGRAMS / "envdump.py"), str(tmp_path / "ours")]).get(timeout=120)
    finally:
        pm.stop().get(timeout=60)
    ours = [json.loads((tmp_path / f"ours.{r}").read_text()) for r in range(4)]
    # the same layout under real torchrun: two nodes (static rendezvous on this machine) of two procs
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master_port = s.getsockname()[1]
    env = child_env({"OMP_NUM_THREADS": None})
    runs = [subprocess.Popen([PY, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(n),
                              "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                              str(master_port), str(PROGRAMS / "envdump.py"), str(tmp_path / "torchrun")],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for n in range(2)]
    for p in runs:
        assert p.wait(timeout=180) == 0, p.stderr.read() if p.stderr else ""
    theirs = [json.loads((tmp_path / f"torchrun.{r}").read_text()) for r in range(4)]
    differ = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"}  # chosen per run
    for r in range(4):
        assert {k: v for k, v in ours[r].items() if k not in differ} == \
               {k: v for k, v in theirs[r].items() if k not in differ}, r
        # rank 0's proc hosts the store, as torchrun's agent: every script is its client
        assert ours[r]["MASTER_ADDR"] == "127.0.0.1" and ours[r]["TORCHELASTIC_USE_AGENT_STORE"] == "True"


def test_a_raising_rank_and_an_exiting_rank_fail_the_call_naming_rank_and_status() -> None:
    # Procs of its own: after the failed attempt a peer's proc can stay busy tearing down its
    # process group (it once answered no heartbeat for 30 s), which must not fail the next test.
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        am = setup_torch_elastic_env(pm)
        addr, port = am.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
        with pytest.raises(ActorError) as info:
            am.main.call(addr, port, [TRAIN, "--fail-rank", "2", "--fail-step", "0"]).get(timeout=120)
        err = info.value.exception
        assert isinstance(err, ScriptError) and (err.rank, err.exit_code, err.collective) == (2, 1, False)
        assert "rank 2 on host" in str(err) and "exited with status 1" in str(err) and "fails at step 0" in str(err)
        assert "fails at step 0 on purpose" in str(info.value)  # the script's own traceback reaches the caller
        am.stop().get(timeout=60)  # its peers wait in a collective: stopping the actors ends the attempt
    finally:
        pm.stop().get(timeout=60)


def test_sys_exit_with_a_status_is_that_status_and_a_missing_script_says_where(procs, tmp_path: Path) -> None:
    am = setup_torch_elastic_env(procs)
    addr, port = am.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
    script = tmp_path / "exit.py"
    script.write_text("import sys, os\nsys.exit(int(os.environ['RANK']) + 3 if os.environ['RANK'] == '1' else 0)\n")
    with pytest.raises(ActorError) as info:
        am.main.call(addr, port, [str(script)]).get(timeout=60)
    assert (info.value.exception.rank, info.value.exception.exit_code) == (1, 4)
    with pytest.raises(ActorError, match=r"the script 'nope/train\.py' does not exist there.*sync_workspace"):
        am.main.call(addr, port, ["nope/train.py"]).get(timeout=60)
    with pytest.raises(ActorError, match="No script or module specified"):
        am.main.call(addr, port, []).get(timeout=60)
    ok = tmp_path / "ok.py"
    ok.write_text("import sys\nsys.exit(0)\n")
    assert am.main.call(addr, port, [str(ok)]).get(timeout=60).values() == [True] * 4


def test_a_sigkilled_rank_fails_the_call_and_its_peers_collectives_instead_of_hanging(procs, faults,
                                                                                     tmp_path: Path) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 3})
    ready = tmp_path / "joined"
    try:
        am = setup_torch_elastic_env(pm)
        addr, port = am.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
        argv = [TRAIN, "--hang-rank", "2", "--steps", "100000", "--ready-file", str(ready)]
        futs = [am.slice(gpus=r).main.call_one(addr, port, argv) for r in range(3)]
        pid = _pid_of(pm, 2)
        deadline = time.monotonic() + 120
        while not ready.exists():  # every rank has joined: ranks 0 and 1 hold gloo connections to rank 2
            assert time.monotonic() < deadline, "rank 2 never joined the process group"
            assert not any(f.done() for f in futs), [f.get() for f in futs if f.done()]
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(SupervisionError, match="SIGKILL"):
            futs[2].get(timeout=60)
        for f in futs[:2]:
            with pytest.raises(ActorError) as info:
                f.get(timeout=60)  # bounded by the peers' own connection loss, not gloo's 30 min timeout
            assert info.value.exception.collective is True
    finally:
        pm.stop().get(timeout=60)


def _pid_of(pm, rank: int) -> int:  # type: ignore[no-untyped-def]
    from monarch_core.actor import Actor, endpoint

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    return pm.slice(gpus=rank).spawn("pid", Pid).pid.call_one().get(timeout=60)


def test_an_spmd_mesh_needs_a_dimension_and_master_needs_both_halves(procs) -> None:
    with pytest.raises(ValueError, match="at least one dimension"):
        setup_torch_elastic_env(this_host().spawn_procs())
    with pytest.raises(ValueError, match="give both master_addr and master_port"):
        setup_torch_elastic_env(procs, master_port=29500)


LIFECYCLE = str(PROGRAMS / "lifecycle.py")


def _lifecycle(out: Path, rank: int) -> dict:
    return json.loads(Path(f"{out}.{rank}.json").read_text())


def test_a_rank_runs_as_a_process_of_its_own_main_thread_atexit_at_its_end_no_module_state_kept(
        tmp_path: Path) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        am = setup_torch_elastic_env(procs)
        addr, port = am.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
        _two_runs(am, addr, port, procs, tmp_path)
    finally:
        procs.stop().get(timeout=60)


def _two_runs(am, addr: str, port: int, procs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pids = set()
    for run in range(2):  # the same actors twice: nothing of the first run is left in the second
        out = tmp_path / f"run{run}"
        assert am.main.call(addr, port, [LIFECYCLE, str(out)]).get(timeout=120).values() == [True] * 2
        for r in range(2):
            seen = _lifecycle(out, r)
            assert seen["main_thread"] is True  # signal.signal worked: it installed its SIGTERM handler
            assert seen["runs"] == 1  # the module global counts from 0 again: a fresh interpreter
            pids.add(seen["pid"])
            # its atexit handler ran when the script ended, before the call returned (not when the proc stops)
            assert Path(f"{out}.{r}.atexit").read_text() == f"rank {r} pid {seen['pid']} exits\n"
            assert not Path(f"{out}.{r}.sigterm").exists()
    assert len(pids) == 4 and not pids & _proc_pids(procs)  # a process of its own per rank and run


def _proc_pids(pm) -> set[int]:  # type: ignore[no-untyped-def]
    from monarch_core.actor import Actor, endpoint

    class Pid(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

    mesh = pm.spawn("proc_pids", Pid)
    try:
        return set(mesh.pid.call().get(timeout=60).values())
    finally:
        mesh.stop().get(timeout=60)


def test_stopping_the_procs_sends_each_ranks_script_sigterm_and_its_handler_runs(tmp_path: Path) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    out = tmp_path / "stop"
    try:
        am = setup_torch_elastic_env(pm)
        addr, port = am.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
        futs = [am.slice(gpus=r).main.call_one(addr, port, [LIFECYCLE, str(out), "--wait"]) for r in range(2)]
        deadline = time.monotonic() + 120
        while not all(Path(f"{out}.{r}.ready").exists() for r in range(2)):
            assert time.monotonic() < deadline, "the ranks never got ready"
            assert not any(f.done() for f in futs), [f.get() for f in futs if f.done()]
            time.sleep(0.05)
        pids = [_lifecycle(out, r)["pid"] for r in range(2)]
    finally:
        pm.stop().get(timeout=60)
    for r in range(2):  # the handler ran (a checkpoint), then the script's atexit, and the process is gone
        assert Path(f"{out}.{r}.sigterm").read_text() == f"checkpoint of rank {r} on signal {int(signal.SIGTERM)}\n"
        assert Path(f"{out}.{r}.atexit").read_text() == f"rank {r} pid {pids[r]} exits\n"
        with pytest.raises(ProcessLookupError):
            os.kill(pids[r], 0)


def test_a_ranks_script_sees_its_hosts_devices_as_under_torchrun(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("MONARCH_PROC_DEVICES", raising=False)
    monkeypatch.delenv("MONARCH_DEVICE_DIMS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # each proc gets one of them; the script, both
    script = tmp_path / "devices.py"
    script.write_text("import os, sys\nopen(sys.argv[1] + '.' + os.environ['RANK'], 'w').write("
                      "os.environ.get('CUDA_VISIBLE_DEVICES', '-') + ' ' + os.environ['LOCAL_RANK'])\n")
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        am = pm.spawn("_SPMDActor", SPMDActor)  # as launch (monarch torchrun): main alone sets the environment
        addr, port = am.slice(gpus=0).get_host_port.call_one(None).get(timeout=60)
        am.main.call(addr, port, [str(script), str(tmp_path / "seen")]).get(timeout=120)
    finally:
        pm.stop().get(timeout=60)
    assert [(tmp_path / f"seen.{r}").read_text() for r in range(2)] == ["4,6 0", "4,6 1"]
