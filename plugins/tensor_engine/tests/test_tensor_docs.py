"""The walk-through of docs/tensors.md runs, on CPU, and prints what it says."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "tensors.md"


def test_the_walk_through_runs_and_prints_what_it_says(tmp_path: pathlib.Path) -> None:
    text = DOC.read_text()
    block = re.search(r"## A walk-through.*?```python\n(.*?)```", text, re.S).group(1)
    script = tmp_path / "walk.py"
    script.write_text(block)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout
    assert "torch.Size([3, 4]) torch.float32" in lines
    assert "torch.Size([1, 4]) torch.Size([2, 3, 4])" in lines
    assert "TensorOpError {'dp': 1, 'tp': 1}" in lines
    assert "tensor([[6., 6., 6., 6.]," in lines  # x + 1 where x is 5
    assert "tensor(14.)" in lines  # the flattened view's reduction
    assert "tensor([10., 20., 30., 40.])" in lines  # the two-stage pipeline
    assert "torch.Size([1]) torch.Size([1])" in lines  # DDP with a comms stream
