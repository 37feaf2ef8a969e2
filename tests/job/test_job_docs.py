"""docs/job.md stays true: its runnable examples run as written, and every
other Python block is a cluster example that the scheduler plugins' testbed suites run (it
must at least compile)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "job.md"


def _blocks() -> list[tuple[str, str]]:
    """(marker, code) of every python block: ``run: NAME`` or ``cluster: ...``."""
    return re.findall(r"<!-- (run: \w+|cluster: [^>]*) -->\n```python\n(.*?)```", DOC.read_text(), re.S)


def _run(name: str) -> str:
    found = [code for marker, code in _blocks() if marker == f"run: {name}"]
    assert len(found) == 1, f"docs/job.md has no runnable block {name!r}"
    return found[0]


def test_every_python_block_is_run_here_or_on_the_testbed() -> None:
    text = DOC.read_text()
    assert text.count("```python") == len(_blocks()), "a python block of docs/job.md has no run:/cluster: marker"
    for marker, code in _blocks():
        compile(code, f"docs/job.md ({marker})", "exec")


def test_the_job_life_example_runs_and_leaves_nothing(client_script: Any, tmp_path: Path) -> None:
    out = client_script(_run("process"), timeout=240)
    assert out.returncode == 0, out.stderr[-6000:]
    assert out.stdout.split()[:1] == ["4"] and "'hosts': 1" in out.stdout, out.stdout


def test_the_dashboard_example_prints_true(client_script: Any) -> None:
    out = client_script(_run("admin"), timeout=240)
    assert out.returncode == 0, out.stderr[-6000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
