"""The ``ibverbs`` backend.

What runs for real here: importing it, device discovery through the real
pyverbs (Debian's ``python3-pyverbs``, where installed) and its error path on
a kernel without RDMA, and the reasons the core gets.  Everything that needs
a device -- registration, queue pairs, RDMA READ/WRITE, completions -- runs
against a MOCK verbs layer (``_mock_verbs.py``), because no RDMA device can
exist on the project's test machines; the pyverbs calls of ``_PyVerbs`` have
not been run against a device (docs/rdma.md).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time

import pytest

from monarch_core.errors import RDMAError
from monarch_core.hookspecs import MemoryRegion, RDMAPeer, RemoteRegion
from monarch_transport_rdma._verbs import DEPTH, VerbsBackend

from _mock_verbs import Fabric


def _region(buf, writable: bool = True) -> MemoryRegion:
    mv = memoryview(buf)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mv)) if not mv.readonly else 0
    return MemoryRegion(addr, mv.nbytes, "cpu", writable)


def test_the_real_pyverbs_discovery_and_its_error_path() -> None:
    why = VerbsBackend().unavailable()
    try:
        import pyverbs.device as d
    except ImportError:
        assert why is not None and "pyverbs is not installed" in why and "apt install python3-pyverbs" in why
        return
    try:
        devices = d.get_device_list()
    except Exception as e:  # no RDMA in this kernel: the error pyverbs raises
        assert why is not None and "no RDMA device" in why and str(e) in why
        return
    if not devices:
        assert why == "no RDMA device found (ibv_get_device_list returned none)"
    else:  # pragma: no cover - a machine with a device
        assert why is None


def test_without_pyverbs_the_reason_says_how_to_install_it() -> None:
    code = ("import sys; sys.modules['pyverbs'] = None; sys.modules['pyverbs.enums'] = None; "
            "from monarch_transport_rdma._verbs import VerbsBackend; print(VerbsBackend().unavailable())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pyverbs is not installed" in out.stdout and "ln -s /usr/lib/python3/dist-packages/pyverbs" in out.stdout


def test_mock_device_list_errors_and_choices(monkeypatch) -> None:
    assert VerbsBackend(Fabric(devices=())).unavailable() == "no RDMA device found (ibv_get_device_list returned none)"
    f = Fabric()
    f.list_error = OSError("Function not implemented")
    assert "listing the devices failed (OSError: Function not implemented)" in VerbsBackend(f).unavailable()
    monkeypatch.setenv("MONARCH_RDMA_DEVICE", "mlx5_9")
    assert VerbsBackend(Fabric(devices=("mlx5_0", "mlx5_1"))).unavailable() == (
        "MONARCH_RDMA_DEVICE='mlx5_9' is not among this host's RDMA devices: ['mlx5_0', 'mlx5_1']")
    monkeypatch.setenv("MONARCH_RDMA_DEVICE", "mlx5_1")
    assert VerbsBackend(Fabric(devices=("mlx5_0", "mlx5_1"))).unavailable() is None


def _pair(fabric: Fabric):
    owner, holder = VerbsBackend(fabric), VerbsBackend(fabric)
    assert owner.unavailable() is None and holder.unavailable() is None
    peer = RDMAPeer("owner-proc", "host", 1, owner.announce())
    exchanged = []

    def exchange(req):
        exchanged.append(req)
        return owner.accept(req)

    conn = holder.connect(peer, exchange)
    assert len(exchanged) == 1 and {"qpn", "psn", "lid", "gid"} <= set(exchanged[0])
    return owner, conn


def _remote(owner: VerbsBackend, buf, writable: bool = True):
    region = _region(buf, writable)
    d = owner.register(region)
    return region, d, RemoteRegion(region.addr, region.nbytes, "cpu", writable, d, name="RDMABuffer #1 (test)")


def test_mock_reads_and_writes_are_chunked_into_work_requests() -> None:
    fabric = Fabric(max_msg=1000)
    owner, conn = _pair(fabric)
    src = bytearray(range(256)) * 200 + b"tail!!!"  # 51207 bytes: 52 work requests of at most 1000
    _, d, remote = _remote(owner, src)
    dst = bytearray(len(src))
    conn.read(remote, 0, _region(dst), time.monotonic() + 10)
    assert dst == src and fabric.posted == 52 and fabric.max_outstanding <= DEPTH
    conn.read(remote, 100, _region(memoryview(dst)[:50]), time.monotonic() + 10)  # at an offset
    assert dst[:50] == src[100:150]
    xs = bytearray(b"X" * 3000)  # (kept referenced: the region is only an address)
    conn.write(remote, 7, _region(xs), time.monotonic() + 10)
    assert src[7:3007] == b"X" * 3000 and src[6] == 6 and src[3007] == (3007 % 256)


def test_mock_a_deregistered_buffer_refuses_remote_access() -> None:
    fabric = Fabric()
    owner, conn = _pair(fabric)
    src = bytearray(b"a" * 4096)
    region, d, remote = _remote(owner, src)
    owner.deregister(region, d)
    dst = bytearray(4096)
    with pytest.raises(RDMAError, match="REM_ACCESS_ERR.*dropped buffer"):
        conn.read(remote, 0, _region(dst), time.monotonic() + 10)
    with pytest.raises(RDMAError, match="unusable"):  # an error completion leaves the queue pair in error
        conn.read(remote, 0, _region(dst), time.monotonic() + 10)


def test_mock_read_only_memory_is_registered_without_remote_write() -> None:
    fabric = Fabric()
    owner, conn = _pair(fabric)
    src = bytearray(100)
    _, d, remote = _remote(owner, src, writable=False)
    ten = bytearray(10)
    with pytest.raises(RDMAError, match="read-only"):
        conn.write(remote, 0, _region(ten), time.monotonic() + 10)
    assert fabric.mrs[d["rkey"]].remote_write is False


def test_mock_no_completion_before_the_deadline_is_a_timeout() -> None:
    fabric = Fabric()
    owner, conn = _pair(fabric)
    src, dst = bytearray(1 << 16), bytearray(1 << 16)
    _, _, remote = _remote(owner, src)
    fabric.stall = True
    with pytest.raises(TimeoutError, match="0 of 1 work requests completed"):
        conn.read(remote, 0, _region(dst), time.monotonic() + 0.2)


def test_mock_device_memory_is_left_to_the_other_backends() -> None:
    owner = VerbsBackend(Fabric())
    assert owner.unavailable() is None
    assert owner.register(MemoryRegion(0x1000, 4096, "cuda:0")) is None
