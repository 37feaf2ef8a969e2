"""Per-proc devices: ``spawn_procs`` gives each proc one device of its host
(``CUDA_VISIBLE_DEVICES``), by its coordinate along ``gpus``.

There is no GPU on the machines these tests run on, so every check is
through the environment each proc sees (``CUDA_VISIBLE_DEVICES``, which CUDA
reads when a proc first uses it) and ``monarch_core.runtime.proc_devices()``,
never through ``torch.cuda``.  Real procs on this host (forked and exec'd),
real worker loops for the remote-host case, real tensor-engine workers.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re

import pytest

from monarch_core import runtime
from monarch_core._launch import _devices
from monarch_core.actor import Actor, default_bootstrap_cmd, endpoint, this_host

CUDA = "CUDA_VISIBLE_DEVICES"


class Devices(Actor):
    @endpoint
    def seen(self) -> tuple[str | None, runtime.ProcDevices | None]:
        return os.environ.get(CUDA), runtime.proc_devices()


def _seen(pm, meshes: list) -> list:  # type: ignore[no-untyped-def]
    meshes.append(pm)
    return pm.spawn("devices", Devices).seen.call().get(timeout=90).values()


@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This host's environment, without the device settings or a list of its own."""
    for name in (CUDA, "MONARCH_PROC_DEVICES", "MONARCH_DEVICE_DIMS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# ---------------------------------------------------------------- one device per proc


def test_each_proc_sees_the_device_of_its_gpus_coordinate(host_env: pytest.MonkeyPatch, meshes: list) -> None:
    got = _seen(this_host().spawn_procs(per_host={"gpus": 4}), meshes)
    assert [cvd for cvd, _ in got] == ["0", "1", "2", "3"]
    assert [d for _, d in got] == [runtime.ProcDevices("gpus", i, str(i), None) for i in range(4)]


def test_a_list_the_host_sets_is_remapped_entry_by_entry(host_env: pytest.MonkeyPatch, meshes: list) -> None:
    host_env.setenv(CUDA, "3,5, GPU-8f2a,7")
    got = _seen(this_host().spawn_procs(per_host={"gpus": 4}), meshes)
    assert [cvd for cvd, _ in got] == ["3", "5", "GPU-8f2a", "7"]
    assert {d.host_visible for _, d in got} == {"3,5, GPU-8f2a,7"}


def test_procs_past_the_hosts_devices_get_none_and_one_warning_says_how_to_fix_it(
    host_env: pytest.MonkeyPatch, meshes: list, caplog: pytest.LogCaptureFixture
) -> None:
    host_env.setenv(CUDA, "1,2")
    with caplog.at_level(logging.WARNING, logger="monarch.mesh"):
        got = _seen(this_host().spawn_procs(per_host={"gpus": 4}, name="toomany"), meshes)
    assert [cvd for cvd, _ in got] == ["1", "2", "", ""]
    warnings = [r.getMessage() for r in caplog.records if r.name == "monarch.mesh" and "device index" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per proc mesh and host, not once per proc
    assert "'toomany'" in warnings[0] and "2 device(s)" in warnings[0] and "along 'gpus'" in warnings[0]
    assert "MONARCH_PROC_DEVICES=0" in warnings[0] and "spawn at most 2" in warnings[0]


def test_the_setting_off_leaves_every_proc_the_hosts_devices(host_env: pytest.MonkeyPatch, meshes: list) -> None:
    host_env.setenv("MONARCH_PROC_DEVICES", "0")
    host_env.setenv(CUDA, "4,5")
    assert _seen(this_host().spawn_procs(per_host={"gpus": 2}), meshes) == [("4,5", None), ("4,5", None)]
    host_env.delenv(CUDA)
    assert _seen(this_host().spawn_procs(per_host={"gpus": 2}), meshes) == [(None, None), (None, None)]


def test_a_spawn_without_per_host_dimensions_leaves_devices_alone(host_env: pytest.MonkeyPatch,
                                                                  meshes: list) -> None:
    host_env.setenv(CUDA, "6,7")
    assert _seen(this_host().spawn_procs(), meshes) == [("6,7", None)]


# ---------------------------------------------------------------- which dimension


def test_two_per_host_dimensions_share_a_device_along_gpus_in_either_order(host_env: pytest.MonkeyPatch,
                                                                           meshes: list) -> None:
    gpus_first = _seen(this_host().spawn_procs(per_host={"gpus": 2, "share": 2}), meshes)
    assert [cvd for cvd, _ in gpus_first] == ["0", "0", "1", "1"]
    gpus_last = _seen(this_host().spawn_procs(per_host={"share": 2, "gpus": 2}), meshes)
    assert [cvd for cvd, _ in gpus_last] == ["0", "1", "0", "1"]
    gpu = _seen(this_host().spawn_procs(per_host={"replica": 2, "gpu": 2}), meshes)  # the reference's other name
    assert [(cvd, d.dim) for cvd, d in gpu] == [("0", "gpu"), ("1", "gpu"), ("0", "gpu"), ("1", "gpu")]


def test_without_a_device_dimension_a_proc_takes_its_position_on_its_host(host_env: pytest.MonkeyPatch,
                                                                          meshes: list) -> None:
    host_env.setenv(CUDA, "10,11,12,13")
    got = _seen(this_host().spawn_procs(per_host={"dp": 2, "tp": 2}), meshes)
    assert [(cvd, d.dim, d.index) for cvd, d in got] == [("10", None, 0), ("11", None, 1), ("12", None, 2),
                                                         ("13", None, 3)]


def test_the_device_dimension_is_configurable(host_env: pytest.MonkeyPatch, meshes: list) -> None:
    host_env.setenv("MONARCH_DEVICE_DIMS", "tp")
    got = _seen(this_host().spawn_procs(per_host={"dp": 2, "tp": 2}), meshes)
    assert [(cvd, d.dim) for cvd, d in got] == [("0", "tp"), ("1", "tp"), ("0", "tp"), ("1", "tp")]


# ---------------------------------------------------------------- what the user sets wins


def test_a_bootstrap_command_that_sets_or_removes_the_variable_wins(host_env: pytest.MonkeyPatch,
                                                                    meshes: list) -> None:
    host_env.setenv(CUDA, "0,1")
    mine = default_bootstrap_cmd().with_env({CUDA: "9"})
    assert _seen(this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=mine), meshes) == \
        [("9", None), ("9", None)]
    cleared = default_bootstrap_cmd().with_env({CUDA: None})
    assert _seen(this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=cleared), meshes) == \
        [(None, None), (None, None)]
    # an exec'd command that leaves the variable alone still gets its proc's device
    other = default_bootstrap_cmd().with_env({"MC_TEST_EXEC": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    assert [cvd for cvd, _ in _seen(this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=other),
                                    meshes)] == ["0", "1"]


# ---------------------------------------------------------------- remote hosts, nested spawns, the tensor engine


def test_procs_of_a_remote_host_are_mapped_through_that_hosts_list_not_the_clients(
    host_env: pytest.MonkeyPatch, configured_hosts, meshes: list  # type: ignore[no-untyped-def]
) -> None:
    host_env.setenv(CUDA, "2,3")  # what the worker loops start with
    hm = configured_hosts("pair", hosts=2)
    host_env.setenv(CUDA, "8,9")  # the client's, later: not the hosts'
    got = _seen(hm.spawn_procs(per_host={"gpus": 2}), meshes)
    assert [cvd for cvd, _ in got] == ["2", "3", "2", "3"]


class Nesting(Actor):
    @endpoint
    def children(self) -> list:
        self.pm = this_host().spawn_procs(per_host={"gpus": 2})
        return self.pm.spawn("devices", Devices).seen.call().get(timeout=90).values()


def test_a_proc_that_spawns_procs_shares_out_only_its_own_device(host_env: pytest.MonkeyPatch,
                                                                  meshes: list) -> None:
    host_env.setenv(CUDA, "4,5")
    meshes.append(pm := this_host().spawn_procs(per_host={"gpus": 2}))
    got = pm.spawn("nesting", Nesting).children.call().get(timeout=120).values()
    assert [[cvd for cvd, _ in kids] for kids in got] == [["4", ""], ["5", ""]]


def _visible_device(x):  # type: ignore[no-untyped-def]
    import torch

    return torch.full_like(x, int(os.environ[CUDA]))


def test_tensor_engine_workers_see_their_procs_device(host_env: pytest.MonkeyPatch, meshes: list) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("monarch_tensor_engine")
    import monarch_core as monarch

    meshes.append(mesh := this_host().spawn_procs(per_host={"dp": 2, "gpus": 2}))
    with mesh.activate():
        seen = monarch.remote(_visible_device, propagate=lambda x: x)(torch.zeros(()))
        got = {(dp, g): int(monarch.inspect(seen, dp=dp, gpus=g)) for dp in range(2) for g in range(2)}
    assert got == {(0, 0): 0, (0, 1): 1, (1, 0): 0, (1, 1): 1}


# ---------------------------------------------------------------- the docs


def test_the_example_of_the_configuration_docs_prints_what_it_says(client_script) -> None:  # type: ignore[no-untyped-def]
    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = text.split("## Devices of procs", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    done = client_script(block, env={CUDA: None, "MONARCH_PROC_DEVICES": None, "MONARCH_DEVICE_DIMS": None},
                         timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['0', '1', '2', '3']", done.stdout


# ---------------------------------------------------------------- the plan and the mapping, without procs


@pytest.mark.unit
def test_the_plan_reads_the_settings_and_the_mapping_the_hosts_list(host_env: pytest.MonkeyPatch) -> None:
    assert _devices.plan({}, 0) is None
    assert _devices.plan({"hosts_local": 2, "gpus": 3}, 5) == _devices.ProcDevices("gpus", 2)
    assert _devices.plan({"x": 3}, 2) == _devices.ProcDevices(None, 2)
    host_env.setenv("MONARCH_PROC_DEVICES", "off")
    assert _devices.plan({"gpus": 3}, 1) is None
    host_env.setenv("MONARCH_PROC_DEVICES", "maybe")
    with pytest.raises(Exception, match="MONARCH_PROC_DEVICES must be 0 or 1"):
        _devices.plan({"gpus": 3}, 1)
    planned = _devices.ProcDevices("gpus", 1)
    kw = dict(mesh="m", host="h", describe="proc m")
    assert _devices.assign(planned, {CUDA: "MIG-a,MIG-b"}, **kw) == \
        _devices.ProcDevices("gpus", 1, "MIG-b", "MIG-a,MIG-b")
    assert _devices.assign(planned, {CUDA: ""}, **kw).visible == ""  # the host hides every device
    env: dict[str, str] = {}
    assert _devices.apply(env, [{}, {"OTHER": "1"}], _devices.ProcDevices("gpus", 0, "3")) is not None
    assert env == {CUDA: "3"}
    env = {CUDA: "from a hook"}
    assert _devices.apply(env, [{}, {CUDA: "from a hook"}], _devices.ProcDevices("gpus", 0, "3")) is None
    assert env == {CUDA: "from a hook"}
