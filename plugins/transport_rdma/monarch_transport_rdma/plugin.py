"""Hook implementations of monarch-transport-rdma (import-light: the backends
are imported when the core first resolves them)."""

from __future__ import annotations

from monarch_core.hookspecs import RDMABackendSpec, hookimpl


@hookimpl
def monarch_rdma_backends() -> list[RDMABackendSpec]:
    return [
        RDMABackendSpec("ibverbs", "monarch_transport_rdma._verbs:VerbsBackend", preference=100,
                        description="RDMA READ/WRITE over RC queue pairs (pyverbs; needs an RDMA device)"),
        RDMABackendSpec("process_vm", "monarch_transport_rdma._cma:ProcessVmBackend", preference=50,
                        description="process_vm_readv/writev between procs of one host (zero copy, one-sided)"),
    ]


@hookimpl
def monarch_settings() -> list:
    from monarch_transport_rdma import _settings

    return _settings.SETTINGS
