"""Serialisation of actor payloads (``monarch_core._proc._serial``): what
travels in the pickle and what out of band (end-to-end round trips through
procs are in ``tests/api/test_payloads.py``)."""

from __future__ import annotations

import pytest

from monarch_core._proc import _serial


def test_plain_cpu_tensor_is_sent_out_of_band_and_rebuilt_without_torch_save() -> None:
    torch = pytest.importorskip("torch")
    x = torch.arange(1 << 16, dtype=torch.float32).reshape(256, 256)
    payload, bufs = _serial.dumps(x)
    assert len(bufs) == 1 and memoryview(bufs[0]).nbytes == x.nbytes
    assert len(payload) < 1024  # the data is not in the pickle
    y = _serial.loads(payload, [bytearray(memoryview(b)) for b in bufs])
    assert y.dtype == x.dtype and y.shape == x.shape and torch.equal(x, y)
