"""The ``MONARCH_*`` variables monarch-compat reads, declared once (the
``monarch_settings`` hook of its plugin module returns them; :func:`get`
declares them first, for code that runs before the plugin registry loads
it: the CPU substitution's ``sitecustomize``)."""

from __future__ import annotations

from typing import Any

from monarch_core import settings
from monarch_core.hookspecs import Setting

DISTRIBUTION = "monarch-compat"

SETTINGS = [
    Setting("MONARCH_COMPAT_CPU", "bool", False, "1: the reference's CUDA programs run on the CPU (CUDA devices become the CPU, `nccl` becomes gloo) in the client and every proc: a test aid for running the reference's examples here, not a feature (docs/compat.md)", public=False),
    Setting("MONARCH_COMPAT_CPU_TENSOR_MB", "float", 1024.0, "with `MONARCH_COMPAT_CPU=1`: the most MiB one tensor made for a CUDA device may take, standing for the GPU's memory", public=False, minimum=0),
]


def get(name: str) -> Any:
    """``settings.get(name)`` of one of :data:`SETTINGS`."""
    settings.declare(SETTINGS, DISTRIBUTION)
    return settings.get(name)
