"""The ``monarch_core.rdma`` API: one-sided buffer reads and writes.

The names of the reference's ``monarch.rdma`` (torchmonarch 0.7.0):
:class:`RDMABuffer`, :class:`RDMAAction`, :func:`get_rdma_backend`,
:func:`is_ibverbs_available`, :func:`is_rdma_available` (deprecated) and
:class:`RDMATcpFallbackWarning`.  A façade over a plugin: the classes come
from whichever installed plugin answers the ``monarch_rdma_api`` hook --
``monarch-transport-rdma`` (``pip install ./plugins/transport_rdma``), with
its ``channel`` fallback and its ``ibverbs`` and ``process_vm`` backends.
Without it this module still imports, and using a name raises
``ImportError`` saying what to install.  Importing this module loads nothing;
the first name used loads the plugin registry.  See docs/rdma.md.

::

    from monarch_core.actor import Actor, endpoint
    from monarch_core.rdma import RDMABuffer

    class Weights(Actor):
        def __init__(self):
            self.w = torch.zeros(1 << 20)
        @endpoint
        def handle(self) -> RDMABuffer:
            return RDMABuffer(self.w.view(torch.uint8))

    buf = weights.handle.call_one().get()
    local = torch.empty(buf.size(), dtype=torch.uint8)
    buf.read_into(local).get()           # the actor's code does not run
"""

from __future__ import annotations

from typing import Any

from monarch_core.errors import RDMAError

#: the names the providing plugin supplies
PROVIDED = ("RDMAAction", "RDMABuffer", "RDMATcpFallbackWarning", "get_rdma_backend", "is_ibverbs_available",
            "is_rdma_available")

__all__ = ["RDMAError", *PROVIDED]

DISTRIBUTION = "monarch-transport-rdma"


def _provider() -> Any:
    from monarch_core._plugins import provided

    return provided("monarch_rdma_api", DISTRIBUTION, "monarch_core.rdma needs a plugin that provides RDMABuffer",
                    "the channel fallback, ibverbs and process_vm; see docs/rdma.md")


def __getattr__(name: str) -> Any:
    if name not in PROVIDED:
        raise AttributeError(f"module 'monarch_core.rdma' has no attribute {name!r}")
    value = getattr(_provider(), name)
    globals()[name] = value  # found once per process
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
