"""A MOCK verbs layer for the ``ibverbs`` backend's tests -- not RDMA.

No RDMA device can exist on the project's test machines (the kernel has no
RDMA support), so the backend's own logic (registration, queue-pair
connection through ``exchange``, chunking into work requests, completion
handling, errors, timeouts) is driven through this stand-in for the small
verbs interface of ``monarch_transport_rdma._verbs._PyVerbs``.  It is an
in-process "fabric": memory regions and queue pairs live in one table, a
posted RDMA READ/WRITE is checked (queue-pair state, lkey/rkey, bounds,
access) and executed with ``memmove``, and its completion queued.
"""

from __future__ import annotations

import ctypes
import itertools
from collections import deque


class Fabric:
    def __init__(self, devices=("mock0",), max_msg: int = 1 << 30) -> None:
        self._devices = list(devices)
        self.max_msg = max_msg
        self.mrs: dict[int, "MR"] = {}  # key (lkey == rkey here) -> MR
        self.qps: dict[int, "QP"] = {}
        self.keys = itertools.count(0x100)
        self.qpns = itertools.count(1)
        self.stall = False  # hold completions back (a hung fabric)
        self.posted = 0
        self.max_outstanding = 0
        self.list_error: Exception | None = None

    def devices(self) -> list[str]:
        if self.list_error is not None:
            raise self.list_error
        return list(self._devices)

    def open(self, name: str) -> "Device":
        return Device(self, name)


class Device:
    def __init__(self, fabric: Fabric, name: str) -> None:
        self.fabric = fabric
        self.name = name
        self.lid = 7

    def info(self) -> dict:
        return {"lid": self.lid, "gid": "fe80::1", "port": 1, "max_msg": self.fabric.max_msg}

    def reg_mr(self, addr: int, nbytes: int, remote_write: bool) -> "MR":
        mr = MR(self.fabric, addr, nbytes, remote_write)
        self.fabric.mrs[mr.rkey] = mr
        return mr

    def create_qp(self) -> "QP":
        qp = QP(self)
        self.fabric.qps[qp.qpn] = qp
        return qp


class MR:
    def __init__(self, fabric: Fabric, addr: int, nbytes: int, remote_write: bool) -> None:
        self.fabric = fabric
        self.addr, self.nbytes, self.remote_write = addr, nbytes, remote_write
        self.lkey = self.rkey = next(fabric.keys)

    def covers(self, addr: int, n: int) -> bool:
        return self.addr <= addr and addr + n <= self.addr + self.nbytes

    def close(self) -> None:
        self.fabric.mrs.pop(self.rkey, None)


class QP:
    def __init__(self, dev: Device) -> None:
        self.dev = dev
        self.fabric = dev.fabric
        self.qpn = next(self.fabric.qpns)
        self.psn = 42
        self.peer: int | None = None
        self.state = "RESET"
        self.cq: deque = deque()
        self.outstanding = 0

    def info(self) -> dict:
        return {"qpn": self.qpn, "psn": self.psn, **self.dev.info()}

    def connect(self, remote: dict) -> None:
        if int(remote["qpn"]) not in self.fabric.qps:
            raise RuntimeError(f"no queue pair {remote['qpn']}")
        self.peer = int(remote["qpn"])
        self.state = "RTS"

    def post(self, write: bool, wr_id: int, laddr: int, lkey: int, nbytes: int, raddr: int, rkey: int) -> None:
        if self.state != "RTS":
            raise RuntimeError(f"post_send on a queue pair in state {self.state}")
        if nbytes > self.fabric.max_msg:
            raise RuntimeError(f"message of {nbytes} bytes > max_msg_sz {self.fabric.max_msg}")
        self.fabric.posted += 1
        self.outstanding += 1
        self.fabric.max_outstanding = max(self.fabric.max_outstanding, self.outstanding)
        local, remote = self.fabric.mrs.get(lkey), self.fabric.mrs.get(rkey)
        if local is None or not local.covers(laddr, nbytes):
            self.cq.append((wr_id, False, "IBV_WC_LOC_PROT_ERR"))
        elif remote is None or not remote.covers(raddr, nbytes) or (write and not remote.remote_write):
            self.cq.append((wr_id, False, "IBV_WC_REM_ACCESS_ERR"))
            self.state = "ERR"
        else:
            if write:
                ctypes.memmove(raddr, laddr, nbytes)
            else:
                ctypes.memmove(laddr, raddr, nbytes)
            self.cq.append((wr_id, True, "IBV_WC_SUCCESS"))

    def poll(self, n: int) -> list:
        if self.fabric.stall:
            return []
        out = []
        while self.cq and len(out) < n:
            out.append(self.cq.popleft())
            self.outstanding -= 1
        return out

    def close(self) -> None:
        self.state = "RESET"
        self.fabric.qps.pop(self.qpn, None)
