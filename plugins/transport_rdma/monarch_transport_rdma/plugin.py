"""Hook implementations of monarch-transport-rdma (import-light: the buffers
and the backends are imported when first used): ``monarch_core.rdma``'s
classes (``monarch_rdma_api``), the ``ibverbs`` and ``process_vm`` backends,
the plugin's settings."""

from __future__ import annotations

from monarch_core.hookspecs import RDMABackendSpec, hookimpl


@hookimpl
def monarch_rdma_backends() -> list[RDMABackendSpec]:
    return [
        RDMABackendSpec("channel", "monarch_transport_rdma._buffers._channel:ChannelBackend", preference=0,
                        description="chunked requests over the proc's session, served by the owner's proc; "
                                    "reaches every proc"),
        RDMABackendSpec("ibverbs", "monarch_transport_rdma._verbs:VerbsBackend", preference=100,
                        description="RDMA READ/WRITE over RC queue pairs (pyverbs; needs an RDMA device)"),
        RDMABackendSpec("process_vm", "monarch_transport_rdma._cma:ProcessVmBackend", preference=50,
                        description="process_vm_readv/writev between procs of one host (zero copy, one-sided)"),
    ]


@hookimpl
def monarch_rdma_api() -> object:
    """``monarch_core.rdma``'s names: RDMABuffer and its kin (imported when first used)."""
    from monarch_transport_rdma import api

    return api


@hookimpl
def monarch_settings() -> list:
    from monarch_transport_rdma import _settings

    return _settings.SETTINGS
