"""Serialization of user payloads: cloudpickle, protocol 5, out-of-band buffers.

Large contiguous buffers (``bytearray``, NumPy arrays, anything exposing
``PickleBuffer``) travel as separate frames and are never copied into the
pickle string.  Small ones stay in-band, where they are cheaper.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

OOB_MIN = 16 * 1024


def dumps(obj: Any) -> tuple[bytes, list]:
    """Pickle ``obj``; return ``(payload, out_of_band_buffers)``."""
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

    payload = cloudpickle.dumps(obj, protocol=5, buffer_callback=cb)
    return payload, bufs


def loads(payload: Any, buffers: list) -> Any:
    """Inverse of :func:`dumps`."""
    return pickle.loads(payload, buffers=buffers)
