"""``monarch_core.job``: the reference's ``monarch.job`` -- jobs that
allocate named host meshes, keep their state in ``.monarch/job_state.pkl``
so that the next run reattaches, and end with ``kill()``.

    from monarch_core.job import ProcessJob

    job = ProcessJob({"trainers": 2})
    state = job.state()              # applies the job (or reattaches to the saved one)
    procs = state.trainers.spawn_procs(per_host={"gpus": 2})
    ...
    job.kill()

A face over the same machinery as ``hosts_from_config`` (which stays the
native, documented way): :class:`LocalJob` is ``this_host()``,
:class:`ProcessJob` runs worker loops (``python -m monarch_core.worker``) on
this machine and attaches to them, :class:`SlurmJob` and ``SSHJob`` allocate
through the ``slurm`` and ``ssh`` scheduler plugins.  A scheduler plugin can
offer its own job class by subclassing :class:`JobTrait`.  ``KubernetesJob``
does not exist here (no Kubernetes scheduler).  See ``docs/job.md``.
"""

from __future__ import annotations

from typing import Any

from monarch_core.job._local import LocalJob
from monarch_core.job._service import new_service_proc_id
from monarch_core.job._observe import MeshAdminConfig, TelemetryConfig
from monarch_core.job._process import ProcessJob
from monarch_core.job._slurm import SlurmJob
from monarch_core.job._ssh import SSHJob  # noqa: F401 (importable, not in __all__: as in the reference)
from monarch_core.job._trait import (
    DEFAULT_JOB_PATH,
    BatchJob,  # noqa: F401 (importable, not in __all__)
    JobState,
    JobTrait,
    job_load,
    job_loads,
    load_current_job,
    set_current_job,
)

__all__ = [
    "DEFAULT_JOB_PATH",
    "JobState",
    "JobTrait",
    "LocalJob",
    "MeshAdminConfig",
    "ProcessJob",
    "SlurmJob",
    "TelemetryConfig",
    "job_load",
    "job_loads",
    "load_current_job",
    "new_service_proc_id",
    "set_current_job",
]

#: The job classes this package has (named by the errors about the ones it has not).
AVAILABLE = ("LocalJob", "ProcessJob", "SlurmJob", "SSHJob")


def __getattr__(name: str) -> Any:
    if name == "KubernetesJob":  # ImportError, so that `from monarch_core.job import KubernetesJob` says why
        raise ImportError(
            "monarch_core.job has no KubernetesJob: there is no Kubernetes scheduler here. The jobs available are "
            f"{', '.join(AVAILABLE)} (docs/job.md); a scheduler plugin can add its own by subclassing JobTrait"
        )
    raise AttributeError(f"module 'monarch_core.job' has no attribute {name!r}; its jobs are {', '.join(AVAILABLE)}")
