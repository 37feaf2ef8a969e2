"""SPMD ranks see devices as torchrun's workers do: ``spawn_procs`` gives each
proc one device (``CUDA_VISIBLE_DEVICES``), and torchrun's environment gives
a rank its host's list back, so that ``torch.cuda.set_device(LOCAL_RANK)``
and ``cuda:LOCAL_RANK`` name its device as under torchrun (which passes the
host's ``CUDA_VISIBLE_DEVICES`` through to every worker unchanged).

There is no GPU on the machines these tests run on, so the check is through
the environment each rank sees, never through ``torch.cuda``.
"""

from __future__ import annotations

import os

import pytest

from monarch_core.actor import Actor, endpoint, this_host
from monarch_core.runtime import ProcDevices
from monarch_core.spmd import setup_torch_elastic_env
from monarch_spmd._env import Layout, apply, torchrun_env

CUDA = "CUDA_VISIBLE_DEVICES"


class Env(Actor):
    @endpoint
    def get(self) -> tuple[str | None, str | None]:
        return os.environ.get(CUDA), os.environ.get("LOCAL_RANK")


def _ranks_see(pm, name: str) -> list:  # type: ignore[no-untyped-def]
    return pm.spawn(name, Env).get.call().get(timeout=90).values()


@pytest.mark.parametrize("host_list", ["4,6", None], ids=["host-list", "no-host-list"])
def test_ranks_get_their_hosts_devices_back_and_local_rank_names_theirs(
    host_list: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MONARCH_PROC_DEVICES", raising=False)
    monkeypatch.delenv("MONARCH_DEVICE_DIMS", raising=False)
    if host_list is None:
        monkeypatch.delenv(CUDA, raising=False)
    else:
        monkeypatch.setenv(CUDA, host_list)
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        own = ["4", "6"] if host_list else ["0", "1"]
        assert _ranks_see(pm, "before") == [(own[0], None), (own[1], None)]  # one device each, before torchrun's env
        am = setup_torch_elastic_env(pm)
        assert _ranks_see(pm, "after") == [(host_list, "0"), (host_list, "1")]  # torchrun's view: the host's, unchanged
        am.setup_env.call("127.0.0.1", 29500).get(timeout=60)  # again: the same
        assert _ranks_see(pm, "again") == [(host_list, "0"), (host_list, "1")]
    finally:
        pm.stop().get(timeout=60)


@pytest.mark.unit
def test_apply_restores_the_hosts_list_or_removes_the_variable_and_leaves_an_unassigned_proc_alone() -> None:
    env = torchrun_env(Layout(1, {"gpus": 2}), "h", 1)
    environ = {CUDA: "6"}
    apply(env, environ, devices=ProcDevices("gpus", 1, "6", "4,6"))
    assert environ[CUDA] == "4,6" and environ["LOCAL_RANK"] == "1"
    environ = {CUDA: "1"}
    apply(env, environ, devices=ProcDevices("gpus", 1, "1", None))
    assert CUDA not in environ
    environ = {CUDA: "2,3"}  # the command or a hook set it, or the setting is off: no assignment
    apply(env, environ, devices=None)
    assert environ[CUDA] == "2,3"
