"""The ``MONARCH_*`` variables monarch-scheduler-slurm reads, declared once (the
``monarch_settings`` hook of its plugin module returns them; :func:`get`
declares them first, for code imported before the plugin registry loads it)."""

from __future__ import annotations

from typing import Any

from monarch_core import settings
from monarch_core.hookspecs import Setting

DISTRIBUTION = "monarch-scheduler-slurm"

SETTINGS = [
    Setting("MONARCH_SLURM_SYNC_COPY", "bool", False, "`sync_workspace` copies to each node's `sync_dir` through job steps even when the nodes share the client's filesystem (by default a shared workspace is used where it is)"),
    Setting("MONARCH_SLURM_JOB_ID", "str", None, "the Slurm job that `scheduler = \"slurm\"` entries attach to, as their `job_id` would (a restarted client reattaches to its job)"),
]


def get(name: str) -> Any:
    """``settings.get(name)`` of one of :data:`SETTINGS`."""
    settings.declare(SETTINGS, DISTRIBUTION)
    return settings.get(name)
