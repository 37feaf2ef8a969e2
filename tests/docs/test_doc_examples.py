"""Blocks of the docs that this file runs, as written (``<!-- run: NAME -->``
in docs/workspace.md, docs/transports.md and docs/compat.md), and the samples of
docs/debugging.md checked against its program's line numbers."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from _helpers.clients import PY, child_env
from _helpers.docblocks import blocks, block


def test_workspace_md_example_imports_the_package_on_the_hosts(tmp_path: Path) -> None:
    """docs/workspace.md "workspace": a script (no top-level await) whose
    ``Workspace(dirs=["src"])`` makes ``import mypkg`` work in a new proc."""
    (tmp_path / "src" / "mypkg").mkdir(parents=True)
    (tmp_path / "src" / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "example.py").write_text(block("docs/workspace.md", "workspace"))
    res = subprocess.run([PY, "example.py"], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env=child_env(drop=("MONARCH_",)))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith(str(Path("src", "mypkg", "__init__.py"))), res.stdout
    assert "WARNING" not in res.stderr and "is a package" not in res.stderr, res.stderr


def test_a_package_folder_given_as_a_workspace_directory_is_warned_about(tmp_path: Path) -> None:
    (tmp_path / "src" / "mypkg").mkdir(parents=True)
    (tmp_path / "src" / "mypkg" / "__init__.py").write_text("")
    code = ("import logging; logging.basicConfig()\n"
            "from monarch_core.actor import Workspace\n"
            "Workspace(dirs=['src/mypkg']); print('--'); Workspace(dirs=['src'])\n")
    res = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env=child_env(drop=("MONARCH_",)))
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("WARNING:monarch.workspace") == 1, res.stderr
    assert "src/mypkg is a package" in res.stderr and "Workspace(dirs=['src'])" in res.stderr, res.stderr


def test_transports_md_certificates_include_the_clients(tmp_path: Path) -> None:
    """docs/transports.md "certificates" makes every file that it and
    docs/multi-host.md use: the CA, and a certificate and key for each host
    and for the client, each signed by the CA for client and server use."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed here")
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", block("docs/transports.md", "certificates")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    used = set()
    for page in ("docs/transports.md", "docs/multi-host.md"):
        for b in blocks(page):
            used |= set(re.findall(r"(?<![\w$-])[\w-]+\.(?:pem|key)\b", b.text))
    made = {p.name for p in tmp_path.iterdir()}
    assert {"client-host.pem", "client-host.key"} <= used and used <= made, (sorted(used - made), sorted(made))
    for name in ("h1", "h2", "client-host"):
        ok = subprocess.run(["openssl", "verify", "-CAfile", "ca.pem", "-purpose", "sslclient", f"{name}.pem"],
                            capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert ok.returncode == 0, ok.stdout + ok.stderr


def test_debugging_md_samples_show_the_programs_line_numbers() -> None:
    """Every ``debugee.py(N)`` / ``-> CODE`` pair, ``debugee.py:N`` and ``list``
    row of docs/debugging.md's samples names the line of its program (the
    guide's python block, saved as debugee.py) that it shows."""
    prog = next(b for b in blocks("docs/debugging.md") if b.lang == "python").text.splitlines()
    text = Path(__file__).resolve().parents[2].joinpath("docs", "debugging.md").read_text()
    pairs = re.findall(r"debugee\.py\((\d+)\)\w+\(\)\n(?:\[debugee \d+\] )?-> (.+)", text)
    assert len(pairs) >= 4, pairs
    for line, code in pairs:
        assert prog[int(line) - 1].strip() == code.strip(), (line, code, prog[int(line) - 1])
    for line in re.findall(r"debugee\.py:(\d+)", text):
        assert prog[int(line) - 2].strip().startswith("breakpoint()"), line  # the line after the breakpoint
    for rank, line in re.findall(r"\| debugee \| (\d+)\s+\|[^|]+\|[^|]+\| _debugee_actor_internal \| (\d+)", text):
        assert prog[int(line) - 1].strip() == f"rank += {int(rank) % 4 + 1}", (rank, line)


def test_compat_md_patch_actor_example_prints_what_it_says(tmp_path: Path) -> None:
    """docs/compat.md "patch-actor": the replacement class answers."""
    code = block("docs/compat.md", "patch-actor")
    res = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env=child_env(drop=("MONARCH_",)))
    assert res.returncode == 0, res.stdout + res.stderr
    said = re.search(r"# (ValueMesh\(.*\))", code).group(1)
    assert res.stdout.strip() == said, res.stdout
