"""``SlurmJob``: a Slurm job through the monarch-scheduler-slurm plugin.

From a login node, ``apply()`` submits a job for every mesh's nodes (the
plugin's submit mode) and starts a worker loop per node as a step of it;
the job keeps running after the client ends, and a later program with the
same ``SlurmJob`` attaches to it (the plugin's ``job_id`` mode) from
``.monarch/job_state.pkl``.  Inside an allocation (``sbatch``, ``salloc``)
the job is that allocation.  Batch mode (``apply(client_script=...)``)
submits a job whose batch script runs the client on the allocation's first
node; its ``state()`` then uses the allocation.  ``kill()`` cancels the job.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from typing import Any, Optional, Sequence

from monarch_core.job import _sched
from monarch_core.job._trait import DEFAULT_JOB_PATH, BATCH_JOB_ENV, BatchJob, JobState, JobTrait, in_batch_job

logger = logging.getLogger("monarch.job")

INSTALL = "pip install ./plugins/scheduler_slurm"
#: Seconds a kill (the job's release) may take.
KILL_TIMEOUT = 120.0

#: Fields that make up the specification (``can_run`` compares them).
_SPEC = ("_meshes", "_python_exe", "_slurm_args", "_job_name", "_time_limit", "_partition", "_exclusive",
         "_gpus_per_node", "_cpus_per_task", "_mem", "_job_start_timeout", "_account", "_qos", "_params")


class SlurmJob(JobTrait):
    """A Slurm job holding ``meshes`` (name -> number of nodes), one
    worker loop per node.  The arguments are the reference's; they become
    the entry of the ``slurm`` scheduler (docs/slurm.md):
    ``partition``, ``time_limit`` (``time``), ``gpus_per_node``,
    ``cpus_per_task``, ``mem``, ``account``, ``qos``, ``exclusive``,
    ``job_name``, ``slurm_args`` (``sbatch_args``), ``job_start_timeout``
    (``queue_timeout``), ``python_exe`` (the nodes' interpreter; the default
    ``"python"`` means the client's own, as the scheduler's default).
    ``params``: more keys of the scheduler's entry (``constraint``,
    ``gres``, ``requeue``, ``signal``, ``state_dir``, ``srun_args`` ...).
    ``log_dir``: where a batch-mode job's output goes (default: the current
    folder).  What does not apply here raises ``ValueError``:
    ``ntasks_per_node`` other than 1 (one worker loop per node; procs per
    node come from ``spawn_procs(per_host=...)``), ``out_of_cluster`` and
    ``attach_to``.  ``monarch_port`` is accepted and unused: each client's
    worker loops listen on free ports, with TLS credentials of that client."""

    def __init__(
        self,
        meshes: dict[str, int],
        python_exe: str = "python",
        slurm_args: Sequence[str] = (),
        monarch_port: int = 22222,
        job_name: str = "monarch_job",
        ntasks_per_node: int = 1,
        time_limit: Optional[str] = None,
        partition: Optional[str] = None,
        log_dir: Optional[str] = None,
        exclusive: bool = True,
        gpus_per_node: Optional[int] = None,
        cpus_per_task: Optional[int] = None,
        mem: Optional[str] = None,
        job_start_timeout: Optional[int] = None,
        account: Optional[str] = None,
        qos: Optional[str] = None,
        out_of_cluster: bool = False,
        attach_to: Optional[str] = None,
        *,
        params: Optional[dict[str, Any]] = None,
    ) -> None:
        self._meshes = _sched.check_meshes("SlurmJob", meshes)
        if ntasks_per_node != 1:
            raise ValueError(f"SlurmJob(ntasks_per_node={ntasks_per_node!r}): each node runs one worker loop; "
                             "start several procs per node with state.<mesh>.spawn_procs(per_host={'gpus': N})")
        if out_of_cluster or attach_to is not None:
            raise ValueError("SlurmJob(out_of_cluster=..., attach_to=...): the client must reach the nodes "
                             "directly (docs/slurm.md); there is no gateway mode here")
        if isinstance(slurm_args, str):
            raise TypeError(f"SlurmJob(slurm_args=...) takes a sequence of sbatch options, got {slurm_args!r}")
        self._python_exe = python_exe
        self._slurm_args = tuple(slurm_args)
        self._port = monarch_port
        self._job_name = job_name
        self._time_limit = time_limit
        self._partition = partition
        self._log_dir = log_dir if log_dir is not None else os.getcwd()
        self._exclusive = exclusive
        self._gpus_per_node = gpus_per_node
        self._cpus_per_task = cpus_per_task
        self._mem = mem
        self._job_start_timeout = job_start_timeout
        self._account = account
        self._qos = qos
        self._params = dict(params or {})
        for key in ("nodes", "job_id"):
            if key in self._params:
                raise ValueError(f"SlurmJob(params={{{key!r}: ...}}): the job sets {key} itself "
                                 "(meshes gives the nodes; the saved state gives the job id)")
        self._job_id: Optional[str] = None
        self._flag = _sched.KeepFlag()
        self._root: Any = None
        super().__init__()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_root"] = None
        state["_flag"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._flag = _sched.KeepFlag()

    @property
    def job_id(self) -> Optional[str]:
        """The Slurm job id (``None`` before ``apply()``; in batch mode, the
        client's own allocation is ``$SLURM_JOB_ID``)."""
        return self._job_id

    def add_mesh(self, name: str, num_nodes: int) -> None:
        """Add the mesh ``name`` of ``num_nodes`` nodes (before ``apply()``)."""
        self._meshes = _sched.check_meshes("SlurmJob", {**self._meshes, name: num_nodes})

    def _entry(self, *, submit: bool = True) -> dict[str, Any]:
        """The ``slurm`` scheduler's entry for this job (the job's keys only
        when it submits)."""
        p: dict[str, Any] = {"nodes": sum(self._meshes.values())}
        if submit:
            p.update({k: v for k, v in (
                ("partition", self._partition), ("time", self._time_limit), ("gpus_per_node", self._gpus_per_node),
                ("cpus_per_task", self._cpus_per_task), ("mem", self._mem), ("account", self._account),
                ("qos", self._qos), ("job_name", self._job_name),
                ("queue_timeout", self._job_start_timeout)) if v is not None})
            if self._exclusive:
                p["exclusive"] = True
            if self._slurm_args:
                p["sbatch_args"] = list(self._slurm_args)
        if self._python_exe != "python":
            p["python"] = self._python_exe
        p.update(self._params)
        return p

    def _scheduler(self) -> Any:
        return _sched.require_scheduler("slurm", "SlurmJob", INSTALL)

    # -- JobTrait -------------------------------------------------------
    def _create(self, client_script: Optional[str]) -> None:
        self._scheduler()
        if client_script is not None:
            self._submit_batch(client_script)
            return
        self._root = _sched.allocate("SlurmJob", "slurm", self._entry(), self._flag)
        self._job_id = self._root.hosts[0].labels.get("job")
        logger.info("SlurmJob: Slurm job %s runs %s", self._job_id, self._meshes)

    def _state(self) -> JobState:
        if self._root is None:
            if in_batch_job():  # the client of a batch job: its own allocation
                params = self._entry(submit=False)
            elif self._job_id is not None:  # a saved job: attach to it
                params = {**self._entry(submit=False), "job_id": self._job_id}
            else:
                raise RuntimeError("SlurmJob: the job was not applied (call apply() or state())")
            self._root = _sched.allocate("SlurmJob", "slurm", params, self._flag)
        return JobState(_sched.split(self._root, self._meshes))

    def can_run(self, spec: JobTrait) -> bool:
        """The same specification, and the Slurm job still runs (or waits)."""
        if not isinstance(spec, SlurmJob) or any(getattr(spec, f) != getattr(self, f) for f in _SPEC):
            return False
        return self._job_alive()

    def _job_alive(self) -> bool:
        if self._job_id is None:
            return False
        try:
            info = self._scheduler().api.job(self._job_id, timeout=30)
        except Exception as e:  # noqa: BLE001 - Slurm unreachable: the job cannot be used
            logger.info("SlurmJob: cannot see Slurm job %s: %s", self._job_id, e)
            return False
        return info is not None and not info.finished

    def _kill(self) -> None:
        """Cancel the Slurm job (nothing in a batch job's own client: the
        batch script ends the job when the client returns)."""
        if in_batch_job():
            return
        if self._root is not None:
            try:
                _sched.shutdown(self._root, self._flag, KILL_TIMEOUT)
            finally:
                self._root = None
        if self._job_id is not None:
            self._scheduler().api.cancel(self._job_id, timeout=60)
            logger.info("SlurmJob: cancelled Slurm job %s", self._job_id)
        self._job_id = None

    # -- batch mode -----------------------------------------------------
    def _submit_batch(self, client_script: str) -> None:
        from monarch_scheduler_slurm._params import parse_params

        if not os.path.isfile(client_script):
            raise FileNotFoundError(f"SlurmJob.apply(client_script={client_script!r}): no such file")
        params = parse_params(self._entry(), "SlurmJob(...)")
        BatchJob(self).dump(DEFAULT_JOB_PATH)  # before the job starts: its client reads it
        cwd = os.getcwd()
        python = self._python_exe if self._python_exe != "python" else sys.executable
        script = (f"#!/bin/sh\ncd {shlex.quote(cwd)} || exit 1\n"
                  f"{BATCH_JOB_ENV}=1 exec {shlex.quote(python)} {shlex.quote(os.path.abspath(client_script))}\n")
        os.makedirs(self._log_dir, exist_ok=True)
        out = os.path.join(os.path.abspath(self._log_dir), f"slurm_%j_{self._job_name}.out")
        args = [*params.sbatch_options(), f"--output={out}", f"--chdir={cwd}"]
        self._job_id = self._scheduler().api.submit(script, args, timeout=60)
        logger.info("SlurmJob: submitted batch job %s running %s; its output: %s", self._job_id, client_script,
                    out.replace("%j", str(self._job_id)))
