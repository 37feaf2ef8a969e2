"""monarch-scheduler-slurm: ``scheduler = "slurm"`` for ``hosts_from_config``.

Public names (imported on first use, so that ``python -m
monarch_scheduler_slurm._node`` on a compute node loads nothing else):

* :class:`SlurmScheduler` -- the scheduler (``docs/slurm.md``);
* :class:`SlurmAllocation` -- what it returns (``job_id``, ``owned``);
* :class:`SlurmAPI` / :class:`SlurmCLI` -- the adapter boundary to Slurm and
  its command-line implementation; :class:`JobInfo`, :class:`SlurmCommandError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monarch_scheduler_slurm._cli import JobInfo, SlurmAPI, SlurmCLI, SlurmCommandError
    from monarch_scheduler_slurm._scheduler import SlurmAllocation, SlurmScheduler

__all__ = ["JobInfo", "SlurmAPI", "SlurmAllocation", "SlurmCLI", "SlurmCommandError", "SlurmScheduler"]

_WHERE = {
    "JobInfo": "_cli", "SlurmAPI": "_cli", "SlurmCLI": "_cli", "SlurmCommandError": "_cli",
    "SlurmAllocation": "_scheduler", "SlurmScheduler": "_scheduler",
}


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module 'monarch_scheduler_slurm' has no attribute {name!r}; it exports {__all__}")
    import importlib

    return getattr(importlib.import_module(f"monarch_scheduler_slurm.{mod}"), name)
