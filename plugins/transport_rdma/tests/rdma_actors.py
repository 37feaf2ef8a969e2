"""Actors of the RDMA suite (a module of its own, so procs import them by name)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import random
import time

from monarch_core.actor import Actor, endpoint
from monarch_core.rdma import RDMABuffer


def pattern(n: int, seed: int) -> bytearray:
    """``n`` reproducible pseudo-random bytes (a random block of a prime
    length, repeated: no chunk boundary of a transfer lines up with it)."""
    block = random.Random(seed).randbytes(min(n, 1048573))
    reps = -(-n // len(block)) if n else 0
    out = bytearray(block * reps)
    del out[n:]
    return out


def as_bytes(data) -> memoryview:
    """A byte view of any memory the suite uses (tensors through numpy-free ctypes)."""
    if hasattr(data, "data_ptr"):
        n = data.numel() * data.element_size()
        return memoryview((ctypes.c_char * n).from_address(data.data_ptr())).cast("B")
    return memoryview(data).cast("B")


def digest(data) -> str:
    return hashlib.sha256(as_bytes(data)).hexdigest()


def make_memory(kind: str, n: int, seed: int):
    data = pattern(n, seed)
    if kind == "bytearray":
        return data
    if kind == "memoryview":
        return memoryview(data)
    if kind == "bytes":
        return bytes(data)
    if kind == "tensor":
        import torch

        return torch.frombuffer(data, dtype=torch.uint8).clone()
    if kind == "tensor-f32":
        import torch

        return torch.frombuffer(data, dtype=torch.float32).clone().reshape(-1, 4)
    if kind == "numpy":
        import numpy

        return numpy.frombuffer(data, dtype=numpy.uint8).copy()
    raise ValueError(kind)


class Owner(Actor):
    """Creates buffers over its own memory and reports on it."""

    def __init__(self) -> None:
        self.mem: dict[int, object] = {}
        self.bufs: dict[int, RDMABuffer] = {}

    @endpoint
    def make(self, kind: str, n: int, seed: int) -> RDMABuffer:
        self.mem[seed] = make_memory(kind, n, seed)
        self.bufs[seed] = RDMABuffer(self.mem[seed])
        return self.bufs[seed]

    @endpoint
    def digest(self, seed: int) -> str:
        return digest(self.mem[seed])

    @endpoint
    def sample(self, seed: int, offsets: list) -> list:
        mv = as_bytes(self.mem[seed])
        return [mv[o] for o in offsets]

    @endpoint
    def drop(self, seed: int) -> None:
        self.bufs[seed].drop().get()

    @endpoint
    def forget(self, seed: int) -> None:
        """Let go of the memory (the registration keeps it alive)."""
        self.mem.pop(seed, None)
        self.bufs.pop(seed, None)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def live(self) -> int:
        from monarch_transport_rdma._buffers import _service

        return _service.live_count()

    @endpoint
    def busy(self, seconds: float) -> float:
        """Keep this actor's thread busy (its code does not serve transfers)."""
        t = time.monotonic()
        time.sleep(seconds)
        return time.monotonic() - t

    @endpoint
    def ping(self) -> int:
        return os.getpid()

    @endpoint
    def undumpable(self) -> None:
        """PR_SET_DUMPABLE 0: a holder without CAP_SYS_PTRACE may not ptrace (nor process_vm_readv) us."""
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE


class Reader(Actor):
    """A holder in a proc of its own."""

    @endpoint
    def read(self, buf: RDMABuffer, backend: str | None, n: int, seed: int) -> tuple:
        if backend is not None:
            os.environ["MONARCH_RDMA_BACKEND"] = backend
        dst = bytearray(n)
        buf.read_into(dst).get(timeout=120)
        return dst == pattern(n, seed), buf.backend

    @endpoint
    def write(self, buf: RDMABuffer, backend: str | None, n: int, seed: int) -> str:
        if backend is not None:
            os.environ["MONARCH_RDMA_BACKEND"] = backend
        src = pattern(n, seed)
        buf.write_from(src).get(timeout=120)
        return buf.backend

    @endpoint
    def drop_ptrace(self) -> None:
        """Drop CAP_SYS_PTRACE from this process's effective and permitted sets."""
        libc = ctypes.CDLL(None, use_errno=True)

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        hdr = Header(0x20080522, 0)
        data = (Data * 2)()
        assert libc.capget(ctypes.byref(hdr), data) == 0, ctypes.get_errno()
        bit = 1 << 19  # CAP_SYS_PTRACE
        data[0].effective &= ~bit
        data[0].permitted &= ~bit
        assert libc.capset(ctypes.byref(hdr), data) == 0, ctypes.get_errno()


def require_backend(name: str) -> None:
    """Skip, saying why, when backend ``name`` is not installed in this process."""
    import pytest

    from monarch_transport_rdma._buffers import _backends

    if name not in _backends.load().known:
        pytest.skip(f"the {name} backend is not installed here: pip install -e plugins/transport_rdma "
                    "(its entry point registers it; a PYTHONPATH entry does not)")
