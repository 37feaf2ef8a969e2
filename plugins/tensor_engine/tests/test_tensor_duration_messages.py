"""The tensor engine's timeout messages read durations as the core writes
them (``300 s``, ``5.0 s``, never ``4.99999907900019 s`` or ``300.0s``): they
use ``monarch_core.runtime.format_duration`` (tested in
``tests/api/test_duration_messages.py``) instead of formatting their float
constants themselves."""

from __future__ import annotations

import re
from pathlib import Path

TENSOR_ENGINE = Path(__file__).resolve().parents[1] / "monarch_tensor_engine"


def test_tensor_engine_messages_format_no_raw_duration() -> None:
    # an f-string field that formats a timeout constant or variable itself
    # (``{TIMEOUT_S} s``, ``{WAIT_S:g}s``, ``{timeout:.0f} s``) instead of format_duration(...)
    raw = re.compile(r"\{(?:[A-Z_]*(?:TIMEOUT|WAIT)_S|timeout)(?::[^}]*)?\}")
    files = sorted(TENSOR_ENGINE.rglob("*.py"))
    assert files, f"no module of the tensor engine under {TENSOR_ENGINE}"
    found = [f"{p.name}:{i}: {line.strip()}"
             for p in files
             for i, line in enumerate(p.read_text().splitlines(), 1) if raw.search(line)]
    assert found == [], "\n".join(found)
