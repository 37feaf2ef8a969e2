"""The ``slurm`` entry's parameters (what is accepted, what each mistake
says), the sbatch options they become, and the adapter's helpers.  No
cluster needed: these run everywhere."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket

import pytest

from monarch_core.errors import AllocationError, ConfigError
from monarch_scheduler_slurm._cli import SlurmCLI, compress_nodes, expand_nodes, time_left_seconds
from monarch_scheduler_slurm._params import ALL_KEYS, parse_params

SRC = "/proj/monarch.toml [hosts.c]"


def test_a_full_entry_becomes_the_sbatch_options_of_its_job() -> None:
    p = parse_params({
        "partition": "gpu", "nodes": 4, "time": "01:30:00", "gpus_per_node": 8, "gres": "nvme:1",
        "cpus_per_task": 16, "mem": "64G", "account": "proj", "qos": "high", "constraint": "ib&a100",
        "exclusive": True, "sbatch_args": ["--reservation=mine"], "job_name": "trainers", "requeue": True,
        "signal": "usr2@90",
    }, SRC)
    assert p.sbatch_options() == [
        "--nodes=4", "--ntasks-per-node=1", "--job-name=trainers", "--no-kill", "--partition=gpu",
        "--time=01:30:00", "--gpus-per-node=8", "--gres=nvme:1", "--cpus-per-task=16", "--mem=64G",
        "--account=proj", "--qos=high", "--constraint=ib&a100", "--exclusive", "--requeue", "--signal=USR2@90",
        "--reservation=mine",
    ]
    assert p.submit_keys == sorted(["partition", "time", "gpus_per_node", "gres", "cpus_per_task", "mem", "account",
                                    "qos", "constraint", "exclusive", "sbatch_args", "requeue"])


def test_an_empty_entry_uses_the_current_job_and_warns_with_usr2_sixty_seconds_before_the_end() -> None:
    p = parse_params({}, SRC)
    assert (p.nodes, p.job_id, p.signal, p.submit_keys) == (None, None, ("USR2", 60), [])
    assert p.sbatch_options() == ["--nodes=1", "--ntasks-per-node=1", "--job-name=monarch", "--no-kill",
                                  "--no-requeue", "--signal=USR2@60"]
    assert parse_params({"signal": False, "time": 5, "job_id": 12}, SRC).sbatch_options()[-2:] == [
        "--time=5", "--no-requeue"]
    assert parse_params({"job_id": "12"}, SRC).job_id == "12"


@pytest.mark.parametrize("params, says", [
    ({"node": 2}, "unknown parameter(s) ['node'] for scheduler 'slurm' (did you mean: 'node' -> 'nodes'?)"),
    ({"nodes": 0}, "'nodes' must be an integer >= 1, got 0 (for example: nodes = 4)"),
    ({"nodes": True}, "'nodes' must be an integer >= 1, got True"),
    ({"time": "1h"}, "'time' must be minutes (an integer) or a Slurm time"),
    ({"gpus_per_node": "eight"}, "'gpus_per_node' must be a count, or TYPE:COUNT"),
    ({"mem": "lots"}, "'mem' must be MiB per node"),
    ({"exclusive": "yes"}, "'exclusive' must be true or false, got 'yes'"),
    ({"sbatch_args": "--reservation=x"}, "'sbatch_args' must be a list of strings"),
    ({"sbatch_args": ["--output=x.log"]}, "'sbatch_args' may not set --output"),
    ({"srun_args": ["--label"]}, "'srun_args' may not set --label"),
    ({"job_id": "12a"}, "'job_id' must be the id of a running (or pending) Slurm job"),
    ({"queue_timeout": 0}, "'queue_timeout' must be seconds > 0"),
    ({"signal": "USR1@60"}, "'signal' cannot be USR1: NCCL's watchdog uses it"),
    ({"signal": "TERM@60"}, "'signal' cannot be TERM"),
    ({"signal": "BOGUS@60"}, "'signal' names 'BOGUS', which is not a signal"),
    ({"signal": "USR2"}, "'signal' needs the seconds before the end after '@'"),
    ({"partition": ""}, "'partition' must be a non-empty string"),
])
def test_each_mistake_is_a_config_error_naming_the_entry_and_the_fix(params: dict, says: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_params(params, SRC)
    assert str(ei.value).startswith(SRC + ": "), str(ei.value)
    assert says in str(ei.value), str(ei.value)


def test_an_unknown_key_lists_every_known_one() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_params({"walltime": "1:00:00"}, SRC)
    assert f"it accepts {sorted(ALL_KEYS)}" in str(ei.value)


def test_hosts_from_config_checks_the_entry_before_anything_starts(tmp_path: pathlib.Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "monarch.toml"
    cfg.write_text('[hosts.c]\nscheduler = "slurm"\nnodes = -1\n')
    monkeypatch.setenv("MONARCH_CONFIG", str(cfg))
    from monarch_core.actor import hosts_from_config

    with pytest.raises(ConfigError) as ei:
        hosts_from_config("c")
    assert str(ei.value) == f"{cfg} [hosts.c]: 'nodes' must be an integer >= 1, got -1 (for example: nodes = 4)"


def test_node_lists_are_expanded_and_compressed_by_python_hostlist() -> None:
    assert expand_nodes("gpu[01-03],h7") == ["gpu01", "gpu02", "gpu03", "h7"]
    assert expand_nodes("") == [] and expand_nodes("(null)") == []
    assert compress_nodes(["h1", "h2", "h3", "x"]) == "h[1-3],x"
    with pytest.raises(AllocationError, match="python-hostlist cannot read"):
        expand_nodes("h[1-")


@pytest.mark.parametrize("text, seconds", [("1:05", 65), ("2:00:00", 7200), ("1-00:00:10", 86410), ("45", 45),
                                           ("UNLIMITED", None), ("INVALID", None), ("NOT_SET", None)])
def test_squeue_time_left_is_read_in_seconds(text: str, seconds: int | None) -> None:
    assert time_left_seconds(text) == seconds


def test_a_missing_slurm_command_says_what_to_install(tmp_path: pathlib.Path) -> None:
    cli = SlurmCLI(env={"PATH": str(tmp_path)})
    old = os.environ["PATH"]
    os.environ["PATH"] = str(tmp_path)  # shutil.which looks at this process's PATH
    try:
        with pytest.raises(AllocationError) as ei:
            cli.job("1")
    finally:
        os.environ["PATH"] = old
    assert "`squeue` was not found on PATH" in str(ei.value)
    assert "apt-get install slurm-client" in str(ei.value)


def test_a_slurm_command_that_hangs_is_cut_at_its_timeout(tmp_path: pathlib.Path) -> None:
    """The real squeue against a controller that accepts and never answers."""
    if shutil.which("squeue") is None:
        pytest.skip("no Slurm client commands (apt-get install slurm-client)")
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        conf = tmp_path / "slurm.conf"
        conf.write_text(f"ClusterName=mute\nSlurmctldHost=localhost(127.0.0.1)\n"
                        f"SlurmctldPort={mute.getsockname()[1]}\nAuthType=auth/munge\nMessageTimeout=60\n"
                        "NodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
        conf.chmod(0o644)
        cli = SlurmCLI(timeout=1.5, env={**os.environ, "SLURM_CONF": str(conf)})
        with pytest.raises(AllocationError) as ei:
            cli.job("1")
    assert "`squeue -h -t all -j 1 -o %i|%T|%r|%L|%N` did not finish within 1.5s" in str(ei.value)
    assert "is slurmctld reachable?" in str(ei.value)


def test_a_client_on_plain_tcp_is_told_to_leave_the_transport_to_hosts_from_config(tmp_path: pathlib.Path) -> None:
    """Checked before anything is submitted (a child: a process enables one transport)."""
    import subprocess
    import sys

    cfg = tmp_path / "monarch.toml"
    cfg.write_text('[hosts.c]\nscheduler = "slurm"\nnodes = 1\n')
    code = (
        "from monarch_core.actor import enable_transport, hosts_from_config\n"
        "from monarch_core.errors import AllocationError\n"
        "enable_transport('tcp://127.0.0.1:0')\n"
        "try:\n    hosts_from_config('c')\nexcept AllocationError as e:\n    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MONARCH_"))}
    env["MONARCH_CONFIG"] = str(cfg)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "this client runs the 'tcp' transport, but the job's nodes talk to it over tls" in res.stdout, res.stdout
    assert "Leave the transport to hosts_from_config" in res.stdout


def test_launch_files_are_private_in_a_private_session_directory(tmp_path: pathlib.Path) -> None:
    from monarch_scheduler_slurm._scheduler import _session_dir, _write_private

    p = parse_params({"state_dir": str(tmp_path / "state")}, SRC)
    session = pathlib.Path(_session_dir(p, "12"))
    assert session.parent == tmp_path / "state" and session.name.startswith("job12-")
    assert (session.stat().st_mode & 0o777, session.parent.stat().st_mode & 0o777) == (0o700, 0o700)
    _write_private(str(session / "h1.json"), {"env": {"MONARCH_TLS_KEY": "secret"}})
    assert (session / "h1.json").stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):  # never through a file someone put there first
        _write_private(str(session / "h1.json"), {})


class _CountingAddresses:
    """Just enough of a SlurmAPI for the client's route: ``node_addresses`` counted."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def node_addresses(self, nodes: list[str], *, timeout: float | None = None) -> dict[str, str]:
        self.asked.append(list(nodes))
        return {n: "127.0.0.1" for n in nodes}


def test_the_route_inside_a_job_asks_sinfo_once_for_every_node_the_workers_need(monkeypatch: pytest.MonkeyPatch) -> None:
    from monarch_core.hookspecs import AllocationRequest
    from monarch_scheduler_slurm._scheduler import SlurmScheduler

    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    monkeypatch.delenv("MONARCH_SLURM_JOB_ID", raising=False)
    api = _CountingAddresses()
    sched = SlurmScheduler(api=api)  # type: ignore[arg-type]
    assert sched.client_address(AllocationRequest("c", {"nodes": 2}, SRC)) == "tls://127.0.0.1:0"
    assert api.asked == [["n1", "n2"]]  # the job's nodes that will be used, not only the first
    # allocate's addresses for the workers' launch files come from that answer: no second sinfo
    assert sched._node_addresses(["n1", "n2"], timeout=1) == {"n1": "127.0.0.1", "n2": "127.0.0.1"}
    assert api.asked == [["n1", "n2"]]
    assert sched._node_addresses(["n3"], timeout=1) == {"n3": "127.0.0.1"}  # one it was not told about: asked
    assert api.asked == [["n1", "n2"], ["n3"]]


@pytest.mark.parametrize(("text", "seconds"), [
    ("1", 60), (5, 300), ("2:30", 150), ("01:00:00", 3600), ("1-0", 86400), ("1-2:30", 95400),
    ("0-00:01:30", 90), ("UNLIMITED", None), ("soon", None),
])
def test_slurm_times_in_seconds(text: object, seconds: int | None) -> None:
    from monarch_scheduler_slurm._params import slurm_time_seconds

    assert slurm_time_seconds(text) == seconds  # type: ignore[arg-type]


def test_a_warning_signal_due_at_the_jobs_start_is_named_with_the_fix() -> None:
    late = parse_params({"time": 1, "signal": "USR2@50"}, SRC).late_warning()
    assert late is not None
    assert "USR2@50 is due at the job's first time-limit check" in late and 'signal = "USR2@20"' in late, late
    # the default signal on a 90 s job: due from the start too
    assert parse_params({"time": "1:30"}, SRC).late_warning() is not None
    # enough room, no signal, or no time limit: nothing to say
    assert parse_params({"time": 1, "signal": "USR2@20"}, SRC).late_warning() is None
    assert parse_params({"time": "01:00:00"}, SRC).late_warning() is None
    assert parse_params({"time": 1, "signal": False}, SRC).late_warning() is None
    assert parse_params({"signal": "USR2@50"}, SRC).late_warning() is None
