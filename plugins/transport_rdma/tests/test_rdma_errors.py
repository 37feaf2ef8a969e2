"""Lifecycle and errors: each a clear error naming the buffer, its owner and
the sizes, never a hang."""

from __future__ import annotations

import os
import signal
import time

import pytest

from monarch_core.actor import this_host
from monarch_core.errors import RDMAError, SupervisionError
from monarch_core.rdma import RDMAAction, RDMABuffer

from rdma_actors import Owner, Reader, pattern, require_backend


def _freeze(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped (the signal is asynchronous)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.005)
    raise AssertionError(f"pid {pid} did not stop")


@pytest.fixture
def lone_owner(meshes):
    """An owner in a proc of its own, for tests that stop, freeze or kill it."""
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="rdma_lone")
    meshes.append(procs)
    mesh = procs.spawn("lone", Owner)
    return procs, mesh, mesh.pid.call_one().get(timeout=60)


def test_dst_too_small_and_src_too_large_name_the_buffer_owner_and_sizes(owner) -> None:
    buf = owner.make.call_one("bytearray", 1000, 1).get(timeout=60)
    with pytest.raises(ValueError) as e:
        buf.read_into(bytearray(999))
    msg = str(e.value)
    assert "dst is too small" in msg and "999 bytes" in msg and "1000" in msg and buf.owner in msg
    assert f"RDMABuffer #{buf._h.id}" in msg
    with pytest.raises(ValueError) as e:
        buf.write_from(bytearray(1001))
    assert "src is too large" in str(e.value) and "1001 bytes" in str(e.value) and buf.owner in str(e.value)
    with pytest.raises(ValueError, match="too small"):
        RDMAAction().read_remote(bytearray(10), buf)


def test_unsuitable_memory_is_refused_with_the_fix() -> None:
    torch = pytest.importorskip("torch")
    t = torch.zeros(64, 64).t()
    with pytest.raises(ValueError, match=r"not contiguous.*contiguous\(\)"):
        RDMABuffer(t)
    buf = RDMABuffer(bytearray(64 * 64 * 4))
    with pytest.raises(ValueError, match="dst .* is not contiguous"):
        buf.read_into(t)
    with pytest.raises(ValueError, match="read-only"):
        buf.read_into(bytes(1 << 20))
    with pytest.raises(ValueError, match="requires grad"):
        buf.read_into(torch.zeros(4096, requires_grad=True))
    with pytest.raises(ValueError, match="0 bytes"):
        RDMABuffer(bytearray())
    with pytest.raises(TypeError, match="buffer protocol"):
        RDMABuffer("not memory")
    with pytest.raises(ValueError, match="C-contiguous"):
        RDMABuffer(memoryview(bytearray(100))[::2])
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        buf.read_into(bytearray(1 << 16), timeout=0)
    with pytest.raises(TypeError, match="must be an RDMABuffer"):
        RDMAAction().read_remote(bytearray(4), bytearray(4))
    buf.drop().get(timeout=10)


@pytest.mark.parametrize("backend", ["process_vm", "channel"])
def test_a_dropped_buffer_fails_every_later_transfer(owner, reader, backend, monkeypatch) -> None:
    require_backend(backend)
    monkeypatch.setenv("MONARCH_RDMA_BACKEND", backend)
    buf = owner.make.call_one("bytearray", 4096, 2).get(timeout=60)
    copy = RDMABuffer._of(type(buf._h)(*buf._h.__reduce__()[1]))  # another holder's copy of the handle
    buf.read_into(bytearray(4096)).get(timeout=60)
    buf.drop().get(timeout=60)
    buf.drop().get(timeout=60)  # twice: a no-op
    with pytest.raises(RDMAError, match="was dropped"):
        buf.read_into(bytearray(4096))
    with pytest.raises(RDMAError) as e:
        copy.read_into(bytearray(4096)).get(timeout=60)
    assert f"RDMABuffer #{buf._h.id}" in str(e.value) and buf.owner in str(e.value)
    assert "dropped" in str(e.value) or "no longer registered" in str(e.value)
    with pytest.raises(Exception) as e:  # the reader's proc learns it the same way
        reader.read.call_one(copy, backend, 4096, 2).get(timeout=60)
    assert "RDMAError" in str(e.value)


def test_the_owners_own_drop(owner, backend) -> None:
    buf = owner.make.call_one("bytearray", 4096, 3).get(timeout=60)
    owner.drop.call_one(3).get(timeout=60)
    owner.drop.call_one(3).get(timeout=60)  # twice: a no-op
    with pytest.raises(RDMAError, match="dropped|no longer registered"):
        buf.read_into(bytearray(4096)).get(timeout=60)
    buf.drop().get(timeout=60)  # a holder's drop after the owner's: a no-op


def test_registrations_end_when_the_owner_actor_stops(lone_owner, backend) -> None:
    procs, mesh, _pid = lone_owner
    other = procs.spawn("other", Owner)  # same proc, stays
    bufs = [mesh.make.call_one("bytearray", 1 << 20, 10 + i).get(timeout=60) for i in range(3)]
    mine = other.make.call_one("bytearray", 100, 20).get(timeout=60)
    assert other.live.call_one().get(timeout=60) == 4
    mesh.stop().get(timeout=60)
    assert other.live.call_one().get(timeout=60) == 1  # only the other actor's buffer is left
    for b in bufs:
        with pytest.raises(RDMAError) as e:
            b.read_into(bytearray(1 << 20)).get(timeout=60)
        assert b.owner in str(e.value)
        if backend == "channel":
            assert "stopped" in str(e.value)
    mine.read_into(bytearray(100)).get(timeout=60)


def test_a_read_past_its_timeout_is_a_timeout_error_naming_the_buffer(lone_owner, monkeypatch) -> None:
    monkeypatch.setenv("MONARCH_RDMA_BACKEND", "channel")
    procs, mesh, pid = lone_owner
    buf = mesh.make.call_one("bytearray", 4 << 20, 30).get(timeout=60)
    _freeze(pid)  # the owner's proc cannot serve the channel
    try:
        t = time.monotonic()
        fut = buf.read_into(bytearray(4 << 20), timeout=1.0)
        with pytest.raises(TimeoutError) as e:
            fut.get(timeout=60)
        assert time.monotonic() - t < 50  # it did not wait for the get()'s own 60 s
        msg = str(e.value)
        assert f"RDMABuffer #{buf._h.id}" in msg and buf.owner in msg and str(4 << 20) in msg and "1 s" in msg
    finally:
        os.kill(pid, signal.SIGCONT)
    buf.read_into(bytearray(4 << 20)).get(timeout=60)  # and it works again


def test_process_vm_is_one_sided_a_frozen_owner_is_still_read(lone_owner, monkeypatch) -> None:
    require_backend("process_vm")
    monkeypatch.setenv("MONARCH_RDMA_BACKEND", "process_vm")
    procs, mesh, pid = lone_owner
    n = 8 << 20
    buf = mesh.make.call_one("bytearray", n, 31).get(timeout=60)
    _freeze(pid)
    try:
        dst = bytearray(n)
        buf.read_into(dst, timeout=30).get(timeout=60)
        assert dst == pattern(n, 31)
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("backend", ["process_vm", "channel"])
def test_owner_death_during_a_read_is_a_supervision_error(lone_owner, backend, monkeypatch, faults) -> None:
    require_backend(backend)
    monkeypatch.setenv("MONARCH_RDMA_BACKEND", backend)
    procs, mesh, pid = lone_owner
    n = 64 << 20
    buf = mesh.make.call_one("bytearray", n, 40).get(timeout=60)
    buf.read_into(bytearray(n)).get(timeout=60)  # connected
    if backend == "channel":
        _freeze(pid)  # the read is under way and cannot finish ...
        fut = buf.read_into(bytearray(n), timeout=120)
        time.sleep(0.3)
        assert not fut.done()
        os.kill(pid, signal.SIGKILL)  # ... when the owner dies
    else:
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
        fut = buf.read_into(bytearray(n), timeout=120)
    with pytest.raises(SupervisionError) as e:
        fut.get(timeout=60)
    assert f"RDMABuffer #{buf._h.id}" in str(e.value) and "gone" in str(e.value)


def test_eperm_from_ptrace_policy_falls_back_to_the_channel(lone_owner, meshes, monkeypatch) -> None:
    """A holder that may not ptrace the owner (the owner is not dumpable, the
    holder has no CAP_SYS_PTRACE) gets EPERM from process_vm_readv: the core
    falls back to the channel and says why."""
    require_backend("process_vm")
    procs, mesh, _pid = lone_owner
    mesh.undumpable.call_one().get(timeout=60)
    rprocs = this_host().spawn_procs(per_host={"procs": 1}, name="rdma_noptrace")
    meshes.append(rprocs)
    r = rprocs.spawn("noptrace", Reader)
    r.drop_ptrace.call_one().get(timeout=60)
    n = 1 << 20
    buf = mesh.make.call_one("bytearray", n, 50).get(timeout=60)
    same, used = r.read.call_one(buf, None, n, 50).get(timeout=60)
    assert same and used == "channel"
    with pytest.raises(Exception, match="EPERM"):
        r.read.call_one(buf, "process_vm", n, 50).get(timeout=60)


def test_a_drop_nobody_waits_for_still_drops(lone_owner, poll) -> None:
    procs, mesh, _pid = lone_owner
    buf = mesh.make.call_one("bytearray", 4096, 60).get(timeout=60)
    assert mesh.live.call_one().get(timeout=60) == 1
    buf.drop()  # no .get()
    poll(lambda: mesh.live.call_one().get(timeout=60) == 0, timeout=30, what="the owner to release the buffer")
