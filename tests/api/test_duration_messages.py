"""Durations in messages read as the core writes them (``300 s``, ``5.0 s``,
never ``4.99999907900019 s`` or ``300.0s``): ``monarch_core.runtime`` offers
the core's formatter to plugins, and the tensor engine's timeout messages use
it instead of formatting its float constants themselves."""

from __future__ import annotations

import re
from pathlib import Path

import monarch_core.runtime as runtime

TENSOR_ENGINE = Path(__file__).resolve().parents[2] / "plugins" / "tensor_engine" / "monarch_tensor_engine"


def test_the_runtime_facade_formats_durations_as_the_core_does() -> None:
    assert "format_duration" in runtime.__all__
    assert runtime.format_duration(300) == "300 s"
    assert runtime.format_duration(300.0) == "300 s"
    assert runtime.format_duration(4.99999907900019) == "5.0 s"
    assert runtime.format_duration(0.05) == "50 ms"
    assert runtime.format_duration(None) == "no time limit"


def test_tensor_engine_messages_format_no_raw_duration() -> None:
    # an f-string field that formats a timeout constant or variable itself
    # (``{TIMEOUT_S} s``, ``{WAIT_S:g}s``, ``{timeout:.0f} s``) instead of format_duration(...)
    raw = re.compile(r"\{(?:[A-Z_]*(?:TIMEOUT|WAIT)_S|timeout)(?::[^}]*)?\}")
    found = [f"{p.name}:{i}: {line.strip()}"
             for p in sorted(TENSOR_ENGINE.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if raw.search(line)]
    assert found == [], "\n".join(found)
