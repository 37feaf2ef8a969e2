"""The ``MONARCH_*`` variables monarch-transport-rdma reads, declared once (the
``monarch_settings`` hook of its plugin module returns them; :func:`get`
declares them first, for code imported before the plugin registry loads it)."""

from __future__ import annotations

from typing import Any

from monarch_core import settings
from monarch_core.hookspecs import Setting

DISTRIBUTION = "monarch-transport-rdma"

SETTINGS = [
    Setting("MONARCH_RDMA_DEVICE", "str", None, "the ibverbs device `RDMABuffer`s use, e.g. `mlx5_0` (default: the first one found)"),
]


def get(name: str) -> Any:
    """``settings.get(name)`` of one of :data:`SETTINGS`."""
    settings.declare(SETTINGS, DISTRIBUTION)
    return settings.get(name)
