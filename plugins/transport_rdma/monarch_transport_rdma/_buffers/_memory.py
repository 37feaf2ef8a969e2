"""What memory an object is: address, size, device, writability.

Accepted: ``torch.Tensor`` (contiguous; CPU, or CUDA where a GPU exists),
``bytearray``, ``memoryview`` and anything else with the buffer protocol
(``numpy`` arrays, ``array.array``, ``mmap``), when C-contiguous.  torch is
never imported here: a tensor is recognised only if torch is already loaded.
"""

from __future__ import annotations

import ctypes
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monarch_core.hookspecs import MemoryRegion

__all__ = ["Local", "local_memory", "describe"]


class _PyBuffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def _address(mv: memoryview) -> int:
    """The address of a C-contiguous memoryview's first byte (read-only ones too)."""
    view = _PyBuffer()
    if _get_buffer(mv, ctypes.byref(view), 0) != 0:  # PyBUF_SIMPLE: contiguous or BufferError
        raise BufferError("not a contiguous buffer")
    try:
        return int(view.buf or 0)
    finally:
        _release_buffer(ctypes.byref(view))


class Local:
    """Memory in this process: a region plus what keeps it alive.

    ``tensor`` is the flat ``uint8`` view of a tensor's bytes (for device
    memory, which is copied through host memory), else ``None``.
    """

    __slots__ = ("region", "keep", "tensor", "what")

    def __init__(self, region: MemoryRegion, keep: Any, tensor: Any, what: str) -> None:
        self.region = region
        self.keep = keep
        self.tensor = tensor
        self.what = what

    @property
    def addr(self) -> int:
        return self.region.addr

    @property
    def nbytes(self) -> int:
        return self.region.nbytes

    @property
    def device(self) -> str:
        return self.region.device

    def view(self, offset: int, nbytes: int) -> memoryview:
        """A writable (or read-only) byte view of host memory ``[offset, offset+nbytes)``."""
        arr = (ctypes.c_char * nbytes).from_address(self.region.addr + offset)
        arr._keep = self.keep  # type: ignore[attr-defined]  # (a ctypes instance takes any attribute) the view keeps the memory alive
        mv = memoryview(arr).cast("B")
        return mv if self.region.writable else mv.toreadonly()

    def sub(self, offset: int, nbytes: int) -> MemoryRegion:
        from monarch_core.hookspecs import MemoryRegion

        r = self.region
        return MemoryRegion(r.addr + offset, nbytes, r.device, r.writable)


def _torch_tensor_type() -> Any:
    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else None


def describe(obj: Any) -> str:
    """``torch.Tensor(float32, shape (4, 4), cpu)``, ``bytearray(16)``, ... for messages."""
    t = _torch_tensor_type()
    if t is not None and isinstance(obj, t):
        return f"torch.Tensor({str(obj.dtype).replace('torch.', '')}, shape {tuple(obj.shape)}, {obj.device})"
    try:
        n = memoryview(obj).nbytes
    except TypeError:
        return type(obj).__name__
    return f"{type(obj).__module__ + '.' if type(obj).__module__ not in ('builtins',) else ''}{type(obj).__name__}({n} bytes)"


def local_memory(obj: Any, *, role: str, writable: bool) -> Local:
    """The memory of ``obj`` as this process sees it.

    ``role`` names the argument in errors (``"dst"``, ``"src"``, ``"data"``);
    ``writable``: the memory will be written (``dst``).  ``ValueError`` for a
    non-contiguous tensor or buffer, a read-only ``dst``, a tensor that
    requires grad; ``TypeError`` for an object that is not memory.
    """
    from monarch_core.hookspecs import MemoryRegion  # (pluggy: loaded once a buffer is used, not at import)

    t = _torch_tensor_type()
    if t is not None and isinstance(obj, t):
        return _tensor_memory(obj, role, writable)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"{role} must be a torch.Tensor or an object with the buffer protocol (bytearray, memoryview, "
            f"numpy array ...), got {type(obj).__name__}"
        ) from None
    if not mv.c_contiguous:
        raise ValueError(
            f"{role} ({describe(obj)}, strides {mv.strides}) is not C-contiguous: RDMA moves one contiguous "
            "range of bytes; pass a contiguous copy (numpy.ascontiguousarray(x), bytearray(x))"
        )
    if writable and mv.readonly:
        raise ValueError(
            f"{role} ({describe(obj)}) is read-only: it must be writable memory to receive the bytes "
            "(a bytearray, a writable numpy array or tensor), not bytes"
        )
    nbytes = mv.nbytes
    addr = _address(mv) if nbytes else 0
    return Local(MemoryRegion(addr, nbytes, "cpu", not mv.readonly), mv, None, describe(obj))


def _tensor_memory(t: Any, role: str, writable: bool) -> Local:
    from monarch_core.hookspecs import MemoryRegion

    if not t.is_contiguous():
        raise ValueError(
            f"{role} ({describe(t)}, strides {tuple(t.stride())}) is not contiguous: RDMA moves one contiguous "
            f"range of bytes; pass {role}.contiguous() (a copy) or a contiguous view"
        )
    if t.layout is not sys.modules["torch"].strided or t.is_sparse:
        raise ValueError(f"{role} ({describe(t)}) is not a dense strided tensor")
    if writable and t.requires_grad and t.is_leaf:
        raise ValueError(
            f"{role} ({describe(t)}) requires grad: writing into it behind autograd's back is refused; "
            f"pass {role}.detach()"
        )
    nbytes = t.numel() * t.element_size()
    dev = t.device
    device = "cpu" if dev.type == "cpu" else str(dev)
    flat = t.detach().reshape(-1).view(sys.modules["torch"].uint8) if nbytes else None
    return Local(MemoryRegion(int(t.data_ptr()), nbytes, device, True), t, flat, describe(t))
