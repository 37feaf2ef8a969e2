"""The ``monarch_core.rdma`` API: one-sided buffer reads and writes.

The names of the reference's ``monarch.rdma`` (torchmonarch 0.7.0):
:class:`RDMABuffer`, :class:`RDMAAction`, :func:`get_rdma_backend`,
:func:`is_ibverbs_available`, :func:`is_rdma_available` (deprecated) and
:class:`RDMATcpFallbackWarning`.  A façade: the work lives in the private
``monarch_core._rdma`` package; backends come from plugins through the
``monarch_rdma_backends`` hook (``monarch-transport-rdma``: ``ibverbs``,
``process_vm``) and the built-in ``channel`` fallback.  Importing this module
loads neither trio nor pluggy nor any backend.  See docs/rdma.md.

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

from monarch_core._actor import _mesh  # noqa: F401 - lets a client runtime start from this API alone (light)
from monarch_core._rdma._backends import RDMATcpFallbackWarning
from monarch_core._rdma._buffer import (
    RDMAAction,
    RDMABuffer,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)
from monarch_core.errors import RDMAError

__all__ = [
    "RDMAAction",
    "RDMABuffer",
    "RDMAError",
    "RDMATcpFallbackWarning",
    "get_rdma_backend",
    "is_ibverbs_available",
    "is_rdma_available",
]
