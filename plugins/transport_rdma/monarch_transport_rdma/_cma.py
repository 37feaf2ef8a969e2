"""The ``process_vm`` backend: ``process_vm_readv``/``process_vm_writev``.

Between two procs of one host (one kernel, one pid namespace) the holder
copies straight between its memory and the owner's, in one system call per
64 MiB, without the owner taking part.  The kernel allows it when the holder
may ptrace the owner (same user, and no ptrace policy against it: Yama's
``kernel.yama.ptrace_scope`` >= 1 forbids it between non-parent processes,
as do some container seccomp profiles); :meth:`ProcessVmBackend.connect`
tries one 8-byte read first and, when it is refused, says why, and the core
falls back to the next backend.

Liveness: every registration has a *ticket* in the owner's memory (a random
key and a live flag) that the holder reads before each 64 MiB and after a
read; a dropped buffer's ticket is cleared at once (its memory is kept for
``MONARCH_RDMA_RELEASE_GRACE`` s by the core, for a copy already past the
check).  The owner's pid is checked against its start time, so a reused pid
is never read.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import threading
import time
from typing import Any, Callable, Mapping

from monarch_transport_rdma import _settings
from monarch_core.errors import RDMAError, SupervisionError
from monarch_core.hookspecs import MemoryRegion, RDMABackend, RDMAConnection, RDMAPeer, RemoteRegion

__all__ = ["ProcessVmBackend", "host_key", "ptrace_policy"]

#: Bytes per system call: the ticket is checked between two.
STEP = 64 << 20
_MAGIC = 0x6D6F6E6172636876  # "monarchv"


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)
_fns = {}
for _name in ("process_vm_readv", "process_vm_writev"):
    _f = getattr(_libc, _name, None)
    if _f is not None:
        _f.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.POINTER(_IoVec),
                       ctypes.c_ulong, ctypes.c_ulong]
        _f.restype = ctypes.c_ssize_t
        _fns[_name] = _f


def host_key() -> str:
    """This machine (boot id) and pid namespace, as the core computes it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = os.uname().nodename
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{boot}/{ns}"


def ptrace_policy() -> str:
    """What this kernel's ptrace policy is, for messages."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return f"kernel.yama.ptrace_scope={f.read().strip()}"
    except OSError:
        return "no Yama ptrace policy on this kernel"


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _transfer(fn: Callable, pid: int, local: int, remote: int, n: int) -> int:
    """One system call; bytes moved, or ``-errno``."""
    liov = _IoVec(local, n)
    riov = _IoVec(remote, n)
    r = fn(pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
    return r if r >= 0 else -ctypes.get_errno()


class _Tickets:
    """Owner side: one (key, live) pair of 64-bit words per registration."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slabs: list[Any] = []
        self.free: list[tuple[float, int]] = []  # (reusable after, address)
        self.fresh: list[int] = []

    def take(self) -> tuple[int, int]:
        key = secrets.randbits(63) | 1
        now = time.monotonic()
        with self.lock:
            if self.free and self.free[0][0] <= now:
                addr = self.free.pop(0)[1]
            else:
                if not self.fresh:
                    slab = (ctypes.c_uint64 * 1024)()
                    self.slabs.append(slab)
                    base = ctypes.addressof(slab)
                    self.fresh = [base + 16 * i for i in range(512)]
                addr = self.fresh.pop()
        words = (ctypes.c_uint64 * 2).from_address(addr)
        words[0], words[1] = key, 1
        return addr, key

    def clear(self, addr: int, grace: float) -> None:
        words = (ctypes.c_uint64 * 2).from_address(addr)
        words[1] = 0
        words[0] = 0
        with self.lock:
            self.free.append((time.monotonic() + grace + 1.0, addr))


class ProcessVmBackend(RDMABackend):
    """See the module docstring."""

    name = "process_vm"

    def __init__(self) -> None:
        self._probe = ctypes.c_uint64(_MAGIC)
        self._tickets = _Tickets()
        self._grace: float = _settings.get("MONARCH_RDMA_RELEASE_GRACE")
        self._host = host_key()

    def unavailable(self) -> str | None:
        if len(_fns) < 2:
            return "this C library has no process_vm_readv/process_vm_writev (Linux >= 3.2 with glibc >= 2.15 has)"
        if not os.path.exists("/proc/self/stat"):
            return "no /proc: cannot check the owner's pid"
        return None

    def announce(self) -> Mapping[str, Any]:
        pid = os.getpid()
        return {"pid": pid, "start": _start_time(pid), "probe": ctypes.addressof(self._probe)}

    def register(self, region: MemoryRegion) -> Mapping[str, Any] | None:
        if region.device != "cpu":
            return None  # device memory is not in the owner's address space
        addr, key = self._tickets.take()
        return {"ticket": addr, "tkey": key}

    def deregister(self, region: MemoryRegion, descriptor: Mapping[str, Any]) -> None:
        self._tickets.clear(int(descriptor["ticket"]), self._grace)

    def reachable(self, peer: RDMAPeer) -> str | None:
        if peer.host != self._host:
            return f"its proc {peer.proc_id} is on another host (or in another pid namespace)"
        return None

    def connect(self, peer: RDMAPeer, exchange: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> RDMAConnection:
        a = peer.announce
        pid, start, probe = int(a["pid"]), a.get("start"), int(a["probe"])
        conn = _Connection(peer.proc_id, pid, start)
        word = ctypes.c_uint64(0)
        r = _transfer(_fns["process_vm_readv"], pid, ctypes.addressof(word), probe, 8)
        if r == -errno.ESRCH or (start is not None and _start_time(pid) != start):
            raise SupervisionError(f"the owner proc {peer.proc_id} (pid {pid}) is gone")
        if r < 0:
            raise RDMAError(conn.explain(-r, "a test read"))
        if r != 8 or word.value != _MAGIC:
            raise RDMAError(f"a test read of pid {pid} returned other bytes than it announced: pid reused?")
        return conn


class _Connection(RDMAConnection):
    def __init__(self, proc_id: str, pid: int, start: int | None) -> None:
        self.proc_id = proc_id
        self.pid = pid
        self.start = start

    def explain(self, err: int, what: str) -> str:
        if err == errno.EPERM:
            return (f"process_vm_readv/writev of the owner proc {self.proc_id} (pid {self.pid}) is not permitted "
                    f"(EPERM) for {what}: the ptrace access policy forbids it ({ptrace_policy()}; a container's "
                    "seccomp profile or another user id also can); transfers use the next backend")
        if err == errno.ENOSYS:
            return "this kernel has no process_vm_readv (CONFIG_CROSS_MEMORY_ATTACH is off)"
        return f"{what} of pid {self.pid} failed: {os.strerror(err)} ({errno.errorcode.get(err, err)})"

    def _alive(self, remote: RemoteRegion) -> None:
        if self.start is not None and _start_time(self.pid) != self.start:
            raise SupervisionError(f"the owner proc {self.proc_id} of {remote.name} (pid {self.pid}) is gone")

    def _ticket(self, remote: RemoteRegion) -> None:
        words = (ctypes.c_uint64 * 2)()
        d = remote.descriptor
        r = _transfer(_fns["process_vm_readv"], self.pid, ctypes.addressof(words), int(d["ticket"]), 16)
        if r < 0:
            self._fail(-r, remote, "reading its liveness ticket")
        if words[0] != int(d["tkey"]) or words[1] != 1:
            raise RDMAError(f"{remote.name} is no longer registered by its owner (dropped, or its owner stopped)")

    def _fail(self, err: int, remote: RemoteRegion, what: str) -> None:
        if err == errno.ESRCH:
            raise SupervisionError(f"the owner proc {self.proc_id} of {remote.name} (pid {self.pid}) is gone")
        if err == errno.EFAULT:
            self._alive(remote)
            raise RDMAError(f"{what} of {remote.name}: the owner's memory is no longer mapped (EFAULT)")
        raise RDMAError(f"{remote.name}: {self.explain(err, what)}")

    def _copy(self, fn_name: str, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        fn = _fns[fn_name]
        what = "reading" if fn_name == "process_vm_readv" else "writing"
        self._alive(remote)
        done, n = 0, local.nbytes
        while done < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} {remote.name}: {done} of {n} bytes moved when the timeout passed")
            self._ticket(remote)
            m = min(STEP, n - done)
            r = _transfer(fn, self.pid, local.addr + done, remote.addr + offset + done, m)
            if r < 0:
                self._fail(-r, remote, what)
            if r == 0:
                self._fail(errno.EFAULT, remote, what)
            done += r
        if fn_name == "process_vm_readv":  # what was read came from a live registration
            self._ticket(remote)
            self._alive(remote)

    def read(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        self._copy("process_vm_readv", remote, offset, local, deadline)

    def write(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        if not remote.writable:
            raise RDMAError(f"{remote.name} is read-only")
        self._copy("process_vm_writev", remote, offset, local, deadline)
