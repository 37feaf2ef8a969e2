"""Hook implementations of monarch-scheduler-ssh (import-light: the scheduler
and paramiko load only when a host mesh is allocated)."""

from __future__ import annotations

from monarch_core.hookspecs import SchedulerSpec, hookimpl


@hookimpl
def monarch_schedulers() -> list[SchedulerSpec]:
    return [
        SchedulerSpec(
            "ssh",
            "monarch_scheduler_ssh._scheduler:SSHScheduler",
            "hosts over SSH (paramiko): a worker loop per host, mutual TLS, SFTP workspace sync",
        )
    ]
