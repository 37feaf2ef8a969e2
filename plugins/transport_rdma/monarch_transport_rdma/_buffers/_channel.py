"""The ``channel`` backend: the fallback that reaches every owner proc.

A transfer is cut into ``MONARCH_RDMA_CHUNK_MB`` requests to the owner proc's
RDMA service (``_service``), ``MONARCH_RDMA_PIPELINE`` of them in flight: a
read's bytes come back as out-of-band parts of the replies (sent from the
owner's memory without a copy, received into pooled buffers and copied into
the destination by the thread that read them); a write's go with the
requests.  Between two chunks any other message of the same session passes,
and the owner's replies wait for room in its send window like any other
sender's (``MONARCH_SEND_WINDOW_MB``), so a large transfer neither starves
the session nor floods the owner's memory.

Two-sided at the proc level: the owner's *proc* serves (its service thread),
never its actors.  Built into the core because it is the proc runtime's own
session and service; plugins provide the one-sided backends.
"""

from __future__ import annotations

import marshal
import threading
import time
from typing import Any, Mapping

from monarch_transport_rdma import _settings
from monarch_core import runtime
from monarch_core.runtime import Cell, PortHandler
from monarch_transport_rdma._buffers import _proto
from monarch_core.errors import SupervisionError
from monarch_core.hookspecs import MemoryRegion, RDMABackend, RDMAConnection, RDMAPeer, RemoteRegion

__all__ = ["ChannelBackend", "ChannelConnection"]

CHUNK: int = _settings.get("MONARCH_RDMA_CHUNK_MB") << 20
PIPELINE: int = _settings.get("MONARCH_RDMA_PIPELINE")


class ChannelBackend(RDMABackend):
    """See the module docstring."""

    name = "channel"
    one_sided = False

    def announce(self) -> Mapping[str, Any]:
        return {"address": runtime.local_ref()[1], "port": _proto.service_port}

    def register(self, region: MemoryRegion) -> Mapping[str, Any] | None:
        return {}  # the core's service serves every registration (device memory included, staged)

    def connect(self, peer: RDMAPeer, exchange: Any) -> RDMAConnection:
        return ChannelConnection(peer.proc_id, peer.announce["address"], int(peer.announce["port"]))


class ChannelConnection(RDMAConnection):
    def __init__(self, proc_id: str, address: str, port: int) -> None:
        self.proc_id = proc_id
        self.address = address
        self.port = port

    def read(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        _Chunks(self, "r", remote, offset, local).run(deadline)

    def write(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        _Chunks(self, "w", remote, offset, local).run(deadline)


class _Chunks(PortHandler):
    """One transfer's requests and replies (its own port)."""

    def __init__(self, conn: ChannelConnection, op: str, remote: RemoteRegion, offset: int,
                 local: MemoryRegion) -> None:
        import ctypes

        self.conn = conn
        self.op = op
        self.remote = remote
        self.rid = int(remote.descriptor["id"])
        self.key = int(remote.descriptor["key"])
        self.offset = offset
        self.n = local.nbytes
        self.view = memoryview((ctypes.c_char * self.n).from_address(local.addr)).cast("B") if self.n else None
        self.count = max(1, -(-self.n // CHUNK))
        self.next = 0
        self.finished = 0
        self.lock = threading.Lock()
        self.cell = Cell()
        self.port_id = runtime.open_port(self)
        self.ref = (*runtime.local_ref(), self.port_id)

    def run(self, deadline: float) -> None:
        if self.n == 0:
            self._end()
            return
        with self.lock:
            first = list(range(min(PIPELINE, self.count)))
            self.next = len(first)
        try:
            for i in first:
                self._send(i)
            left = deadline - time.monotonic()
            if left <= 0 or not self.cell.wait(left):
                raise TimeoutError(
                    f"{'reading' if self.op == 'r' else 'writing'} {self.n} bytes of {self.remote.name}: "
                    f"{self.finished * CHUNK if self.finished < self.count else self.n} of {self.n} bytes moved "
                    "when the timeout passed"
                )
            self.cell.result()
        finally:
            self._end()

    def _send(self, i: int) -> None:
        off = i * CHUNK
        m = min(CHUNK, self.n - off)
        req = (self.op, self.rid, self.key, self.offset + off, m, self.ref, i)
        bufs = [self.view[off:off + m]] if self.op == "w" else []  # type: ignore[index]  # (a view: n > 0 to send)
        c = self.conn
        runtime.send_to_port(c.proc_id, c.address, c.port, marshal.dumps(req), bufs, reply_port=self.port_id)

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        if self.cell.done():
            return
        try:
            if status != _proto.OK:
                _proto.raise_error(payload, f"{'read of' if self.op == 'r' else 'write to'} {self.remote.name}")
            if self.op == "r":
                off = rank * CHUNK
                m = min(CHUNK, self.n - off)
                data = memoryview(buffers[0]).cast("B") if buffers else memoryview(b"")
                if data.nbytes != m:
                    raise ValueError(f"read of {self.remote.name}: {data.nbytes} bytes came back for a {m}-byte chunk")
                self.view[off:off + m] = data  # type: ignore[index]
                data.release()
        except BaseException as e:  # noqa: BLE001 - the transfer's outcome
            self.cell.set_exception(e)
            return
        with self.lock:
            self.finished += 1
            done = self.finished == self.count
            nxt = self.next if self.next < self.count else None
            if nxt is not None:
                self.next += 1
        if nxt is not None:
            try:
                self._send(nxt)
            except BaseException as e:  # noqa: BLE001
                self.cell.set_exception(e)
                return
        if done:
            self.cell.set_result(None)

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        if isinstance(exc, SupervisionError):
            exc = SupervisionError(f"the owner of {self.remote.name} died during the transfer: {exc}")
        self.cell.set_exception(exc)

    def _end(self) -> None:
        runtime.close_port(self.port_id, self.conn.proc_id)
