"""Arrows point down: the layers contract (``[tool.importlinter]`` in
pyproject.toml) holds, and no import cycle exists anywhere in monarch_core,
imports inside functions and under ``TYPE_CHECKING`` included."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_import_linter_contracts_are_kept() -> None:
    pytest.importorskip("importlinter")
    from importlinter.api import read_configuration  # noqa: F401 - fails early if the API moved

    out = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports())"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "BROKEN" not in out.stdout and "0 broken" in out.stdout, out.stdout


def _cycles() -> list[list[str]]:
    grimp = pytest.importorskip("grimp")
    g = grimp.build_graph("monarch_core", cache_dir=None)
    adj = {m: sorted(g.find_modules_directly_imported_by(m)) for m in g.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for m in sorted(adj):
        if m not in index:
            visit(m)
    return found


def test_no_import_cycle_in_monarch_core() -> None:
    assert _cycles() == []


def test_the_kernel_imports_neither_launch_nor_actor_modules() -> None:
    code = (
        "import json, sys; import monarch_core._kernel._runtime, monarch_core._kernel._inbound, "
        "monarch_core._kernel._wire; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('monarch_core._launch', "
        "'monarch_core._actor', 'monarch_core._mesh')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_launch_package_library_modules_do_not_import_the_mesh_layer() -> None:
    code = (
        "import json, sys; import monarch_core._launch._spec, monarch_core._launch._children, "
        "monarch_core._launch._spawn, monarch_core._launch._bootstrap; "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('monarch_core._actor._mesh', "
        "'monarch_core._actor._actor_mesh', 'monarch_core._actor._proc_mesh', 'monarch_core._actor._host_mesh', "
        "'monarch_core._actor._controller', 'monarch_core._actor._attach', 'monarch_core._mesh')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_importing_the_actor_api_loads_no_kernel_machinery() -> None:
    """``import monarch_core.actor`` stays light (the benchmark's import row):
    trio, asyncio and pluggy load when the runtime starts, not before.  A
    top-level ``import trio`` in a module the façade imports breaks this."""
    import subprocess
    import sys

    code = (
        "import sys, monarch_core.actor;"
        "print(sorted(m for m in ('trio', 'asyncio', 'pluggy', 'monarch_core.hookspecs') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"import monarch_core.actor loaded {out.stdout.strip()}"
