"""``monarch_core.job.spmd``: torchrun-style jobs (the reference's
``monarch.job.spmd``): ``serve(command)`` reserves the hosts once,
``job.run_spmd()`` runs the training script on them as ``torchrun`` would,
as often as you like (edit, run again: no new allocation).

The script runs through the monarch-spmd plugin (``monarch_core.spmd.launch``:
``pip install ./plugins/spmd``).  The hosts come from one of this package's
jobs, chosen by ``scheduler``:

* ``"local_cwd"`` / ``"local"``: this host (:class:`~monarch_core.job.LocalJob`);
* ``"process"``: ``--nnodes`` worker loops on this machine (:class:`~monarch_core.job.ProcessJob`);
* ``"slurm"``: a Slurm job of ``--nnodes`` nodes; ``scheduler_cfg`` holds
  :class:`~monarch_core.job.SlurmJob`'s arguments (``partition``, ``time_limit`` ...);
* ``"ssh"``: ``scheduler_cfg={"hosts": [...], ...}`` (:class:`~monarch_core.job.SSHJob`'s ``params``).

The reference schedules through torchx (``mast_conda``, ``local_cwd``, a
torchx ``AppDef``); torchx is not used here: an ``AppDef`` (anything with
``roles``) is read for its first role's ``entrypoint``, ``args`` and
``num_replicas``, and ``scheduler`` picks the job as above.
"""

from __future__ import annotations

import argparse
import logging
import os
import warnings
from typing import Any, Optional, Union

from monarch_core.job._trait import DEFAULT_JOB_PATH, JobState, JobTrait

__all__ = ["SPMDJob", "serve"]

logger = logging.getLogger("monarch.job")

#: The schedulers ``serve`` knows.
SCHEDULERS = ("local_cwd", "local", "process", "slurm", "ssh")
#: The name of the host mesh an SPMD job's state holds.
MESH = "workers"


def _torchrun_parser() -> argparse.ArgumentParser:
    """torchrun's arguments (``torch/distributed/run.py``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--nnodes", type=str, default="1:1")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=str, default="1")
    for opt in ("--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf", "--role", "--log-dir",
                "--redirects", "--tee", "--local-ranks-filter", "--master-addr", "--local-addr",
                "--start-method"):
        p.add_argument(opt, opt.replace("-", "_").replace("__", "--", 1), type=str)
    p.add_argument("--max-restarts", "--max_restarts", type=int, default=0)
    p.add_argument("--monitor-interval", "--monitor_interval", type=float)
    p.add_argument("--node-rank", "--node_rank", type=int)
    p.add_argument("--master-port", "--master_port", type=int)
    p.add_argument("--standalone", action="store_true")
    p.add_argument("-m", "--module", action="store_true")
    p.add_argument("--no-python", "--no_python", action="store_true")
    p.add_argument("--run-path", "--run_path", action="store_true")
    p.add_argument("training_script", nargs="?")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def parse_torchrun(command: list[str]) -> tuple[list[str], int, int, int]:
    """``(script argv, nproc_per_node, nnodes, max_restarts)`` of a torchrun
    command: ``["torchrun", ...]``, ``["python", "-m", "torch.distributed.run", ...]``
    or a plain ``["python", "train.py", ...]`` (one proc)."""
    if not command:
        raise ValueError("serve(): the command is empty; give e.g. ['torchrun', '--nproc-per-node=2', 'train.py']")
    head = os.path.basename(command[0])
    if head in ("torchrun", "torch.distributed.run"):
        rest = command[1:]
    elif head.startswith("python"):
        if len(command) >= 3 and command[1] == "-m" and command[2] in ("torch.distributed.run", "torchrun"):
            rest = command[3:]
        else:
            return list(command[1:]), 1, 1, 0
    else:
        raise ValueError(f"serve(): expected a command that starts with torchrun, torch.distributed.run or python, "
                         f"got {command[0]!r}")
    args, _unknown = _torchrun_parser().parse_known_args(rest)
    try:
        nproc = int(args.nproc_per_node)
    except ValueError:
        raise ValueError(f"serve(): --nproc-per-node={args.nproc_per_node} must be a number here") from None
    low, _, high = args.nnodes.partition(":")
    if high and high != low:
        raise ValueError(f"serve(): --nnodes={args.nnodes}: elastic ranges are not supported; give one number")
    script: list[str] = ["-m"] if args.module else []
    if not args.training_script:
        raise ValueError(f"serve(): no training script in {command!r}")
    script += [args.training_script, *(args.training_script_args or [])]
    return script, nproc, int(low), int(args.max_restarts or 0)


def _job_for(scheduler: str, nnodes: int, cfg: dict[str, Any]) -> JobTrait:
    from monarch_core.job import LocalJob, ProcessJob, SlurmJob, SSHJob

    if scheduler in ("local_cwd", "local"):
        if nnodes != 1:
            raise ValueError(f"serve(scheduler={scheduler!r}): this host is one node, but the command asks for "
                             f"--nnodes={nnodes}; use scheduler='process' for several hosts on this machine")
        return LocalJob((MESH,))
    if scheduler == "process":
        return ProcessJob({MESH: nnodes}, **cfg)
    if scheduler == "slurm":
        return SlurmJob({MESH: nnodes}, **cfg)
    if scheduler == "ssh":
        cfg = dict(cfg)
        hosts = cfg.pop("hosts", None)
        if not hosts:
            raise ValueError("serve(scheduler='ssh') needs scheduler_cfg={'hosts': [...]} (the hosts to run on)")
        if len(hosts) != nnodes and nnodes != 1:
            raise ValueError(f"serve(scheduler='ssh'): --nnodes={nnodes} but {len(hosts)} host(s) given")
        job = SSHJob(params=cfg)
        job.add_mesh(MESH, list(hosts))
        return job
    raise ValueError(f"serve(scheduler={scheduler!r}): unknown scheduler; the ones here are {', '.join(SCHEDULERS)} "
                     "(the reference's torchx schedulers, such as mast_conda, are not available)")


def serve(appdef: Union[list[str], Any], scheduler: str = "local_cwd",
          scheduler_cfg: Optional[dict[str, Any]] = None) -> SPMDJob:
    """Reserve the hosts of a torchrun command (or an ``AppDef``-like
    object) and return the :class:`SPMDJob` whose ``run_spmd()`` runs it.

    The job is applied now and saved at ``.monarch/job_state.pkl`` (a stale
    file there is replaced), so that a later program can
    ``job_load(".monarch/job_state.pkl").run_spmd()`` on the same hosts."""
    if isinstance(appdef, (list, tuple)):
        command = [str(a) for a in appdef]
    elif hasattr(appdef, "roles"):
        roles = list(appdef.roles)
        if len(roles) != 1:
            raise ValueError(f"serve(): an AppDef with one role is supported, got {len(roles)}")
        role = roles[0]
        command = [str(role.entrypoint), *map(str, role.args)]
    else:
        raise TypeError(f"serve() takes a torchrun command (a list of str) or an AppDef, got {type(appdef).__name__}")
    script, nproc, nnodes, restarts = parse_torchrun(command)
    if hasattr(appdef, "roles"):
        nnodes = max(nnodes, int(getattr(appdef.roles[0], "num_replicas", 1) or 1))
    if os.path.exists(DEFAULT_JOB_PATH):
        warnings.warn(f"Removing stale job state file: {os.path.abspath(DEFAULT_JOB_PATH)}", stacklevel=2)
        os.remove(DEFAULT_JOB_PATH)
    job = SPMDJob(_job_for(scheduler, nnodes, dict(scheduler_cfg or {})), script, nproc, restarts)
    job.apply()
    job.dump(DEFAULT_JOB_PATH)
    return job


class SPMDJob(JobTrait):
    """A job that runs one torchrun command on its hosts (:meth:`run_spmd`).
    It wraps the job that holds the hosts (``LocalJob``, ``ProcessJob``,
    ``SlurmJob``, ``SSHJob``); its state's mesh is ``workers``."""

    def __init__(self, job: JobTrait, script_args: list[str], nproc_per_node: int = 1,
                 max_restarts: int = 0) -> None:
        super().__init__()
        self._job = job
        self._script_args = list(script_args)
        self._nproc_per_node = int(nproc_per_node)
        self._max_restarts = int(max_restarts)
        self._workers: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_workers"] = None
        return state

    def _create(self, client_script: Optional[str]) -> None:
        self._job.apply(client_script)

    def _state(self) -> JobState:
        running = self._job._running
        if running is None:
            raise RuntimeError("SPMDJob: its hosts' job is not running (it was killed); serve() the command again")
        return running._state()

    def can_run(self, spec: JobTrait) -> bool:
        return isinstance(spec, SPMDJob) and self._job.active and self._job.can_run(spec._job)

    def _kill(self) -> None:
        self._workers = None
        self._job.kill()

    def run_spmd(self) -> int:
        """Run the command's script on every proc (``nproc_per_node`` per
        host) as torchrun would; returns when every rank returned (the
        number of attempts, with ``--max-restarts``).  Raises the plugin's
        ``JobFailed`` naming the first rank that failed."""
        try:
            from monarch_core import spmd
            launch = spmd.launch
        except ImportError as e:
            raise ImportError(f"SPMDJob.run_spmd() runs the script through the monarch-spmd plugin: {e}") from None
        if self._running is None:
            self.apply()
        if self._workers is None:
            running = self._running
            assert running is not None
            self._workers = getattr(running._state(), MESH)
        return int(launch(self._workers, self._script_args, nproc_per_node=self._nproc_per_node,
                          max_restarts=self._max_restarts))
