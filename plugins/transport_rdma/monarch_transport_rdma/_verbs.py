"""The ``ibverbs`` backend: one-sided RDMA READ/WRITE over RC queue pairs.

Owner side: every buffer is a memory region (``ibv_reg_mr``, remote read,
and remote write unless the memory is read-only) of one protection domain;
its handle carries the region's address and ``rkey``.  A holder connecting
sends its queue pair's number, packet sequence number, LID and GID
(``exchange``); the owner's RDMA service creates a queue pair for it, moves it
to RTR/RTS towards the holder's and answers with its own; the holder then
moves its queue pair to RTS.  A transfer registers the holder's memory,
posts RDMA READs (or WRITEs) of at most ``CHUNK`` bytes each, ``DEPTH`` at a
time, and polls the completion queue until every one has completed, a
completion is an error (``RDMAError`` with its status), or the deadline
passes (``TimeoutError``; the queue pair is then reset and the connection
dropped).  The owner's CPU takes no part.

``pyverbs`` (Debian/Ubuntu: ``apt install python3-pyverbs``; in a venv, link
``/usr/lib/python3/dist-packages/pyverbs`` into its site-packages) is
imported only in :class:`_PyVerbs`.  Every verbs call the backend makes goes
through the small interface of :class:`_PyVerbs` (devices, memory regions,
queue pairs, completions), so that the logic above is testable without a
device: the project's tests drive it with a *mock* verbs layer (in-process,
``plugins/transport_rdma/tests/_mock_verbs.py``), because no RDMA device can
exist on the machines they run on.  The pyverbs calls themselves have not
run against a device here (docs/rdma.md says so).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable, Mapping

from monarch_transport_rdma import _settings
from monarch_core.errors import RDMAError
from monarch_core.hookspecs import MemoryRegion, RDMABackend, RDMAConnection, RDMAPeer, RemoteRegion

__all__ = ["VerbsBackend"]

CHUNK = 1 << 30  # bytes per work request (the port's max_msg_sz may lower it)
DEPTH = 16  # work requests in flight per transfer
INSTALL_HINT = ("apt install python3-pyverbs (Debian/Ubuntu); in a virtual environment link it: "
                "ln -s /usr/lib/python3/dist-packages/pyverbs <venv>/lib/python3.X/site-packages/")


class _PyVerbs:
    """The verbs calls the backend makes, over pyverbs (the only place that imports it)."""

    def __init__(self) -> None:
        import pyverbs.enums as e  # noqa: F401 - ImportError: not installed
        from pyverbs.device import get_device_list

        self.e = e
        self._get_device_list = get_device_list

    def devices(self) -> list[str]:
        return [d.name.decode() if isinstance(d.name, bytes) else str(d.name) for d in self._get_device_list()]

    def open(self, name: str) -> Any:
        return _Device(self, name)


class _Device:
    def __init__(self, v: _PyVerbs, name: str) -> None:
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.v = v
        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.port = 1
        attr = self.ctx.query_port(self.port)
        self.lid = int(attr.lid)
        self.mtu = attr.active_mtu
        self.max_msg = int(getattr(attr, "max_msg_sz", CHUNK) or CHUNK)
        self.gid_index = 0
        self.gid = str(self.ctx.query_gid(self.port, self.gid_index))
        self._CQ = CQ

    def info(self) -> dict:
        return {"lid": self.lid, "gid": self.gid, "port": self.port, "max_msg": self.max_msg}

    def reg_mr(self, addr: int, nbytes: int, remote_write: bool) -> Any:
        from pyverbs.mr import MR

        e = self.v.e
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ
        if remote_write:
            access |= e.IBV_ACCESS_REMOTE_WRITE
        return MR(self.pd, nbytes, access, address=addr)  # .lkey, .rkey, .close()

    def create_qp(self) -> Any:
        return _QP(self)


class _QP:
    def __init__(self, dev: _Device) -> None:
        from pyverbs.qp import QP, QPCap, QPInitAttr

        e = dev.v.e
        self.dev = dev
        self.cq = dev._CQ(dev.ctx, 2 * DEPTH)
        cap = QPCap(max_send_wr=DEPTH, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(dev.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=1))
        self.psn = random.getrandbits(24)

    def info(self) -> dict:
        return {"qpn": int(self.qp.qp_num), "psn": self.psn, **self.dev.info()}

    def connect(self, remote: Mapping[str, Any]) -> None:
        from pyverbs.addr import AHAttr, GlobalRoute
        from pyverbs.addr import GID
        from pyverbs.qp import QPAttr

        e = self.dev.v.e
        attr = QPAttr(port_num=self.dev.port)
        attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
        attr.path_mtu = self.dev.mtu
        attr.dest_qp_num = int(remote["qpn"])
        attr.rq_psn = int(remote["psn"])
        attr.max_dest_rd_atomic = 16
        attr.min_rnr_timer = 12
        gr = GlobalRoute(dgid=GID(str(remote["gid"])), sgid_index=self.dev.gid_index)
        attr.ah_attr = AHAttr(port_num=self.dev.port, dlid=int(remote["lid"]), is_global=1, grh=gr)
        self.qp.to_rtr(attr)
        attr.sq_psn = self.psn
        attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 14, 7, 7, 16
        self.qp.to_rts(attr)

    def post(self, write: bool, wr_id: int, laddr: int, lkey: int, nbytes: int, raddr: int, rkey: int) -> None:
        from pyverbs.wr import SGE, SendWR

        e = self.dev.v.e
        op = e.IBV_WR_RDMA_WRITE if write else e.IBV_WR_RDMA_READ
        wr = SendWR(wr_id=wr_id, opcode=op, num_sge=1, sg=[SGE(laddr, nbytes, lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(rkey, raddr)
        self.qp.post_send(wr)

    def poll(self, n: int) -> list[tuple[int, bool, str]]:
        """Completions: ``(wr_id, succeeded, status)``."""
        npolled, wcs = self.cq.poll(num_entries=n)
        ok = self.dev.v.e.IBV_WC_SUCCESS
        return [(int(wc.wr_id), wc.status == ok, f"status {wc.status}, vendor error {wc.vendor_err}")
                for wc in wcs[:npolled]]

    def close(self) -> None:
        for x in (self.qp, self.cq):
            try:
                x.close()
            except Exception:  # noqa: BLE001
                pass


class VerbsBackend(RDMABackend):
    """See the module docstring.  ``verbs``: the verbs layer (default: pyverbs)."""

    name = "ibverbs"

    def __init__(self, verbs: Any = None) -> None:
        self._verbs = verbs
        self._dev: Any = None
        self._mrs: dict[int, Any] = {}  # rkey -> memory region (owner side)
        self._qps: list[Any] = []  # queue pairs made for holders (owner side)
        self._lock = threading.Lock()
        self._why: str | None = None
        self._opened = False

    def _device(self) -> Any:
        if not self._opened:
            self._opened = True
            self._why = self._open()
        if self._why is not None:
            raise RDMAError(f"ibverbs is not available: {self._why}")
        return self._dev

    def _open(self) -> str | None:
        try:
            v = self._verbs if self._verbs is not None else _PyVerbs()
        except ImportError as e:
            return f"pyverbs is not installed ({e}): {INSTALL_HINT}"
        try:
            names = v.devices()
        except Exception as e:  # noqa: BLE001 - pyverbs raises PyverbsRDMAError and friends
            return (f"no RDMA device: listing the devices failed ({type(e).__name__}: {e}); this kernel has no "
                    "RDMA support or no device (see /sys/class/infiniband)")
        if not names:
            return "no RDMA device found (ibv_get_device_list returned none)"
        want = _settings.get("MONARCH_RDMA_DEVICE")
        if want and want not in names:
            return f"MONARCH_RDMA_DEVICE={want!r} is not among this host's RDMA devices: {names}"
        name = want or names[0]
        try:
            self._dev = v.open(name)
        except Exception as e:  # noqa: BLE001
            return f"cannot open RDMA device {name!r}: {type(e).__name__}: {e}"
        return None

    def unavailable(self) -> str | None:
        try:
            self._device()
        except RDMAError:
            return self._why
        return None

    def announce(self) -> Mapping[str, Any]:
        return self._device().info()

    def register(self, region: MemoryRegion) -> Mapping[str, Any] | None:
        if region.device != "cpu":
            return None  # GPU memory would need GPUDirect (peer memory): not done; the channel stages it
        try:
            mr = self._device().reg_mr(region.addr, region.nbytes, region.writable)
        except RDMAError:
            raise
        except Exception as e:  # noqa: BLE001
            raise RDMAError(f"ibv_reg_mr of {region.nbytes} bytes failed: {type(e).__name__}: {e}") from None
        with self._lock:
            self._mrs[int(mr.rkey)] = mr
        return {"rkey": int(mr.rkey)}

    def deregister(self, region: MemoryRegion, descriptor: Mapping[str, Any]) -> None:
        with self._lock:
            mr = self._mrs.pop(int(descriptor["rkey"]), None)
        if mr is not None:
            mr.close()  # remote access through its rkey fails from now on

    def accept(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        qp = self._device().create_qp()
        try:
            qp.connect(request)
        except Exception as e:  # noqa: BLE001
            qp.close()
            raise RDMAError(f"cannot connect a queue pair to the holder's: {type(e).__name__}: {e}") from None
        with self._lock:
            self._qps.append(qp)
        return qp.info()

    def connect(self, peer: RDMAPeer, exchange: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> RDMAConnection:
        dev = self._device()
        qp = dev.create_qp()
        try:
            answer = exchange(qp.info())
            qp.connect(answer)
        except RDMAError:
            qp.close()
            raise
        except Exception as e:  # noqa: BLE001
            qp.close()
            raise RDMAError(f"cannot connect a queue pair to {peer.proc_id}: {type(e).__name__}: {e}") from None
        chunk = min(CHUNK, int(answer.get("max_msg", CHUNK)), int(dev.info().get("max_msg", CHUNK)))
        return _Connection(dev, qp, peer.proc_id, chunk)


class _Connection(RDMAConnection):
    def __init__(self, dev: Any, qp: Any, proc_id: str, chunk: int) -> None:
        self.dev = dev
        self.qp = qp
        self.proc_id = proc_id
        self.chunk = max(1, chunk)
        self.lock = threading.Lock()  # one completion queue: one transfer at a time
        self.broken: str | None = None

    def read(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        self._run(False, remote, offset, local, deadline)

    def write(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        if not remote.writable:
            raise RDMAError(f"{remote.name} is read-only")
        self._run(True, remote, offset, local, deadline)

    def _run(self, write: bool, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        what = f"RDMA {'WRITE to' if write else 'READ of'} {remote.name}"
        with self.lock:
            if self.broken:
                raise RDMAError(f"{what}: the queue pair to {self.proc_id} is unusable: {self.broken}")
            n = local.nbytes
            if n == 0:
                return
            try:
                mr = self.dev.reg_mr(local.addr, n, True)
            except Exception as e:  # noqa: BLE001
                raise RDMAError(f"{what}: registering the local memory failed: {type(e).__name__}: {e}") from None
            try:
                self._post_all(write, remote, offset, local.addr, mr.lkey, n, deadline, what)
            finally:
                mr.close()

    def _post_all(self, write: bool, remote: RemoteRegion, offset: int, laddr: int, lkey: int, n: int,
                  deadline: float, what: str) -> None:
        rkey = int(remote.descriptor["rkey"])
        count = -(-n // self.chunk)
        posted = completed = 0
        while completed < count:
            while posted < count and posted - completed < DEPTH:
                off = posted * self.chunk
                m = min(self.chunk, n - off)
                try:
                    self.qp.post(write, posted, laddr + off, lkey, m, remote.addr + offset + off, rkey)
                except Exception as e:  # noqa: BLE001
                    self._break(f"post_send failed: {e}")
                    raise RDMAError(f"{what}: posting a work request failed: {type(e).__name__}: {e}") from None
                posted += 1
            for wr_id, ok, status in self.qp.poll(DEPTH):
                if not ok:
                    self._break(status)
                    raise RDMAError(f"{what}: work request {wr_id} completed with an error ({status}); "
                                    "a dropped buffer or a stopped owner refuses remote access")
                completed += 1
            if completed < count and time.monotonic() > deadline:
                self._break("a transfer timed out with work requests outstanding")
                raise TimeoutError(f"{what}: {completed} of {count} work requests completed when the timeout passed")

    def _break(self, why: str) -> None:
        self.broken = why
        self.qp.close()

    def close(self) -> None:
        self.qp.close()
