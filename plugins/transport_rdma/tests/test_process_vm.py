"""The ``process_vm`` backend against this very process (process_vm_readv of
one's own pid works): tickets, pid checks, messages.  Between real procs it
is exercised by ``test_rdma_*.py`` beside this file."""

from __future__ import annotations

import ctypes
import errno
import os
import time

import pytest

from monarch_core.errors import RDMAError, SupervisionError
from monarch_core.hookspecs import MemoryRegion, RDMAPeer, RemoteRegion
from monarch_transport_rdma._cma import ProcessVmBackend, host_key, ptrace_policy

pytestmark = pytest.mark.unit


def _setup():
    b = ProcessVmBackend()
    assert b.unavailable() is None
    src = bytearray(b"0123456789" * 1000)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(src))
    region = MemoryRegion(addr, len(src))
    d = b.register(region)
    remote = RemoteRegion(addr, len(src), "cpu", True, d, name="RDMABuffer #9 (test)")
    conn = b.connect(RDMAPeer("me", host_key(), os.getpid(), b.announce()), lambda req: {})
    return b, src, region, d, remote, conn


def _local(buf) -> MemoryRegion:
    return MemoryRegion(ctypes.addressof(ctypes.c_char.from_buffer(buf)), len(buf))


def test_read_and_write_through_process_vm() -> None:
    b, src, region, d, remote, conn = _setup()
    dst = bytearray(len(src))
    conn.read(remote, 0, _local(dst), time.monotonic() + 5)
    assert dst == src
    abc = bytearray(b"abc")  # (kept referenced: the region is only an address)
    conn.write(remote, 5, _local(abc), time.monotonic() + 5)
    assert src[:10] == b"01234abc89"


def test_a_cleared_ticket_fails_the_next_transfer() -> None:
    b, src, region, d, remote, conn = _setup()
    b.deregister(region, d)
    ten = bytearray(10)
    with pytest.raises(RDMAError, match=r"RDMABuffer #9 \(test\) is no longer registered"):
        conn.read(remote, 0, _local(ten), time.monotonic() + 5)
    with pytest.raises(RDMAError, match="no longer registered"):
        conn.write(remote, 0, _local(ten), time.monotonic() + 5)


def test_a_pid_with_another_start_time_is_not_read() -> None:
    b, src, region, d, remote, conn = _setup()
    conn.start = (conn.start or 0) + 1  # as if the pid had been reused
    ten = bytearray(10)
    with pytest.raises(SupervisionError, match="is gone"):
        conn.read(remote, 0, _local(ten), time.monotonic() + 5)


def test_reachability_and_messages() -> None:
    b = ProcessVmBackend()
    assert "another host" in b.reachable(RDMAPeer("p", "other-boot/1", 1, {}))
    assert b.reachable(RDMAPeer("p", host_key(), 1, {})) is None
    assert b.register(MemoryRegion(0x1000, 10, "cuda:0")) is None
    from monarch_transport_rdma._cma import _Connection

    msg = _Connection("proc-1", 123, None).explain(errno.EPERM, "a test read")
    assert "not permitted (EPERM)" in msg and ptrace_policy() in msg and "next backend" in msg
