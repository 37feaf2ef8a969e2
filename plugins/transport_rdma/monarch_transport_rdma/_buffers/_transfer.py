"""Running transfers: validation, a few threads, deadlines, device staging.

Each operation (a read into local memory, a write from it) is checked in the
caller's thread (sizes, memory, a buffer this copy dropped), then run on one
of ``MONARCH_RDMA_THREADS`` transfer threads through the connection that
:func:`_backends.route` picked.  Local device memory (CUDA) is staged through
host memory here; the owner's device memory is staged by the owner's service
(the ``channel`` backend), unless a backend registered it directly.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any

from monarch_transport_rdma import _settings
from monarch_core import runtime
from monarch_core.runtime import Cell, Future
from monarch_transport_rdma._buffers import _backends
from monarch_transport_rdma._buffers._handle import Handle
from monarch_transport_rdma._buffers._memory import Local, local_memory
from monarch_core.errors import RDMAError, SupervisionError

logger = logging.getLogger("monarch.rdma")

THREADS: int = _settings.get("MONARCH_RDMA_THREADS")


class Op:
    """One read (``"r"``: remote -> local) or write (``"w"``: local -> remote) of ``nbytes``."""

    __slots__ = ("kind", "handle", "local", "nbytes", "path")

    def __init__(self, kind: str, handle: Handle, local: Local, nbytes: int) -> None:
        self.kind = kind
        self.handle = handle
        self.local = local
        self.nbytes = nbytes
        self.path: tuple | None = None  # (backend, connection, remote region), from ``_backends.route``

    def describe(self) -> str:
        if self.kind == "r":
            return f"read of {self.handle.name()} into dst {self.local.what}"
        return f"write of src {self.local.what} ({self.nbytes} bytes) into {self.handle.name()}"


def check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def _check_live(h: Handle) -> None:
    if h.dropped:
        raise RDMAError(f"{h.name()} was dropped (drop() was called on this handle); it can no longer be used")


def read_op(h: Handle, dst: Any) -> Op:
    _check_live(h)
    local = local_memory(dst, role="dst", writable=True)
    if local.nbytes < h.size:
        raise ValueError(
            f"dst is too small for {h.name()}: dst ({local.what}) holds {local.nbytes} bytes, the buffer "
            f"{h.size}; pass a dst of at least {h.size} bytes (read_into fills its first {h.size} bytes)"
        )
    return Op("r", h, local, h.size)


def write_op(h: Handle, src: Any) -> Op:
    _check_live(h)
    local = local_memory(src, role="src", writable=False)
    if local.nbytes > h.size:
        raise ValueError(
            f"src is too large for {h.name()}: src ({local.what}) holds {local.nbytes} bytes, the buffer "
            f"{h.size}; pass at most {h.size} bytes (write_from writes from the buffer's start)"
        )
    if not h.writable:
        raise ValueError(f"{h.name()} is read-only (it was created over read-only memory such as bytes)")
    return Op("w", h, local, local.nbytes)


def check_overlaps(ops: list[Op]) -> None:
    """Two reads of one batch into overlapping local memory would race: refuse them."""
    spans = sorted((o.local.addr, o.local.addr + o.nbytes, i) for i, o in enumerate(ops)
                   if o.kind == "r" and o.nbytes and o.local.device == "cpu")
    for (_a0, a1, i), (b0, _b1, j) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ValueError(
                f"operations {min(i, j)} and {max(i, j)} of this RDMAAction read into overlapping local memory "
                f"({ops[i].describe()}; {ops[j].describe()}): their order is undefined; use separate dst memory"
            )


def submit(ops: list[Op], timeout: float) -> Future[None]:
    """Run ``ops`` (at once, in parallel); the future resolves when all are
    done, or with the first error."""
    cell = Cell()
    if not ops:
        cell.set_result(None)
        return runtime.future_of(cell)
    runtime.start()
    deadline = time.monotonic() + timeout
    paths = []
    for op in ops:  # on the caller's thread: cached after the first transfer to an owner proc
        try:
            paths.append(_backends.route(op.handle))
        except BaseException as e:  # noqa: BLE001 - the future's outcome
            cell.set_exception(_explain(op, e, timeout))
            return runtime.future_of(cell)
    batch = _Batch(cell, len(ops))
    pool = _pool()
    for op, path in zip(ops, paths):
        pool.put((op, path, deadline, timeout, batch))
    return runtime.future_of(cell)


class _Batch:
    __slots__ = ("cell", "left", "lock")

    def __init__(self, cell: Cell, n: int) -> None:
        self.cell = cell
        self.left = n
        self.lock = threading.Lock()

    def done(self, exc: BaseException | None) -> None:
        if exc is not None:
            self.cell.set_exception(exc)
            return
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.cell.set_result(None)


def run_op(op: Op, path: tuple, deadline: float) -> None:
    """Run one operation on this thread (blocking) through ``path``."""
    name, conn, remote = path
    n = op.nbytes
    local = op.local
    if local.device == "cpu":
        region = local.sub(0, n)
        (conn.read if op.kind == "r" else conn.write)(remote, 0, region, deadline)
        return
    import torch  # local device memory: through host memory

    from monarch_core.hookspecs import MemoryRegion

    host = torch.empty(n, dtype=torch.uint8)
    region = MemoryRegion(host.data_ptr(), n)
    if op.kind == "r":
        conn.read(remote, 0, region, deadline)
        local.tensor[:n].copy_(host)
    else:
        host.copy_(local.tensor[:n])
        conn.write(remote, 0, region, deadline)


def _explain(op: Op, e: BaseException, timeout: float) -> BaseException:
    what = op.describe()
    if isinstance(e, TimeoutError):
        return TimeoutError(f"{what} did not finish within its timeout of {timeout:g} s ({e})")
    if isinstance(e, SupervisionError):
        dead = runtime.proc_death(op.handle.proc[0])
        return SupervisionError(f"{what} failed: the owner's proc is gone: {dead or e}")
    if isinstance(e, (RDMAError, ValueError)):
        msg = str(e)
        return type(e)(msg if op.handle.name() in msg else f"{what} failed: {msg}")
    return RDMAError(f"{what} failed: {type(e).__name__}: {e}")


class _Pool:
    def __init__(self, n: int) -> None:
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._work, name=f"monarch-rdma-{i}", daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def put(self, item: tuple) -> None:
        self.q.put(item)

    def _work(self) -> None:
        while True:
            op, path, deadline, timeout, batch = self.q.get()
            try:
                if batch.cell.done():  # an earlier op of the batch failed
                    batch.done(None)
                    continue
                run_op(op, path, deadline)
            except BaseException as e:  # noqa: BLE001 - the operation's outcome
                batch.done(_explain(op, e, timeout))
            else:
                batch.done(None)
            finally:
                op = path = batch = None


_the_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _pool() -> _Pool:
    global _the_pool
    p = _the_pool
    if p is None:
        with _pool_lock:
            if _the_pool is None:
                _the_pool = _Pool(THREADS)
            p = _the_pool
    return p
