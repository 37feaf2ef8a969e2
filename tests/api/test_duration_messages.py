"""Durations in messages read as the core writes them (``300 s``, ``5.0 s``,
never ``4.99999907900019 s`` or ``300.0s``): ``monarch_core.runtime`` offers
the core's formatter to plugins (the tensor engine's use of it is checked in
``plugins/tensor_engine/tests/test_tensor_duration_messages.py``)."""

from __future__ import annotations

import monarch_core.runtime as runtime


def test_the_runtime_facade_formats_durations_as_the_core_does() -> None:
    assert "format_duration" in runtime.__all__
    assert runtime.format_duration(300) == "300 s"
    assert runtime.format_duration(300.0) == "300 s"
    assert runtime.format_duration(4.99999907900019) == "5.0 s"
    assert runtime.format_duration(0.05) == "50 ms"
    assert runtime.format_duration(None) == "no time limit"

