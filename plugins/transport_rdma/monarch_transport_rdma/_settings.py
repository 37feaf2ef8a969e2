"""The ``MONARCH_*`` variables monarch-transport-rdma reads, declared once (the
``monarch_settings`` hook of its plugin module returns them; :func:`get`
declares them first, for code imported before the plugin registry loads it)."""

from __future__ import annotations

from typing import Any

from monarch_core import settings
from monarch_core.hookspecs import Setting

DISTRIBUTION = "monarch-transport-rdma"

SETTINGS = [
    Setting("MONARCH_RDMA_BACKEND", "str", "auto", "the data path of `RDMABuffer` transfers: `auto` (per owner proc, the first that reaches it of `ibverbs`, `process_vm`, `channel`) or one of those names, forced (see docs/rdma.md)"),
    Setting("MONARCH_RDMA_CHUNK_MB", "mib", 8, "MiB per request of the `channel` RDMA fallback (a large transfer is this many MiB at a time, so other messages pass between)", public=False, minimum=1),
    Setting("MONARCH_RDMA_PIPELINE", "int", 4, "requests of one `channel` RDMA transfer in flight at once", public=False, minimum=1),
    Setting("MONARCH_RDMA_THREADS", "int", 4, "threads per process that run `RDMABuffer` transfers (one transfer at a time each)", public=False, minimum=1),
    Setting("MONARCH_RDMA_RELEASE_GRACE", "seconds", 2.0, "seconds a dropped `RDMABuffer`'s memory is kept after its registration ends, for same-host transfers already past their check", public=False, minimum=0),
    Setting("MONARCH_RDMA_DEVICE", "str", None, "the ibverbs device `RDMABuffer`s use, e.g. `mlx5_0` (default: the first one found)"),
]


def get(name: str) -> Any:
    """``settings.get(name)`` of one of :data:`SETTINGS`."""
    settings.declare(SETTINGS, DISTRIBUTION)
    return settings.get(name)
