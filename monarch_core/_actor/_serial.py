"""Serialization of user payloads: cloudpickle, protocol 5, out-of-band buffers.

Large contiguous buffers travel as separate frames and are never copied into
the pickle string: ``bytearray``, NumPy arrays (anything exposing
``PickleBuffer``), and plain contiguous CPU ``torch.Tensor`` s
(whose default pickling goes through ``torch.save`` and copies twice).  On the
receiving side a tensor is rebuilt *on* the received buffer, without a copy.
Small buffers stay in-band, where they are cheaper.
"""

from __future__ import annotations

import ctypes
import io
import pickle
import sys
from typing import Any

import cloudpickle

OOB_MIN = 16 * 1024


def _rebuild_tensor(buf: Any, dtype: Any, shape: tuple) -> Any:
    import torch

    mv = memoryview(buf)
    if mv.nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    if mv.readonly:  # in-band (bytes): torch wants a writable buffer
        buf = bytearray(mv)
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)


def _reduce_tensor(t: Any) -> Any:
    """Out-of-band reduction of a plain, contiguous CPU tensor (else None)."""
    try:
        if (
            t.device.type != "cpu"
            or t.requires_grad
            or t.layout is not _torch_strided()
            or t.is_quantized
            or not t.is_contiguous()
        ):
            return None
        nbytes = t.numel() * t.element_size()
    except Exception:  # noqa: BLE001 - anything unusual: torch's own pickling
        return None
    if nbytes < OOB_MIN:
        return None
    arr = (ctypes.c_char * nbytes).from_address(t.data_ptr())
    arr.keep = t  # the view must keep the tensor's memory alive until it is sent
    return (_rebuild_tensor, (pickle.PickleBuffer(arr), t.dtype, tuple(t.shape)))


def _torch_strided() -> Any:
    return sys.modules["torch"].strided


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and type(obj) is torch.Tensor:
            r = _reduce_tensor(obj)
            if r is not None:
                return r
        return super().reducer_override(obj)


_ATOMS = frozenset({type(None), bool, int, float, str, bytes, complex})
_PLAIN_MAX = 64  # containers checked item by item up to this many items in all


def _plain(obj: Any) -> bool:
    """True if ``obj`` is built only from builtin scalars, strings, bytes and
    exact tuples/lists/dicts of them (small): the C pickler then writes
    exactly what cloudpickle would, several times faster."""
    budget = _PLAIN_MAX
    stack = [obj]
    atoms = _ATOMS
    while stack:
        o = stack.pop()
        t = type(o)
        if t in atoms:
            continue
        budget -= 1
        if budget < 0:
            return False
        if t is tuple or t is list:
            if len(o) > budget:
                return False
            stack.extend(o)
        elif t is dict:
            if len(o) > budget:
                return False
            stack.extend(o.keys())
            stack.extend(o.values())
        else:
            return False
    return True


def dumps(obj: Any) -> tuple[bytes, list]:
    """Pickle ``obj``; return ``(payload, out_of_band_buffers)``."""
    if _plain(obj):
        return pickle.dumps(obj, 5), []
    bufs: list = []

    def cb(pb: pickle.PickleBuffer) -> bool | None:
        try:
            m = pb.raw()
        except BufferError:  # not contiguous: keep it in-band
            return True
        if m.nbytes < OOB_MIN:
            return True
        bufs.append(m)
        return None

    f = io.BytesIO()
    _Pickler(f, protocol=5, buffer_callback=cb).dump(obj)
    return f.getvalue(), bufs


def loads(payload: Any, buffers: list) -> Any:
    """Inverse of :func:`dumps`."""
    return pickle.loads(payload, buffers=buffers)
