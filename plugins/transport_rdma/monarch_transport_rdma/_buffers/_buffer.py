"""``RDMABuffer`` and ``RDMAAction``: the public classes of ``monarch_core.rdma``."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from monarch_core import runtime
from monarch_core.runtime import Future
from monarch_transport_rdma._buffers import _backends, _transfer
from monarch_transport_rdma._buffers._handle import Handle
from monarch_transport_rdma._buffers._memory import local_memory

if TYPE_CHECKING:
    from monarch_transport_rdma._buffers._service import Registration

__all__ = ["RDMABuffer", "RDMAAction", "get_rdma_backend", "is_ibverbs_available", "is_rdma_available"]


def _owner_now() -> tuple[str, str]:
    """(key, name) of whoever creates a buffer now: the running actor, else this process."""
    actor = runtime.current_actor()
    if actor is not None:
        return actor
    return "", f"{runtime.process_name()} ({runtime.local_ref()[0]})"


class RDMABuffer:
    """A picklable handle to memory registered by the process that created it.

    ``RDMABuffer(data)`` registers ``data`` -- a contiguous ``torch.Tensor``
    (CPU, or CUDA where a GPU exists), a ``bytearray``, a writable
    ``memoryview`` or any C-contiguous buffer (a numpy array) -- of at least
    one byte, in this process, owned by the actor that runs this code (or by
    the process, outside any actor).  The owner keeps the memory alive and
    registered until :meth:`drop` or until the owning actor stops; read-only
    memory (``bytes``) can be read, not written.

    Pass the buffer to other actors (or return it) as an ordinary argument:
    a holder then reads or writes the owner's memory with :meth:`read_into` /
    :meth:`write_from` without the owner's actor code running (by RDMA, by
    ``process_vm_readv`` on one host, or through the owner's proc: see
    :attr:`backend` and docs/rdma.md).  Nothing synchronises the owner's own
    use of the memory with remote transfers: that is the program's job.
    """

    __slots__ = ("_h", "_reg", "__weakref__")
    _h: Handle
    _reg: Registration | None  # the owner's registration (None in a copy received from elsewhere)

    def __init__(self, data: Any) -> None:
        from monarch_transport_rdma._buffers import _service

        local = local_memory(data, role="data", writable=False)
        if local.nbytes == 0:
            raise ValueError(f"cannot create an RDMABuffer over 0 bytes ({local.what}); it needs at least one byte")
        key, owner = _owner_now()
        reg = _service.register(local, key, owner)
        self._reg = reg  # the owner's copy: keeps nothing alive beyond the registration
        r = local.region
        self._h = Handle(reg.id, reg.key, r.nbytes, r.device, r.writable, owner, _service.proc_info(),
                         reg.descriptors, r.addr)

    @classmethod
    def _of(cls, h: Handle) -> RDMABuffer:
        b = cls.__new__(cls)
        b._h = h
        b._reg = None
        return b

    def __reduce__(self) -> Any:
        return (RDMABuffer._of, (self._h,))

    def __repr__(self) -> str:
        return f"<{self._h.name()}>"

    def size(self) -> int:
        """The buffer's size in bytes."""
        return self._h.size

    @property
    def owner(self) -> str:
        """The actor (or process) that created the buffer and keeps it registered."""
        return self._h.owner

    @property
    def backend(self) -> str:
        """The data path transfers of this buffer take from this process:
        ``"ibverbs"``, ``"process_vm"``, ``"channel"`` (the fallback through
        the owner's proc), ``"local"`` (this process is the owner), with
        ``"+staged"`` when the owner's memory is on a GPU and goes through
        host memory.  Connects to the owner proc the first time (once per
        owner proc)."""
        name, _conn, _remote = _backends.route(self._h)
        return name + ("+staged" if self._h.device != "cpu" and name in ("channel",) else "")

    def read_into(self, dst: Any, *, timeout: float = 60) -> Future[None]:
        """Copy the buffer's bytes into the first ``size()`` bytes of ``dst``
        (a writable contiguous tensor or buffer).

        ``ValueError`` at once when ``dst`` is too small, read-only or not
        contiguous.  The future fails with ``TimeoutError`` after ``timeout``
        seconds, ``RDMAError`` when the buffer was dropped or its owner
        stopped, ``SupervisionError`` when the owner's proc died."""
        timeout = _transfer.check_timeout(timeout)
        return _transfer.submit([_transfer.read_op(self._h, dst)], timeout)

    def write_from(self, src: Any, *, timeout: float = 60) -> Future[None]:
        """Copy ``src`` (a contiguous tensor or buffer of at most ``size()``
        bytes) into the start of the buffer.  Errors as :meth:`read_into`."""
        timeout = _transfer.check_timeout(timeout)
        return _transfer.submit([_transfer.write_op(self._h, src)], timeout)

    def drop(self) -> Future[None]:
        """End the registration: the owner lets go of the memory, and every
        later transfer of this buffer, through any copy of the handle, fails
        with ``RDMAError``.  Resolves once the owner has done it; a second
        ``drop`` (or one after the owner stopped) is a no-op."""
        h = self._h
        if h.dropped:
            return runtime.resolved(None)
        h.dropped = True
        from monarch_transport_rdma._buffers import _proto, _service

        if runtime.started() and runtime.local_ref()[0] == h.proc[0]:
            _service.release(h.id, h.key, "dropped by its owner's process")
            return runtime.resolved(None)

        # Sent now (a drop() nobody waits for still drops); an owner proc that died took the
        # registration with it, which is success.
        return runtime.future_of(_proto.send_request(h.proc, ("d", h.id, h.key), f"drop of {h.name()}", 60.0, gone_ok=True))


class RDMAAction:
    """A batch of reads and writes submitted as one unit.

    ``read_remote``/``write_remote`` check their arguments at once (as
    ``read_into``/``write_from`` do) and return the action, so calls chain;
    :meth:`submit` runs every operation, in parallel, and may be called again
    to run the batch again."""

    __slots__ = ("_ops",)

    def __init__(self) -> None:
        self._ops: list[_transfer.Op] = []

    def read_remote(self, dst: Any, src: RDMABuffer) -> RDMAAction:
        """Queue a read of buffer ``src`` into local memory ``dst``."""
        self._ops.append(_transfer.read_op(_handle_of(src, "src"), dst))
        return self

    def write_remote(self, dst: RDMABuffer, src: Any) -> RDMAAction:
        """Queue a write of local memory ``src`` into buffer ``dst``."""
        self._ops.append(_transfer.write_op(_handle_of(dst, "dst"), src))
        return self

    def submit(self, *, timeout: float = 60) -> Future[None]:
        """Run the queued operations; the future resolves when all are done
        (or with the first error).  Two reads into overlapping local memory
        are a ``ValueError``."""
        timeout = _transfer.check_timeout(timeout)
        _transfer.check_overlaps(self._ops)
        for op in self._ops:
            _transfer._check_live(op.handle)
        return _transfer.submit(list(self._ops), timeout)

    def __len__(self) -> int:
        return len(self._ops)


def _handle_of(b: Any, role: str) -> Handle:
    if not isinstance(b, RDMABuffer):
        raise TypeError(f"{role} must be an RDMABuffer, got {type(b).__name__}")
    return b._h


def get_rdma_backend() -> str:
    """The backend transfers from this process prefer: ``MONARCH_RDMA_BACKEND``
    when it forces one, else the most preferred backend usable here
    (``"ibverbs"``, ``"process_vm"``, ``"channel"``).  Per owner proc the one
    used may differ (``RDMABuffer.backend``): ``process_vm`` reaches the same
    host only, ``channel`` every proc."""
    return _backends.best_name()


def is_ibverbs_available() -> bool:
    """Whether the ibverbs backend can work in this process (monarch-transport-rdma,
    pyverbs and an RDMA device)."""
    return _backends.is_available("ibverbs")


def is_rdma_available() -> bool:
    """Deprecated (as in the reference): ambiguous with several backends.
    Same as :func:`is_ibverbs_available`."""
    warnings.warn(
        "is_rdma_available() is deprecated: with several RDMA backends it is ambiguous. It means "
        "is_ibverbs_available(); use that, or get_rdma_backend().",
        DeprecationWarning,
        stacklevel=2,
    )
    return is_ibverbs_available()
