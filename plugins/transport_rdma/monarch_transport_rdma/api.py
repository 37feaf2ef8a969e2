"""What this plugin provides as ``monarch_core.rdma`` (the ``monarch_rdma_api``
hook returns this module): ``RDMABuffer``, ``RDMAAction``,
``RDMATcpFallbackWarning``, ``get_rdma_backend``, ``is_ibverbs_available``,
``is_rdma_available``.  Import them from ``monarch_core.rdma``."""

from __future__ import annotations

from monarch_transport_rdma._buffers._backends import RDMATcpFallbackWarning
from monarch_transport_rdma._buffers._buffer import (
    RDMAAction,
    RDMABuffer,
    get_rdma_backend,
    is_ibverbs_available,
    is_rdma_available,
)

__all__ = ["RDMAAction", "RDMABuffer", "RDMATcpFallbackWarning", "get_rdma_backend", "is_ibverbs_available",
           "is_rdma_available"]
