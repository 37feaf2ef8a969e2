"""The ``MONARCH_*`` variables monarch-tensor-engine reads, declared once (the
``monarch_settings`` hook of its plugin module returns them; :func:`get`
declares them first, for code imported before the plugin registry loads it)."""

from __future__ import annotations

from typing import Any

from monarch_core import settings
from monarch_core.hookspecs import Setting

DISTRIBUTION = "monarch-tensor-engine"

SETTINGS = [
    Setting("MONARCH_TENSOR_OP_CACHE_SIZE", "int", 4096, "operations whose results' metadata the tensor engine's client keeps per mesh (least recently used first out; 0: none, every operation runs on fake tensors; see docs/tensors.md)", public=False, minimum=0),
]


def get(name: str) -> Any:
    """``settings.get(name)`` of one of :data:`SETTINGS`."""
    settings.declare(SETTINGS, DISTRIBUTION)
    return settings.get(name)
