"""The picklable description of a registered buffer (what an ``RDMABuffer`` holds)."""

from __future__ import annotations

from typing import Any

from monarch_transport_rdma._buffers._memory import Local


class Handle:
    """One registration, as any process sees it.  ``proc`` is the owner proc's
    ``(proc_id, address, service port, host key, pid, {backend: announce})``;
    ``descriptors`` what each backend registered (``{backend: plain data}``)."""

    __slots__ = ("id", "key", "size", "device", "writable", "owner", "proc", "descriptors", "addr", "dropped")

    def __init__(self, rid: int, key: int, size: int, device: str, writable: bool, owner: str, proc: tuple,
                 descriptors: dict, addr: int) -> None:
        self.id = rid
        self.key = key
        self.size = size
        self.device = device
        self.writable = writable
        self.owner = owner
        self.proc = proc
        self.descriptors = descriptors
        self.addr = addr
        self.dropped = False  # this copy's drop() was called

    def name(self) -> str:
        dev = "" if self.device == "cpu" else f", {self.device}"
        return f"RDMABuffer #{self.id} ({self.size} bytes{dev}, owner {self.owner})"

    def local_memory(self) -> Local | None:
        """The memory itself, when this process is the owner and it is registered."""
        from monarch_transport_rdma._buffers import _service

        found = _service.lookup(self.id, self.key)
        return found[1] if found is not None else None

    def __reduce__(self) -> Any:
        return (Handle, (self.id, self.key, self.size, self.device, self.writable, self.owner, self.proc,
                         self.descriptors, self.addr))
