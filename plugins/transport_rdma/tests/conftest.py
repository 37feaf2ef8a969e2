"""Fixtures of the RDMA suite: an owner proc and a reader proc, spawned once
per module, and ``backend`` forcing (``MONARCH_RDMA_BACKEND``) in the client."""

from __future__ import annotations

import pytest

pytest.importorskip("monarch_transport_rdma", reason="RDMABuffer comes with monarch-transport-rdma "
                    "(pip install -e plugins/transport_rdma; scripts/test.sh does)")

from monarch_core.actor import this_host  # noqa: E402

from rdma_actors import Owner, Reader, require_backend  # noqa: E402

#: Backends that can run on this machine (no RDMA device: see docs/rdma.md).
RUNNABLE = ["process_vm", "channel"]


@pytest.fixture(scope="module")
def owner():
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="rdma_owner")
    mesh = procs.spawn("owner", Owner)
    yield mesh
    procs.stop().get(timeout=30)


@pytest.fixture(scope="module")
def reader():
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="rdma_reader")
    mesh = procs.spawn("reader", Reader)
    yield mesh
    procs.stop().get(timeout=30)


@pytest.fixture(params=RUNNABLE)
def backend(request, monkeypatch) -> str:
    """Each backend this machine can run, forced in the client for the test."""
    require_backend(request.param)
    monkeypatch.setenv("MONARCH_RDMA_BACKEND", request.param)
    return request.param
