"""Reads and writes between procs of one host, through each backend that can
run here (forced by ``MONARCH_RDMA_BACKEND``), exact bytes checked."""

from __future__ import annotations

import random
import threading

import pytest

from monarch_core.rdma import RDMAAction, RDMABuffer

from rdma_actors import as_bytes, digest, make_memory, pattern, require_backend

SIZES = [1, 4097, (1 << 20) + 3, 64 << 20]


def _check(dst, n: int, seed: int) -> None:
    """Every byte, and by name the first, the last and some random offsets."""
    got = as_bytes(dst)[:n]
    want = pattern(n, seed)
    r = random.Random(n)
    for off in [0, n - 1, *(r.randrange(n) for _ in range(16))]:
        assert got[off] == want[off], f"byte {off} of {n}"
    assert got == want


@pytest.mark.parametrize("n", SIZES, ids=lambda n: f"{n}B")
def test_read_into_gets_the_owners_exact_bytes(owner, backend, n) -> None:
    buf = owner.make.call_one("bytearray", n, 1000 + n).get(timeout=60)
    dst = bytearray(n)
    buf.read_into(dst).get(timeout=120)
    _check(dst, n, 1000 + n)
    assert buf.backend == backend and buf.size() == n


@pytest.mark.parametrize("n", SIZES, ids=lambda n: f"{n}B")
def test_write_from_puts_exact_bytes_into_the_owners_memory(owner, backend, n) -> None:
    buf = owner.make.call_one("bytearray", n, 2000 + n).get(timeout=60)
    src = pattern(n, 3000 + n)
    buf.write_from(src).get(timeout=120)
    assert owner.digest.call_one(2000 + n).get(timeout=60) == digest(src)
    r = random.Random(n)
    offs = [0, n - 1, *(r.randrange(n) for _ in range(8))]
    assert owner.sample.call_one(2000 + n, offs).get(timeout=60) == [src[o] for o in offs]


def test_256_mib_both_ways(owner, backend) -> None:
    n = 256 << 20
    buf = owner.make.call_one("bytearray", n, 7).get(timeout=120)
    dst = bytearray(n)
    buf.read_into(dst).get(timeout=120)
    _check(dst, n, 7)
    dst[0], dst[n // 2], dst[n - 1] = 1, 2, 3  # something the owner does not have
    buf.write_from(dst).get(timeout=120)
    assert owner.digest.call_one(7).get(timeout=60) == digest(dst)
    owner.forget.call_one(7).get(timeout=60)
    buf.drop().get(timeout=60)


def test_a_smaller_write_changes_only_the_buffers_first_bytes(owner, backend) -> None:
    buf = owner.make.call_one("bytearray", 10_000, 11).get(timeout=60)
    buf.write_from(b"\xff" * 100).get(timeout=60)
    want = bytearray(pattern(10_000, 11))
    want[:100] = b"\xff" * 100
    assert owner.digest.call_one(11).get(timeout=60) == digest(want)
    dst = bytearray(20_000)  # larger than the buffer: its first 10 000 bytes are filled
    buf.read_into(dst).get(timeout=60)
    assert dst[:10_000] == want and dst[10_000:] == bytes(10_000)


@pytest.mark.parametrize("kind", ["tensor", "tensor-f32", "numpy", "memoryview", "bytes"])
def test_every_kind_of_memory_as_the_buffer_and_as_dst(owner, backend, kind) -> None:
    if kind.startswith("tensor"):
        pytest.importorskip("torch")
    if kind == "numpy":
        pytest.importorskip("numpy", reason="numpy is an optional test dependency")
    n = 1 << 16
    buf = owner.make.call_one(kind, n, 21).get(timeout=60)
    dst = make_memory(kind if kind != "bytes" else "bytearray", n, 0)
    buf.read_into(dst).get(timeout=60)
    assert as_bytes(dst) == pattern(n, 21)
    if kind == "bytes":
        with pytest.raises(ValueError, match="read-only"):
            buf.write_from(b"x")
    else:
        src = make_memory(kind, n, 22)
        buf.write_from(src).get(timeout=60)
        assert owner.digest.call_one(21).get(timeout=60) == digest(pattern(n, 22))


@pytest.mark.parametrize("reader_backend", ["process_vm", "channel"])
def test_between_two_procs_neither_of_them_the_client(owner, reader, reader_backend) -> None:
    require_backend(reader_backend)
    n = 64 << 20
    buf = owner.make.call_one("bytearray", n, 31).get(timeout=60)
    same, used = reader.read.call_one(buf, reader_backend, n, 31).get(timeout=120)
    assert same and used == reader_backend
    assert reader.write.call_one(buf, reader_backend, n, 32).get(timeout=120) == reader_backend
    assert owner.digest.call_one(31).get(timeout=60) == digest(pattern(n, 32))
    owner.forget.call_one(31).get(timeout=60)
    buf.drop().get(timeout=60)


def test_a_buffer_of_this_process_is_copied_in_place() -> None:
    src = pattern(1 << 20, 41)
    buf = RDMABuffer(src)
    assert buf.backend == "local"
    dst = bytearray(1 << 20)
    buf.read_into(dst).get(timeout=30)
    assert dst == src
    buf.write_from(b"abc").get(timeout=30)
    assert src[:3] == b"abc"
    buf.drop().get(timeout=30)


def test_concurrent_readers_of_one_buffer(owner, reader, backend) -> None:
    n = 8 << 20
    buf = owner.make.call_one("bytearray", n, 51).get(timeout=60)
    results: list = []

    def read_one() -> None:
        dst = bytearray(n)
        buf.read_into(dst).get(timeout=120)
        results.append(dst == pattern(n, 51))

    threads = [threading.Thread(target=read_one) for _ in range(6)]
    for t in threads:
        t.start()
    futs = [reader.read.call_one(buf, backend, n, 51) for _ in range(3)]  # and from another proc
    for t in threads:
        t.join(timeout=120)
    assert results == [True] * 6
    assert [f.get(timeout=120) for f in futs] == [(True, backend)] * 3


def test_an_action_batches_reads_and_writes(owner, backend) -> None:
    a = owner.make.call_one("bytearray", 100_000, 61).get(timeout=60)
    b = owner.make.call_one("bytearray", 3 << 20, 62).get(timeout=60)
    c = owner.make.call_one("bytearray", 5000, 63).get(timeout=60)
    da, db = bytearray(100_000), bytearray(3 << 20)
    action = RDMAAction().read_remote(da, a).read_remote(db, b).write_remote(c, pattern(5000, 64))
    assert len(action) == 3
    action.submit(timeout=60).get(timeout=60)
    assert da == pattern(100_000, 61) and db == pattern(3 << 20, 62)
    assert owner.digest.call_one(63).get(timeout=60) == digest(pattern(5000, 64))
    da[:] = bytes(100_000)
    action.submit(timeout=60).get(timeout=60)  # a second submit runs the batch again
    assert da == pattern(100_000, 61)


def test_an_action_refuses_reads_into_overlapping_memory(owner) -> None:
    a = owner.make.call_one("bytearray", 1000, 71).get(timeout=60)
    dst = bytearray(1500)
    mv = memoryview(dst)
    action = RDMAAction().read_remote(mv[:1000], a).read_remote(mv[500:], a)
    with pytest.raises(ValueError, match="overlapping local memory"):
        action.submit()
    assert RDMAAction().submit().get(timeout=5) is None  # an empty batch is done at once


def test_the_owners_actor_code_does_not_run_for_a_transfer(owner, backend) -> None:
    """The owner's actor is busy for the whole transfer: the proc (channel) or
    nobody (process_vm) serves it."""
    n = 16 << 20
    buf = owner.make.call_one("bytearray", n, 81).get(timeout=60)
    busy = owner.busy.call_one(3.0)
    dst = bytearray(n)
    buf.read_into(dst).get(timeout=60)
    assert not busy.done(), "the transfer waited for the owner's actor"
    _check(dst, n, 81)
    busy.get(timeout=30)
