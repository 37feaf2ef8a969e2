"""docs/rdma.md's example runs, as written, in a fresh client."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "rdma.md"


def test_the_example_of_docs_rdma_md_runs(client_script) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, "docs/rdma.md has no python example"
    out = client_script(blocks[0], timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "read and wrote through" in out.stdout
