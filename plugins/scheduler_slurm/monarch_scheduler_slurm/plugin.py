"""Entry point of monarch-scheduler-slurm: registers the ``slurm`` scheduler
(imported lazily: listing plugins loads nothing of Slurm)."""

from __future__ import annotations

from collections.abc import Sequence

from monarch_core.hookspecs import SchedulerSpec, hookimpl


@hookimpl
def monarch_schedulers() -> Sequence[SchedulerSpec]:
    return [
        SchedulerSpec(
            name="slurm",
            factory="monarch_scheduler_slurm._scheduler:SlurmScheduler",
            description="Slurm jobs: the allocation a client runs in, a job it submits, or one it attaches to",
        )
    ]


@hookimpl
def monarch_settings() -> list:
    from monarch_scheduler_slurm import _settings

    return _settings.SETTINGS
