"""``monarch_core.spmd`` without processes: torchrun's variables from a mesh
position, the rendezvous address from a transport address, argument checks,
the command's usage errors (all before any proc starts), and the façade over
the monarch-spmd plugin (``monarch torchrun`` without it says what to
install)."""

from __future__ import annotations

import argparse
import socket

import pytest

import monarch_core.spmd as spmd
from monarch_core import cli, hookspecs, runtime
from monarch_core.runtime import AddrType, master_address, transport_host
from monarch_core.spmd import setup_torch_elastic_env
from monarch_spmd import _command, api
from monarch_spmd._env import Layout, apply, torchrun_env
from monarch_spmd._script import ScriptError, ScriptOptions, check_argv, command, exit_status, parse_std, std_for

pytestmark = pytest.mark.unit


def test_three_hosts_by_two_procs_give_torchruns_numbers_for_every_rank() -> None:
    sizes = {"hosts": 3, "gpus": 2}
    got = [torchrun_env(Layout(r, sizes), "10.0.0.1", 29500) for r in range(6)]
    for r, env in enumerate(got):
        assert env["RANK"] == env["ROLE_RANK"] == str(r)
        assert env["LOCAL_RANK"] == str(r % 2) and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == str(r // 2) and env["GROUP_WORLD_SIZE"] == "3"
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "6"
        assert env["ROLE_NAME"] == "default" and env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29500"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # rank 0 hosts the store: env:// works unchanged


def test_the_last_dimension_is_the_local_one_whatever_its_name_and_more_dimensions_enumerate_hosts() -> None:
    layout = Layout(5, {"dc": 2, "rack": 2, "procs": 2})
    assert (layout.local_rank, layout.group_rank, layout.group_world_size, layout.world_size) == (1, 2, 4, 8)
    one = Layout(0, {"gpus": 4})
    assert (one.local_world_size, one.group_world_size) == (4, 1)


def test_a_mesh_with_no_dimension_and_bad_rendezvous_values_are_refused_saying_what_to_do() -> None:
    with pytest.raises(ValueError, match="at least one dimension.*per_host"):
        Layout(0, {})
    with pytest.raises(ValueError, match="master_port must be a port number"):
        torchrun_env(Layout(0, {"gpus": 1}), "h", 0)
    with pytest.raises(ValueError, match="master_addr must be"):
        torchrun_env(Layout(0, {"gpus": 1}), "", 29500)


def test_omp_threads_is_set_to_one_only_for_several_procs_per_host_and_never_overrides() -> None:
    env: dict[str, str] = {}
    apply(torchrun_env(Layout(0, {"gpus": 2}), "h", 1), env)
    assert env["OMP_NUM_THREADS"] == "1"
    env = {"OMP_NUM_THREADS": "8"}
    apply(torchrun_env(Layout(0, {"gpus": 2}), "h", 1), env)
    assert env["OMP_NUM_THREADS"] == "8"
    env = {}
    apply(torchrun_env(Layout(0, {"gpus": 1}), "h", 1), env)
    assert "OMP_NUM_THREADS" not in env


def test_the_master_address_is_the_one_the_transport_listens_on_never_a_loopback_name() -> None:
    assert transport_host("tls://10.250.0.11:4000") == ("tls", "10.250.0.11")
    assert transport_host("tcp://[fd00::7]:4000") == ("tcp", "fd00::7")
    assert transport_host("tcp://10.0.0.7:80@tcp://0.0.0.0:80") == ("tcp", "10.0.0.7")
    assert transport_host("ipc://@monarch-abc") == ("ipc", "")
    assert master_address("tls://10.250.0.11:4000") == "10.250.0.11"
    assert master_address("tls://10.250.0.11:4000", AddrType.IPv4) == "10.250.0.11"
    assert master_address("tcp://h7:4000") == "h7"  # a name the peers already resolve
    # a local transport has only local peers
    assert master_address("ipc://@x") == "127.0.0.1"
    assert master_address("ipc://@x", AddrType.IPv6) == "::1"
    with pytest.raises(ValueError, match="IPv4 address.*IPv6"):
        master_address("tls://10.250.0.11:4000", AddrType.IPv6)
    with pytest.raises(TypeError, match="AddrType"):
        master_address("tls://10.250.0.11:4000", "ipv4")  # type: ignore[arg-type]


def test_a_name_resolving_only_to_loopback_is_refused_for_a_cross_host_transport(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def fake(name, port, family=0, type=0, *a):  # type: ignore[no-untyped-def]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", 0))] if family == socket.AF_INET else []

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with pytest.raises(ValueError, match="loopback addresses are left out.*master_addr"):
        master_address("tcp://node7:4000", AddrType.IPv4)


def test_argv_and_exit_statuses_follow_python() -> None:
    assert check_argv(("t.py", "--lr", "1")) == ["t.py", "--lr", "1"]
    with pytest.raises(ValueError, match="No script or module specified"):
        check_argv([])
    with pytest.raises(ValueError, match="No module specified after '-m'"):
        check_argv(["-m"])
    with pytest.raises(TypeError, match="list of str"):
        check_argv("train.py")  # type: ignore[arg-type]
    assert [exit_status(c) for c in (0, 3, -9, -15)] == [0, 3, 137, 143]  # 128 + N for a signal, as a shell


def test_each_rank_runs_torchruns_command_line_for_a_script_a_module_run_path_and_no_python() -> None:
    py = "/venv/bin/python"
    assert command(["t.py", "--lr", "1"], ScriptOptions(), py) == [py, "-u", "t.py", "--lr", "1"]
    assert command(["-m", "pkg.train", "x"], ScriptOptions(), py) == [py, "-u", "-m", "pkg.train", "x"]
    run_path = command(["/abs/t.py", "x"], ScriptOptions(run_path=True), py)
    assert run_path[:3] == [py, "-u", "-c"] and "runpy.run_path" in run_path[3] and run_path[4:] == ["/abs/t.py", "x"]
    assert command(["t.py"], ScriptOptions(run_path=True, no_python=True), py)[:3] == [py, "-u", "-c"]  # as torchrun
    assert command(["nvidia-smi", "-L"], ScriptOptions(no_python=True), py) == ["nvidia-smi", "-L"]
    with pytest.raises(ValueError, match="module.*python -m"):
        command(["-m", "pkg"], ScriptOptions(no_python=True), py)


def test_redirects_and_tee_take_torchruns_values_per_local_rank() -> None:
    assert parse_std("3", "--tee") == 3 and parse_std("0:1,1:2", "--tee") == {0: 1, 1: 2}
    assert [std_for({0: 1, 1: 2}, r) for r in range(3)] == [1, 2, 0] and std_for(2, 5) == 2
    for bad in ("4", "a", "0:1,", "1:7"):
        with pytest.raises(ValueError, match="0 \\(none\\), 1 \\(stdout\\), 2 \\(stderr\\) or 3"):
            parse_std(bad, "--redirects")
    with pytest.raises(ValueError, match="redirects needs log_dir"):
        ScriptOptions(redirects=1)
    with pytest.raises(ValueError, match="tee must be 0-3"):
        ScriptOptions(log_dir="/tmp/x", tee={0: 5})


def test_a_script_error_survives_pickling_with_its_fields() -> None:
    import pickle

    e = pickle.loads(pickle.dumps(ScriptError("m", rank=3, exit_code=4, argv=["t.py"], host="h", failed_at=1.5,
                                              collective=True)))
    assert (str(e), e.rank, e.exit_code, e.argv, e.host, e.failed_at, e.collective) == ("m", 3, 4, ["t.py"], "h",
                                                                                        1.5, True)


def test_master_addr_without_master_port_is_refused_before_anything_is_spawned() -> None:
    with pytest.raises(ValueError, match="both master_addr and master_port, or neither"):
        setup_torch_elastic_env(object(), master_addr="10.0.0.1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must be a ProcMesh"):
        setup_torch_elastic_env(object())  # type: ignore[arg-type]


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _command.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["torchrun", *argv])


@pytest.mark.parametrize("argv, message", [
    (["--nnodes", "1:4", "t.py"], "elastic ranges are not supported"),
    (["--nnodes", "3", "t.py"], "--nnodes 3 needs --hosts NAME"),
    (["--nproc-per-node", "zero", "t.py"], "positive number, auto, cpu or gpu"),
    (["--master-addr", "h", "t.py"], "both --master-addr and --master-port"),
    (["--node-rank", "1", "t.py"], "run it once"),
    (["--rdzv-backend", "c10d", "t.py"], "rendezvous is static"),
    (["--no-python", "-m", "pkg"], "-m runs a module with python -m"),
    (["--run-path", "-m", "pkg"], "-m runs a module with python -m"),
    (["--no-python", "/nonexistent/tool"], "--no-python: the command '/nonexistent/tool' is not found"),
    (["--redirects", "5", "t.py"], "--redirects '5': give 0 (none)"),
    (["-t", "0:9", "t.py"], "--tee '0:9': give 0 (none)"),
    (["--local-ranks-filter", "a,b", "t.py"], "--local-ranks-filter 'a,b': give local ranks"),
    (["--local-addr", "h", "--master-addr", "h", "--master-port", "1", "t.py"], "give one of them"),
    (["--monitor-interval", "0", "t.py"], "--monitor-interval must be more than 0"),
    (["--log-dir", __file__, "t.py"], "is a file; give a folder"),
    (["/nonexistent/train.py"], "does not exist"),
])
def test_the_command_refuses_bad_input_with_status_2_and_says_why(argv, message, capsys) -> None:  # type: ignore[no-untyped-def]
    assert _command.run(_parse(*argv)) == 2
    assert message in capsys.readouterr().err


def test_torchruns_underscore_spellings_and_the_script_arguments_after_it_are_kept() -> None:
    args = _parse("--nproc_per_node", "2", "--max_restarts", "1", "-m", "pkg.train", "--lr", "0.1", "--nnodes", "9")
    assert (args.nproc_per_node, args.max_restarts, args.module, args.script) == ("2", 1, True, "pkg.train")
    assert args.args == ["--lr", "0.1", "--nnodes", "9"]  # the script's own options are its own


def test_the_facade_has_the_reference_names_from_the_plugin_and_the_core() -> None:
    assert sorted(spmd.__all__) == sorted(dir(spmd)) == ["AddrType", "JobFailed", "RankFailure", "SPMDActor",
                                                         "ScriptError", "host_address", "launch",
                                                         "setup_torch_elastic_env", "setup_torch_elastic_env_async"]
    assert tuple(spmd.PROVIDED) == tuple(hookspecs.SPMD_NAMES) == tuple(api.__all__)
    for name in spmd.PROVIDED:  # the plugin's objects, found through monarch_spmd_api
        assert getattr(spmd, name) is getattr(api, name), name
    assert spmd.AddrType is runtime.AddrType and spmd.host_address is runtime.host_address  # the core's own
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        spmd.nonsense  # noqa: B018


def test_monarch_torchrun_without_the_plugin_exits_2_naming_the_install_line(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cli, "_plugin_commands", lambda sub: None)  # no monarch.cli entry point is installed
    assert cli.main(["torchrun", "--nproc-per-node", "2", "train.py"]) == 2
    assert capsys.readouterr().err.strip() == (
        "monarch: the 'torchrun' command comes with the monarch-spmd plugin, which is not installed here; "
        "install it in a monarch-core checkout with `pip install ./plugins/spmd`")


def test_a_disabled_plugins_command_is_not_offered_and_says_what_turns_it_off(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MONARCH_DISABLED_PLUGINS", "spmd")
    sub = argparse.ArgumentParser().add_subparsers()
    assert cli._plugin_commands(sub) == {"torchrun": "spmd"}
    assert "torchrun" not in sub.choices and "dashboard" in sub.choices  # the other plugins' commands stay
    assert cli.main(["torchrun", "--nproc-per-node", "2", "train.py"]) == 2
    assert capsys.readouterr().err.strip() == (
        "monarch: the 'torchrun' command comes with the plugin 'spmd', which MONARCH_DISABLED_PLUGINS turns "
        "off here; take 'spmd' out of it to use the command")


def test_with_the_plugin_monarch_torchrun_is_its_command() -> None:
    sub = argparse.ArgumentParser().add_subparsers()
    cli._plugin_commands(sub)
    assert "torchrun" in sub.choices
    assert cli._missing_plugin_command(["torchrun", "t.py"], sub) is None
