"""How procs are started and that they never outlive their owner.

Most tests use this pytest process as the client (the default ``ipc``
transport) and real worker processes; tests about the client dying or exiting
run the client in a child interpreter.  Liveness is read from ``/proc``; a
zombie (state ``Z``) counts as gone, and a pid is compared with the start time
recorded when it was first seen so that pid reuse cannot fool the check.
"""

from __future__ import annotations

import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from monarch_core._launch._bootstrap import PROC_MODULE
from monarch_core.actor import (
    Actor,
    BootstrapCommand,
    Extent,
    default_bootstrap_cmd,
    endpoint,
    hosts_from_config,
    this_host,
)
from monarch_core.errors import ConfigError, SupervisionError

from _helpers.clients import child_env, run_code
from _helpers.procs import pid_running, start_time, start_times, wait_pids_gone

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- actors


class Inspect(Actor):
    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def affinity(self) -> list[int]:
        return sorted(os.sched_getaffinity(0))

    @endpoint
    def executable(self) -> str:
        return sys.executable


class Spawner(Actor):
    """Owns a nested proc mesh, so that grandchildren exist too."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def spawn_children(self) -> list[int]:
        self.pm = this_host().spawn_procs(per_host={"k": 2})
        return self.pm.spawn("leaf", Inspect).pid.call().get(timeout=60).values()


# ---------------------------------------------------------------- BootstrapCommand


def test_default_bootstrap_cmd_runs_this_python_on_the_proc_module_with_no_overrides() -> None:
    cmd = default_bootstrap_cmd()
    assert cmd == BootstrapCommand(program=sys.executable, args=("-m", PROC_MODULE), env={}, arg0=None)
    assert (cmd.program, cmd.args, dict(cmd.env), cmd.arg0) == (sys.executable, ("-m", PROC_MODULE), {}, None)
    assert cmd.argv() == [sys.executable, "-m", "monarch_core._launch._proc_main"]
    assert default_bootstrap_cmd("/opt/py/bin/python3").program == "/opt/py/bin/python3"


def test_bootstrap_command_env_overrides_set_and_remove_variables_in_the_proc(
    meshes: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MC_TEST_INHERITED", "from-client")
    monkeypatch.setenv("MC_TEST_REMOVED", "should-not-arrive")
    monkeypatch.setenv("MC_TEST_REPLACED", "old")
    cmd = default_bootstrap_cmd().with_env({"MC_TEST_SET": "hello world", "MC_TEST_REPLACED": "new"}, MC_TEST_REMOVED=None)
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=cmd)
    meshes.append(pm)
    a = pm.spawn("inspect", Inspect)
    got = {
        name: a.env.call(name).get(timeout=60).values()
        for name in ("MC_TEST_SET", "MC_TEST_INHERITED", "MC_TEST_REMOVED", "MC_TEST_REPLACED", "MONARCH_PROC_BOOTSTRAP")
    }
    assert got == {
        "MC_TEST_SET": ["hello world", "hello world"],
        "MC_TEST_INHERITED": ["from-client", "from-client"],
        "MC_TEST_REMOVED": [None, None],
        "MC_TEST_REPLACED": ["new", "new"],
        "MONARCH_PROC_BOOTSTRAP": [None, None],  # consumed by the proc, not leaked to user code
    }


def test_bootstrap_command_may_be_a_callable_of_the_point(meshes: list) -> None:
    seen: list = []

    def per_point(point):  # type: ignore[no-untyped-def]
        seen.append((point.rank, dict(point)))
        return default_bootstrap_cmd().with_env(MC_TEST_POINT=f"{point.rank}:{point['gpus']}")

    pm = this_host().spawn_procs(per_host={"gpus": 3}, bootstrap_command=per_point)
    meshes.append(pm)
    vals = pm.spawn("inspect", Inspect).env.call("MC_TEST_POINT").get(timeout=60).values()
    assert vals == ["0:0", "1:1", "2:2"]
    assert seen == [(0, {"gpus": 0}), (1, {"gpus": 1}), (2, {"gpus": 2})]


def test_bootstrap_command_callable_returning_something_else_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="returned str, not a BootstrapCommand"):
        this_host().spawn_procs(bootstrap_command=lambda point: "python")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"program": ""}, "BootstrapCommand.program must be a non-empty str"),
        ({"program": "python", "env": {"A": 1}}, "BootstrapCommand.env maps str to str"),
    ],
)
def test_bootstrap_command_rejects_bad_fields(kwargs: dict, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        BootstrapCommand(**kwargs)


def test_with_python_executable_starts_procs_with_that_executable(meshes: list, tmp_path: pathlib.Path) -> None:
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nMC_TEST_VIA_WRAPPER="$0" exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    plain = this_host().with_python_executable(sys.executable).spawn_procs()
    meshes.append(plain)
    wrapped = this_host().with_python_executable(str(wrapper)).spawn_procs(per_host={"gpus": 2})
    meshes.append(wrapped)
    assert plain.spawn("i", Inspect).executable.call_one().get(timeout=60) == sys.executable
    assert wrapped.spawn("i", Inspect).env.call("MC_TEST_VIA_WRAPPER").get(timeout=60).values() == [str(wrapper)] * 2


def test_with_python_executable_rejects_a_non_string() -> None:
    with pytest.raises(TypeError, match="needs the path of a Python executable"):
        this_host().with_python_executable(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------- proc_bind


def test_proc_bind_cpus_sets_each_procs_affinity(meshes: list) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    binds = [{"cpus": str(cpus[0])}, {"cpus": f"{cpus[1]}"}, {"cpus": f"{cpus[0]},{cpus[1]}"}]
    pm = this_host().spawn_procs(per_host={"gpus": 3}, proc_bind=binds)
    meshes.append(pm)
    got = pm.spawn("i", Inspect).affinity.call().get(timeout=60).values()
    assert got == [[cpus[0]], [cpus[1]], [cpus[0], cpus[1]]]


@pytest.mark.parametrize("binds", [[{"cpus": "0"}], [{"cpus": "0"}] * 3], ids=["too-few", "too-many"])
def test_proc_bind_of_the_wrong_length_is_a_value_error(binds: list) -> None:
    with pytest.raises(ValueError) as ei:
        this_host().spawn_procs(per_host={"gpus": 2}, proc_bind=binds)
    assert str(ei.value).startswith(f"proc_bind has {len(binds)} entries but 2 procs are being spawned per host")


def test_proc_bind_with_unknown_keys_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"proc_bind\[0\] has unknown keys \['gpu'\]"):
        this_host().spawn_procs(proc_bind=[{"gpu": "0"}])


# ---------------------------------------------------------------- start failures


def test_bad_program_path_fails_initialized_with_an_error_naming_the_command(meshes: list) -> None:
    program = "/nonexistent/monarch-test/python"
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap_command=BootstrapCommand(program=program))
    meshes.append(pm)
    with pytest.raises(SupervisionError) as ei:
        pm.initialized.get(timeout=10)
    assert program in str(ei.value)
    assert "No such file or directory" in str(ei.value)


def test_bad_python_executable_fails_initialized_with_an_error_naming_it(meshes: list) -> None:
    pm = this_host().with_python_executable("/nonexistent/monarch-test/py").spawn_procs()
    meshes.append(pm)
    with pytest.raises(SupervisionError) as ei:
        pm.initialized.get(timeout=10)
    assert "/nonexistent/monarch-test/py" in str(ei.value)


def test_program_that_exits_at_once_fails_initialized_with_its_exit_status(meshes: list) -> None:
    cmd = BootstrapCommand(program=sys.executable, args=("-c", "raise SystemExit(7)"))
    pm = this_host().spawn_procs(bootstrap_command=cmd)
    meshes.append(pm)
    with pytest.raises(SupervisionError) as ei:
        pm.initialized.get(timeout=30)
    assert "exited with code 7" in str(ei.value)


# ---------------------------------------------------------------- hosts_from_config


@pytest.fixture
def project(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.delenv("MONARCH_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_hosts_from_config_local_two_hosts_spawn_two_gpus_each(project: pathlib.Path, meshes: list) -> None:
    (project / "monarch.toml").write_text('[hosts.pair]\nscheduler = "local"\nhosts = 2\n')
    hm = hosts_from_config("pair")
    try:
        assert hm.extent == Extent(["hosts"], [2])
        pm = hm.spawn_procs(per_host={"gpus": 2})
        meshes.append(pm)
        assert pm.extent == Extent(["hosts", "gpus"], [2, 2])
        assert pm.sizes == {"hosts": 2, "gpus": 2}
        pids = pm.spawn("i", Inspect).pid.call().get(timeout=60)
        assert pids.extent == Extent(["hosts", "gpus"], [2, 2])
        assert len(set(pids.values())) == 4
        assert os.getpid() not in pids.values()
    finally:
        hm.shutdown().get(timeout=30)


def test_hosts_from_config_with_an_uninstalled_scheduler_names_the_package(project: pathlib.Path) -> None:
    cfg = project / "monarch.toml"
    cfg.write_text('[hosts.cluster]\nscheduler = "slurm"\npartition = "gpu"\n')
    # The slurm plugin may be installed here: a child that does not load it
    # sees what a user without it sees.
    res = run_code("""
        from monarch_core.actor import hosts_from_config
        from monarch_core.errors import ConfigError, UnknownSchedulerError
        try:
            hosts_from_config("cluster")
        except (ConfigError, UnknownSchedulerError) as e:
            print(e)
    """, env={"MONARCH_DISABLED_PLUGINS": "scheduler_slurm"}, cwd=project, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "provided by the plugin monarch-scheduler-slurm" in res.stdout
    assert str(cfg) in res.stdout


def test_hosts_from_config_with_an_unknown_local_parameter_names_the_file(project: pathlib.Path) -> None:
    cfg = project / "monarch.toml"
    cfg.write_text('[hosts.dev]\nscheduler = "local"\nhosts = 1\ngpus_per_host = 8\n')
    with pytest.raises(ConfigError) as ei:
        hosts_from_config("dev")
    assert str(ei.value) == (
        f"{cfg} [hosts.dev]: unknown parameter(s) ['gpus_per_host'] for scheduler 'local'; "
        "it accepts ['hosts'] (e.g. hosts = 2)"
    )


@pytest.mark.parametrize("value", ["0", '"two"', "true"])
def test_hosts_from_config_with_a_bad_host_count_names_the_file(project: pathlib.Path, value: str) -> None:
    cfg = project / "monarch.toml"
    cfg.write_text(f'[hosts.dev]\nscheduler = "local"\nhosts = {value}\n')
    with pytest.raises(ConfigError) as ei:
        hosts_from_config("dev")
    assert str(ei.value).startswith(f"{cfg} [hosts.dev]: 'hosts' must be an integer >= 1")


# ---------------------------------------------------------------- stopping


def test_proc_mesh_stop_makes_its_processes_disappear(meshes: list) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 3})
    pids = pm.spawn("i", Inspect).pid.call().get(timeout=60).values()
    procs = start_times(pids)
    pm.stop().get(timeout=30)
    assert [p for p, st in procs.items() if pid_running(p, st)] == []  # gone when stop() resolves
    assert all(start_time(p) is None for p in pids)  # and reaped: no zombies left behind


def test_stopping_actor_mesh_then_proc_mesh_is_prompt_and_both_futures_resolve(meshes: list) -> None:
    """What the client does at exit (``_stop_meshes``): stop the actor mesh,
    then at once its proc mesh.  Two rounds of three meshes at once, because
    whether (and which way) it goes wrong depends on timing."""
    outcome = []
    for _round in range(2):
        pairs = []
        for _ in range(3):
            pm = this_host().spawn_procs(per_host={"gpus": 2})
            meshes.append(pm)
            pairs.append((pm, pm.spawn("i", Inspect)))
        procs = start_times([p for _pm, a in pairs for p in a.pid.call().get(timeout=60).values()])
        t0 = time.monotonic()
        futs = [(a.stop(), pm.stop()) for pm, a in pairs]
        for fa, fp in futs:
            fp.get(timeout=30)
            proc_stop = round(time.monotonic() - t0, 1)
            try:
                fa.get(timeout=1)
                actor_stop = "resolved"
            except TimeoutError:
                actor_stop = "never resolved"
            outcome.append((proc_stop, actor_stop))
        assert wait_pids_gone(procs, 0) == []
    assert all(ps < 5.0 and a == "resolved" for ps, a in outcome), (
        f"(seconds until ProcMesh.stop resolved, ActorMesh.stop outcome) per mesh: {outcome}"
    )


# ---------------------------------------------------------------- never outliving the client

_CLIENT = """
import json, os, sys
sys.path.insert(0, {here!r})
from monarch_core.actor import this_host
from test_procs import Spawner
pm = this_host().spawn_procs(per_host={{"gpus": 2}})
s = pm.spawn("s", Spawner)
children = s.pid.call().get(timeout=60).values()
grandchildren = [p for ps in s.spawn_children.call().get(timeout=60).values() for p in ps]
print(json.dumps({{"client": os.getpid(), "children": children, "grandchildren": grandchildren}}), flush=True)
{tail}
"""


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()  # type: ignore[union-attr]
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        assert left > 0, f"client printed nothing within {timeout}s"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"client exited early: {proc.stderr.read().decode()[-3000:]}"  # type: ignore[union-attr]
            buf += chunk
    return buf.split(b"\n", 1)[0].decode()


def test_worker_processes_never_outlive_a_sigkilled_client() -> None:
    client = subprocess.Popen(
        [sys.executable, "-c", _CLIENT.format(here=HERE, tail="sys.stdin.read()")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(drop=("MONARCH_DISABLED_PLUGINS",)),
    )
    try:
        info = json.loads(_read_line(client, 90))
        workers = info["children"] + info["grandchildren"]
        assert len(set(workers)) == 6
        procs = start_times(workers)
        client.send_signal(signal.SIGKILL)
        assert client.wait(10) == -signal.SIGKILL
        survivors = wait_pids_gone(procs, 5.0)
        assert survivors == [], f"workers {survivors} outlived the SIGKILLed client"
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        for p in locals().get("procs", {}):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _exit_normally(n: int = 1) -> list[tuple[dict, str, str, int, float]]:
    """Run ``n`` clients at once that exit normally; (info, stdout, stderr, rc, seconds) each."""
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLIENT.format(here=HERE, tail="print('bye', flush=True)")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(drop=("MONARCH_DISABLED_PLUGINS",)),
        )
        for _ in range(n)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append((json.loads(stdout.splitlines()[0]), stdout, stderr, p.returncode, time.monotonic() - t0))
    return out


def test_shutdown_context_at_interpreter_exit_leaves_no_worker_processes() -> None:
    ((info, stdout, stderr, rc, _elapsed),) = _exit_normally()
    assert rc == 0, stderr[-3000:]
    assert stdout.splitlines()[1] == "bye"
    workers = info["children"] + info["grandchildren"]
    assert len(set(workers)) == 6
    survivors = {p: st for p in workers if pid_running(p) and (st := start_time(p)) is not None}
    # the client has exited: any worker still running now outlived it
    assert wait_pids_gone(survivors, 5.0) == []


def test_shutdown_context_at_interpreter_exit_completes_cleanly() -> None:
    """Exit-time shutdown stops actor meshes and proc meshes without running
    into its own timeout (``stop did not complete cleanly``).  Three clients at
    once, because the slow path depends on timing."""
    runs = _exit_normally(3)
    for _info, _out, err, rc, _elapsed in runs:
        assert rc == 0, err[-3000:]
    reports = [(round(el, 1), [ln for ln in err.splitlines() if "did not complete" in ln]) for _i, _o, err, _rc, el in runs]
    assert all(not lines for _e, lines in reports), f"(seconds, warnings) per run: {reports}"


def test_shutdown_context_stops_owned_procs_and_is_idempotent() -> None:
    code = textwrap.dedent(
        f"""
        import json, os, sys
        sys.path.insert(0, {HERE!r})
        from monarch_core.actor import shutdown_context, this_host
        from test_procs import Inspect
        pm = this_host().spawn_procs(per_host={{"gpus": 2}})
        pids = pm.spawn("i", Inspect).pid.call().get(timeout=60).values()
        pm.initialized.get(timeout=60)
        shutdown_context().get(timeout=30)
        def state(p):
            try:
                with open(f"/proc/{{p}}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0]
            except FileNotFoundError:
                return "gone"
        at_return = [state(p) for p in pids]
        import time
        deadline = time.monotonic() + 5
        while any(state(p) not in ("gone", "Z") for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)  # polling a condition with a deadline
        gone = [state(p) for p in pids]
        shutdown_context().get(timeout=1)
        try:
            this_host().spawn_procs()
            after = None
        except RuntimeError as e:
            after = str(e)
        print(json.dumps({{"at_return": at_return, "gone": gone, "after": after}}))
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env(drop=("MONARCH_DISABLED_PLUGINS",)))
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    # "gone": exited and reaped; "Z": exited but never reaped by the client
    assert out["gone"] == ["gone", "gone"], f"states when shutdown_context() returned: {out['at_return']}"
    assert out["at_return"] == ["gone", "gone"]
    assert out["after"] is not None and "shut down" in out["after"]
