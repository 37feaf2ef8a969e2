"""The owner side: registrations of this process's buffers, and its RDMA service.

A buffer created here is *registered*: kept alive, offered to every available
backend (:meth:`RDMABackend.register`) and given an id and a random key that
its handles carry.  The *service* is a port of this proc's kernel, served by a
thread of its own (``monarch-rdma-service``), never by an actor's thread: it
answers the ``channel`` fallback's chunk reads and writes, ``drop`` requests
from holders, and backends' connection requests (``exchange``).  Its replies
go through ``Kernel.send`` from that thread, so they wait for room in this
proc's send window like any sender (flow control).

Registrations end on ``drop()``, when the owning actor stops
(:func:`release_owner`, called by the proc agent) and with the process.  A
released buffer is unreachable at once; its memory is let go
``MONARCH_RDMA_RELEASE_GRACE`` seconds later.

Requests and replies are ``marshal``-encoded tuples (plain data only).
"""

from __future__ import annotations

import collections
import logging
import marshal
import os
import queue
import secrets
import threading
import time
from typing import Any

from monarch_transport_rdma import _settings
from monarch_core import runtime
from monarch_core.runtime import PortHandler
from monarch_transport_rdma._buffers import _backends, _proto
from monarch_transport_rdma._buffers._proto import E_RDMA, E_VALUE, OK, reply
from monarch_transport_rdma._buffers._memory import Local
from monarch_core.errors import RDMAError
from monarch_core.hookspecs import MemoryRegion

logger = logging.getLogger("monarch.rdma")

__all__ = ["Registration", "register", "release", "release_owner", "release_all", "proc_info", "service"]


RELEASE_GRACE: float = _settings.get("MONARCH_RDMA_RELEASE_GRACE")
_TOMBSTONES = 4096  # ids of released buffers remembered, for "dropped" vs "unknown"


class Registration:
    """One registered buffer of this process."""

    __slots__ = ("id", "key", "local", "owner_key", "owner", "descriptors", "live", "why")

    def __init__(self, rid: int, key: int, local: Local, owner_key: str, owner: str) -> None:
        self.id = rid
        self.key = key
        self.local = local
        self.owner_key = owner_key  # the owning actor's key, "" for the process
        self.owner = owner  # its name, for messages
        self.descriptors: dict[str, Any] = {}
        self.live = True
        self.why = ""

    def name(self) -> str:
        return f"RDMABuffer #{self.id} ({self.local.nbytes} bytes, owner {self.owner})"


_lock = threading.Lock()
_regs: dict[int, Registration] = {}
_released: collections.OrderedDict[int, str] = collections.OrderedDict()  # id -> why
_graves: collections.deque = collections.deque()  # (time to let go, Local)
_ids = iter(range(1, 1 << 62))


def host_key() -> str:
    """This machine and pid namespace: procs with equal keys can name each other's pids."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:  # pragma: no cover - not Linux
        boot = os.uname().nodename
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # pragma: no cover
        ns = 0
    return f"{boot}/{ns}"


_info: tuple | None = None


def proc_info() -> tuple:
    """What every handle of this process carries about it:
    ``(proc_id, address, service port, host key, pid, {backend: announce})``."""
    global _info
    info = _info
    if info is None:
        with _lock:
            if _info is None:
                svc = service()
                _info = (*runtime.local_ref(), svc.port_id, host_key(), os.getpid(), _backends.announces())
            info = _info
    return info


def _on_actor_stopped(actor_key: str, actor_name: str, why: str) -> None:
    release_owner(actor_key, f"its owner {actor_name} stopped ({why})")


def _on_proc_stopped(why: str) -> None:
    release_all(f"its owner's process stopped ({why})")


def register(local: Local, owner_key: str, owner: str) -> Registration:
    """Register ``local`` (owned by actor ``owner_key``, ``""``: the process).
    The registrations of an actor end when it stops, and all of them when the
    process stops (lifecycle events this module subscribes to here)."""
    proc_info()
    runtime.subscribe("actor_stopped", _on_actor_stopped)
    runtime.subscribe("proc_stopped", _on_proc_stopped)
    with _lock:
        rid = next(_ids)
    reg = Registration(rid, secrets.randbits(63), local, owner_key, owner)
    reg.descriptors = _backends.register_all(local.region, reg.name())
    reg.descriptors["channel"] = {"id": rid, "key": reg.key}
    with _lock:
        _regs[rid] = reg
    logger.debug("rdma.register %s backends=%s", reg.name(), sorted(reg.descriptors))
    return reg


def lookup(rid: int, key: int) -> tuple[Registration, Local] | None:
    """The live registration ``rid`` and its memory (taken together: a
    release lets go of ``reg.local``), or ``None``."""
    with _lock:
        reg = _regs.get(rid)
        return (reg, reg.local) if reg is not None and reg.key == key and reg.live else None


def why_gone(rid: int) -> str:
    return _released.get(rid) or "it is not registered in its owner's process (never was, or the process restarted)"


def release(rid: int, key: int, why: str) -> bool:
    """End registration ``rid`` (a wrong key or an unknown id: nothing). True if it was live."""
    with _lock:
        reg = _regs.get(rid)
        if reg is None or reg.key != key:
            return False
        del _regs[rid]
    _end(reg, why)
    return True


def release_owner(owner_key: str, why: str) -> int:
    """End every registration of actor ``owner_key`` (it stopped); how many."""
    with _lock:
        regs = [r for r in _regs.values() if r.owner_key == owner_key]
        for r in regs:
            del _regs[r.id]
    for r in regs:
        _end(r, why)
    return len(regs)


def release_all(why: str) -> None:
    with _lock:
        regs = list(_regs.values())
        _regs.clear()
    for r in regs:
        _end(r, why)


def _end(reg: Registration, why: str) -> None:
    reg.live = False
    reg.why = why
    with _lock:
        _released[reg.id] = why
        while len(_released) > _TOMBSTONES:
            _released.popitem(last=False)
    _backends.deregister_all(reg.local.region, reg.descriptors)
    with _lock:
        local = reg.local
        reg.local = Local(MemoryRegion(0, local.nbytes, local.device, False), None, None, local.what)
        _graves.append((time.monotonic() + RELEASE_GRACE, local))
    logger.debug("rdma.release #%s: %s", reg.id, why)
    _sweep()


def _sweep() -> None:
    now = time.monotonic()
    while _graves and _graves[0][0] <= now:
        try:
            _graves.popleft()
        except IndexError:  # pragma: no cover - another thread swept it
            break


def live_count() -> int:
    """Registrations of this process (tests read it)."""
    return len(_regs)


# ---------------------------------------------------------------- the service


class Service(PortHandler):
    """This proc's RDMA service port (see the module docstring)."""

    def __init__(self) -> None:
        self.port_id = runtime.open_port(self)
        _proto.set_service_port(self.port_id)
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="monarch-rdma-service", daemon=True)
        self.thread.start()

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        self.requests.put((payload, buffers))  # any reading thread: hand over, never work here

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        return None

    def _run(self) -> None:
        while True:
            try:
                payload, buffers = self.requests.get(timeout=RELEASE_GRACE or 1.0)
            except queue.Empty:
                _sweep()
                continue
            try:
                self._serve(marshal.loads(payload), buffers)
            except Exception:  # a malformed request must not end the service
                logger.exception("RDMA service: request dropped")
            finally:
                payload = buffers = None
            if _graves:
                _sweep()

    def _serve(self, req: tuple, buffers: list) -> None:
        op = req[0]
        if op == "r":
            _, rid, key, offset, n, ref, tag = req
            found = self._reg(rid, key, ref, tag, offset, n)
            if found is not None:
                reply(tuple(ref), tag, OK, b"", [_read_view(found[1], offset, n)])
        elif op == "w":
            _, rid, key, offset, n, ref, tag = req
            found = self._reg(rid, key, ref, tag, offset, n)
            if found is None:
                return
            reg, local = found
            if not local.region.writable:
                _proto.error(tuple(ref), tag, E_RDMA, f"{reg.name()} is read-only (it was created over read-only memory)")
                return
            if len(buffers) != 1 or memoryview(buffers[0]).nbytes != n:
                _proto.error(tuple(ref), tag, E_VALUE, f"write to {reg.name()}: {n} bytes announced, other sizes sent")
                return
            _write(local, offset, buffers[0])
            reply(tuple(ref), tag, OK, b"")
        elif op == "d":
            _, rid, key, ref, tag = req
            release(rid, key, "dropped by a holder")
            reply(tuple(ref), tag, OK, b"")
        elif op == "x":
            _, name, request, ref, tag = req
            try:
                answer = _backends.accept(name, request)
            except RDMAError as e:
                _proto.error(tuple(ref), tag, E_RDMA, str(e))
                return
            except Exception as e:  # noqa: BLE001 - a backend's bug: tell the holder
                _proto.error(tuple(ref), tag, E_RDMA, f"the {name} backend of this proc failed: {type(e).__name__}: {e}")
                return
            reply(tuple(ref), tag, OK, marshal.dumps(dict(answer)))
        else:
            logger.warning("RDMA service: unknown request %r dropped", op)

    def _reg(self, rid: int, key: int, ref: Any, tag: int, offset: int, n: int) -> tuple | None:
        found = lookup(rid, key)
        if found is None:
            _proto.error(tuple(ref), tag, E_RDMA, f"RDMABuffer #{rid} is gone: {why_gone(rid)}")
            return None
        reg, local = found
        if offset < 0 or n < 0 or offset + n > local.nbytes:
            _proto.error(tuple(ref), tag, E_VALUE,
                   f"{reg.name()}: bytes [{offset}, {offset + n}) are outside the buffer")
            return None
        return found


def _read_view(local: Local, offset: int, n: int) -> Any:
    if local.device == "cpu":
        return local.view(offset, n)
    import torch  # device memory: staged through host memory here, in the owner

    host = torch.empty(n, dtype=torch.uint8)
    host.copy_(local.tensor[offset:offset + n])
    return Local(MemoryRegion(host.data_ptr(), n), host, None, "staging").view(0, n)


def _write(local: Local, offset: int, data: Any) -> None:
    if local.device == "cpu":
        local.view(offset, memoryview(data).nbytes)[:] = memoryview(data).cast("B")
        return
    import torch

    local.tensor[offset:offset + memoryview(data).nbytes].copy_(torch.frombuffer(data, dtype=torch.uint8))


_service: Service | None = None


def service() -> Service:
    """This process's RDMA service (started on first use)."""
    global _service
    s = _service
    if s is None:
        with _svc_lock:
            if _service is None:
                _service = Service()
            s = _service
    return s


_svc_lock = threading.Lock()
