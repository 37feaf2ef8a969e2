"""The debugger's layout holds: its own import contracts
(``plugins/debugger/importlinter.ini``: the hooks over the remote pdb over the
controller and the CLI, over the wire format and the shared state; no
cycle), no import cycle between any two of its modules (imports inside
functions included: ``_hook`` imports ``_session`` lazily, so ``_session``
must not import ``_hook``), and no module writes another's attributes (the
old ``_session`` set ``_hook.armed``; the state now lives in ``_state``,
written through its functions)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "plugins" / "debugger" / "monarch_debugger"


def _cycles(package: str) -> list[list[str]]:
    """The strongly connected components (of more than one module) of ``package``'s import graph."""
    grimp = pytest.importorskip("grimp")
    g = grimp.build_graph(package, cache_dir=None)
    adj = {m: sorted(g.find_modules_directly_imported_by(m) & g.modules) for m in g.modules}
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


def _is_sys_modules(n: ast.AST) -> bool:
    return isinstance(n, ast.Attribute) and n.attr == "modules" and isinstance(n.value, ast.Name) and n.value.id == "sys"


def _slot_writes(root: pathlib.Path, package: str) -> list[str]:
    """Assignments to an attribute of a module of ``package`` imported by name
    (``from package import _mod; _mod.x = ...``), and ``sys.modules`` lookups
    of the package's modules (or of a computed name): arrows the import
    checker cannot see."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        modules: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
                modules.update(a.asname or a.name for a in node.names if a.name.startswith("_"))
        for node in ast.walk(tree):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in modules:
                        found.append(f"{where}: assigns {ast.unparse(t)} (another module's state)")
            key = None  # the key of a sys.modules lookup (subscript or .get/.pop/.setdefault)
            if isinstance(node, ast.Subscript) and _is_sys_modules(node.value):
                key = node.slice
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                  and _is_sys_modules(node.func.value)):
                key = node.args[0]
            if key is not None and not (isinstance(key, ast.Constant) and not str(key.value).startswith(package)):
                found.append(f"{where}: sys.modules lookup of {ast.unparse(key)}")  # "__main__" and such are fine
    return found


def test_the_debugger_import_contracts_are_kept() -> None:
    pytest.importorskip("importlinter")
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
         "sys.exit(lint_imports(config_filename='plugins/debugger/importlinter.ini'))"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout, out.stdout


def test_no_import_cycle_in_the_debugger() -> None:
    assert _cycles("monarch_debugger") == []


def test_no_module_of_the_debugger_writes_another_modules_state() -> None:
    assert _slot_writes(PACKAGE, "monarch_debugger") == []


def test_the_checks_catch_a_cycle_and_a_slot_write(tmp_path: pathlib.Path) -> None:
    """The two checks above can fail: a package with a lazy import cycle and a slot write."""
    pkg = tmp_path / "debugger_knot_example"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "_a.py").write_text("from debugger_knot_example import _b\n\n\ndef f():\n    _b.armed = True\n")
    (pkg / "_b.py").write_text("armed = False\n\n\ndef g():\n    from debugger_knot_example import _a\n\n    return _a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert _cycles("debugger_knot_example") == [["debugger_knot_example._a", "debugger_knot_example._b"]]
    finally:
        sys.path.remove(str(tmp_path))
    assert [f.split(": ", 1)[1] for f in _slot_writes(pkg, "debugger_knot_example")] == [
        "assigns _b.armed (another module's state)"]
