"""``monarch_core.job`` without processes: the ``JobTrait`` contract as a
third party's job class sees it (apply once, save, reattach, an
incompatible saved job killed and its file removed, pickling), ``JobState``
names, the configuration objects' checks, and the errors that name what
exists (Kubernetes, a missing scheduler plugin, an unknown spmd scheduler)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Optional

import pytest

import monarch_core.job as job_api
from monarch_core.job import (
    DEFAULT_JOB_PATH,
    JobState,
    JobTrait,
    LocalJob,
    MeshAdminConfig,
    ProcessJob,
    SlurmJob,
    TelemetryConfig,
    job_load,
    job_loads,
)

pytestmark = pytest.mark.unit


class CountingJob(JobTrait):
    """A third party's job: no hosts (empty meshes), records what the trait calls."""

    def __init__(self, names: tuple[str, ...] = ("hosts",), compatible: bool = True, log: Optional[str] = None):
        super().__init__()
        self.names = names
        self.compatible = compatible
        self.log = log
        self.created = 0

    def _note(self, what: str) -> None:
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(what + "\n")

    def _state(self) -> JobState:
        return JobState({n: f"mesh:{n}" for n in self.names})  # type: ignore[misc]

    def _create(self, client_script: Optional[str]) -> None:
        self.created += 1
        self._note("create")

    def can_run(self, spec: JobTrait) -> bool:
        return self.compatible

    def _kill(self) -> None:
        self._note("kill")


def test_apply_creates_once_and_state_saves_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    job = CountingJob(("trainers", "loaders"))
    assert not job.active and job.apply_id is None
    state = job.state()
    assert job.created == 1 and job.active and job.apply_id
    assert state.trainers == "mesh:trainers" and state.loaders == "mesh:loaders"
    job.apply()
    assert job.created == 1  # a no-op once applied
    saved = job_load(DEFAULT_JOB_PATH)
    assert isinstance(saved, CountingJob) and saved.apply_id == job.apply_id


def test_a_second_program_reattaches_to_the_saved_job(tmp_path: Path) -> None:
    path = str(tmp_path / "state.pkl")
    first = CountingJob(("trainers",))
    first.state(cached_path=path)
    second = CountingJob(("ignored",))
    state = second.state(cached_path=path)
    assert second.created == 0, "the saved job can run the spec: no new job"
    assert second.apply_id == first.apply_id
    assert state.trainers == "mesh:trainers"  # the saved job's meshes


def test_an_incompatible_saved_job_is_killed_and_replaced(tmp_path: Path) -> None:
    path, log = str(tmp_path / "state.pkl"), str(tmp_path / "log")
    old = CountingJob(("trainers",), compatible=False, log=log)
    old.state(cached_path=path)
    new = CountingJob(("workers",), log=log)
    state = new.state(cached_path=path)
    assert Path(log).read_text().split() == ["create", "kill", "create"]
    assert new.created == 1 and state.workers == "mesh:workers"
    with pytest.raises(AttributeError, match="'trainers' is not a valid host mesh name. Available names: workers"):
        state.trainers
    assert job_load(path).apply_id == new.apply_id


def test_cached_path_none_neither_reads_nor_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    CountingJob().state()
    job = CountingJob()
    job.state(cached_path=None)
    assert job.created == 1
    job_load(DEFAULT_JOB_PATH)  # the first job's file only


def test_kill_ends_the_running_job_and_dumps_loads_round_trip(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    job = CountingJob(log=log)
    job.apply()
    again = job_loads(job.dumps())
    assert again.apply_id == job.apply_id and again.active
    job.kill()
    assert not job.active and Path(log).read_text().split() == ["create", "kill"]
    with pytest.raises(TypeError, match="not a JobTrait"):
        job_loads(pickle.dumps({"a": 1}))


def test_local_job_never_reuses_a_saved_job_and_pickles_without_live_meshes() -> None:
    job = LocalJob(("a", "b"))
    assert job.can_run(LocalJob(("a", "b"))) is False
    job._live.append(object())  # what state() keeps: never pickled
    assert job_loads(job.dumps())._live == []
    with pytest.raises(TypeError, match="sequence of host mesh names"):
        LocalJob("trainers")


def test_process_job_checks_its_meshes_and_refuses_batch_mode() -> None:
    with pytest.raises(ValueError, match="must be an int >= 1"):
        ProcessJob({"trainers": 0})
    with pytest.raises(ValueError, match="must be an identifier"):
        ProcessJob({"my trainers": 1})
    with pytest.raises(RuntimeError, match="ProcessJob cannot run batch-mode scripts.*LocalJob.*SlurmJob"):
        ProcessJob({"trainers": 1}).apply(client_script="train.py")


def test_slurm_job_refuses_what_does_not_apply_here() -> None:
    with pytest.raises(ValueError, match="one worker loop"):
        SlurmJob({"trainers": 2}, ntasks_per_node=8)
    with pytest.raises(ValueError, match="no gateway mode"):
        SlurmJob({"trainers": 2}, out_of_cluster=True)
    with pytest.raises(ValueError, match="sets nodes itself"):
        SlurmJob({"trainers": 2}, params={"nodes": 3})
    job = SlurmJob({"trainers": 2, "loaders": 1}, partition="gpu", time_limit="01:00:00", slurm_args=["--x=1"])
    assert job._entry() == {"nodes": 3, "partition": "gpu", "time": "01:00:00", "job_name": "monarch_job",
                            "exclusive": True, "sbatch_args": ["--x=1"]}
    assert job._entry(submit=False) == {"nodes": 3}
    assert not job.can_run(SlurmJob({"trainers": 2, "loaders": 1}, partition="gpu", time_limit="01:00:00",
                                    slurm_args=["--x=1"])), "a job that was never applied has no Slurm job"


def test_configurations_check_their_values() -> None:
    with pytest.raises(ValueError, match="dashboard_port"):
        TelemetryConfig(dashboard_port=70000)
    with pytest.raises(ValueError, match="retention_secs"):
        TelemetryConfig(retention_secs=-1)
    assert MeshAdminConfig("127.0.0.1:8123").port() == 8123 and MeshAdminConfig().port() is None
    with pytest.raises(ValueError, match="loopback only.*ssh -L"):
        MeshAdminConfig("0.0.0.0:8123").port()
    with pytest.raises(TypeError, match="takes a TelemetryConfig"):
        LocalJob().enable_telemetry(config=MeshAdminConfig())  # type: ignore[arg-type]
    job = LocalJob()
    assert job.enable_telemetry(include_dashboard=True) is job and job._admin == MeshAdminConfig()
    assert job.enable_admin(admin_addr="127.0.0.1:0") is job and job._admin == MeshAdminConfig("127.0.0.1:0")


def test_kubernetes_is_refused_naming_the_jobs_that_exist() -> None:
    with pytest.raises(ImportError, match="no KubernetesJob.*LocalJob, ProcessJob, SlurmJob, SSHJob"):
        from monarch_core.job import KubernetesJob  # noqa: F401
    with pytest.raises(ImportError, match="KubernetesJob is not available.*LocalJob, ProcessJob, SlurmJob, SSHJob"):
        import monarch_core.job.kubernetes  # noqa: F401
    with pytest.raises(AttributeError, match="its jobs are LocalJob, ProcessJob, SlurmJob, SSHJob"):
        job_api.MastJob  # noqa: B018
    assert "SSHJob" not in job_api.__all__ and job_api.SSHJob.__name__ == "SSHJob"


def test_the_slurm_and_ssh_jobs_name_their_plugin_when_it_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from monarch_core._plugins import reset_registry
    from monarch_core.job import SSHJob

    monkeypatch.setenv("MONARCH_DISABLED_PLUGINS", "scheduler_slurm,scheduler_ssh")
    reset_registry()
    try:
        with pytest.raises(ImportError, match=r"SlurmJob needs the 'slurm' scheduler.*pip install \./plugins/"
                                              r"scheduler_slurm"):
            SlurmJob({"trainers": 1}).apply()
        ssh = SSHJob()
        ssh.add_mesh("lab", ["h1"])
        with pytest.raises(ImportError, match=r"pip install \./plugins/scheduler_ssh"):
            ssh.apply()
    finally:
        monkeypatch.delenv("MONARCH_DISABLED_PLUGINS")
        reset_registry()


def test_spmd_serve_parses_torchrun_and_names_the_schedulers_it_has(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from monarch_core.job import spmd

    assert spmd.parse_torchrun(["torchrun", "--nproc-per-node=4", "--standalone", "train.py", "--lr", "1"]) == (
        ["train.py", "--lr", "1"], 4, 1, 0)
    assert spmd.parse_torchrun(["python", "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node", "2",
                                "--max-restarts=1", "-m", "pkg.train"]) == (["-m", "pkg.train"], 2, 2, 1)
    assert spmd.parse_torchrun(["python", "train.py", "x"]) == (["train.py", "x"], 1, 1, 0)
    with pytest.raises(ValueError, match="elastic ranges"):
        spmd.parse_torchrun(["torchrun", "--nnodes=1:4", "train.py"])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="unknown scheduler.*local_cwd, local, process, slurm, ssh.*mast_conda"):
        spmd.serve(["torchrun", "train.py"], scheduler="mast_conda")
    with pytest.raises(ValueError, match="use scheduler='process'"):
        spmd.serve(["torchrun", "--nnodes=2", "train.py"], scheduler="local_cwd")
    assert not os.path.exists(DEFAULT_JOB_PATH)
