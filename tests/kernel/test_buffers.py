"""Large-message fast paths: pooled receive buffers, bytes received in place,
malloc tuning in procs, large writes from a thread."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys

import pytest

from monarch_core._kernel import _wire as W


def _address(mv: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(mv))


def test_pooled_buffer_is_reused_once_its_consumer_drops_it() -> None:
    pool = W._BufferPool(8 << 20)
    a = pool.take(2 << 20)
    a[:5] = b"hello"
    addr = _address(a)
    b = pool.take(2 << 20)  # ``a`` is still in use: a different buffer
    assert _address(b) != addr
    del a
    gc.collect()
    c = pool.take(2 << 20)
    assert _address(c) == addr  # the freed one came back
    assert not c.readonly and c.nbytes == 2 << 20


def test_pool_keeps_at_most_its_limit_and_sizes_do_not_mix() -> None:
    pool = W._BufferPool(3 << 20)
    bufs = [pool.take(2 << 20) for _ in range(3)]
    del bufs
    gc.collect()
    assert pool._kept == 2 << 20  # one 2 MiB buffer fits under 3 MiB, the others were unmapped
    small = pool.take(1 << 20)
    assert small.nbytes == 1 << 20 and pool._kept == 2 << 20  # not carved out of the 2 MiB one


def test_buffer_outlives_the_pool_entry_while_a_tensor_uses_it() -> None:
    torch = pytest.importorskip("torch")
    pool = W._BufferPool(64 << 20)
    mv = pool.take(4 << 20)
    mv[:] = bytes(range(256)) * (4 << 12)
    t = torch.frombuffer(mv, dtype=torch.uint8)
    del mv
    gc.collect()
    assert pool._kept == 0  # the tensor still holds it
    assert t[:256].tolist() == list(range(256))
    del t
    gc.collect()
    assert pool._kept == 4 << 20


def test_tune_malloc_obeys_its_variable() -> None:
    code = (
        "from monarch_core._launch._proc_main import tune_malloc as t;"
        "print(t({}), t({'MONARCH_MALLOC_REUSE_MB': '0'}), t({'MONARCH_MALLOC_REUSE_MB': 'x'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "False", "False"], out.stderr
    assert "MONARCH_MALLOC_REUSE_MB must be a whole number of MiB >= 0, got 'x'" in out.stderr


def test_procs_reuse_large_buffers(procs_for_buffers) -> None:  # type: ignore[no-untyped-def]
    """In a proc, a second 64 MiB allocation reuses the first's pages (no
    fresh mapping): the page-fault count barely moves."""
    minflt = procs_for_buffers.faults.call_one(64 << 20).get()
    assert minflt[1] < minflt[0] / 4, minflt


@pytest.fixture
def procs_for_buffers():  # type: ignore[no-untyped-def]
    from monarch_core.actor import this_host

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        yield procs.spawn("faults", _Faults)
    finally:
        procs.stop().get()


from monarch_core.actor import Actor, endpoint  # noqa: E402


class _Faults(Actor):
    @endpoint
    def faults(self, n: int) -> list[int]:
        import resource

        out = []
        for _ in range(2):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            b = bytearray(os.urandom(16)) * (n // 16)  # a fresh n-byte buffer, written
            out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            del b
        return out


def test_common_payload_shortcuts_round_trip_and_never_compare_user_objects() -> None:
    from monarch_core._proc import _serial

    class Touchy:
        def __eq__(self, other: object) -> bool:
            raise AssertionError("dumps must not compare user objects")

        __hash__ = object.__hash__

    for obj in (None, ((), {}), ((1,), {}), ((), {"a": 1}), (Touchy(), {}), ([], {})):
        payload, bufs = _serial.dumps(obj)
        back = _serial.loads(payload, bufs)
        if isinstance(obj, tuple) and isinstance(obj[0], Touchy):
            assert type(back[0]).__name__ == "Touchy" and back[1] == {}
        else:
            assert back == obj and type(back) is type(obj)
