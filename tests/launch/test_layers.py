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


#: Name-based imports that stay, each for a reason: plugin factories named by
#: the plugins' own specs, the fork server importing what the layer above
#: handed it explicitly (``_fork_server.warm``), and ``monarch apply MODULE.ATTR``
#: importing the user's job module it names (``job/_trait.py``), and an actor's
#: construction importing the modules its pickled class names, packages first
#: (``_proc/_construction.py``, ``_proc/_serial.py``: the user's modules, named
#: by the payload, never a monarch module reached upwards).
_BY_NAME_ALLOWED = {
    ("_plugins.py", "import_module"),
    ("_contract/_common.py", "import_module"),
    ("_launch/_zygote.py", "import_module"),
    ("job/_trait.py", "import_module"),
    ("_proc/_construction.py", "import_module"),
    ("_proc/_serial.py", "import_module"),
}
#: ``sys.modules`` keys that are looked up without importing: optional
#: third-party libraries ("is torch loaded?"), and a module's own entry.
_PROBES_ALLOWED = {"torch", "asyncio", "__main__"}
#: Files whose ``sys.modules`` lookups take a computed name for the reason
#: above: whether a module a payload names is loaded (and fully initialised).
_COMPUTED_PROBES_ALLOWED = {"_proc/_construction.py", "_proc/_serial.py"}


def _hidden_up_calls(path: pathlib.Path, package: pathlib.Path = ROOT / "monarch_core") -> list[str]:
    """Module-level reaches that the import checker cannot see in ``path``
    (a module of the ``monarch_core`` package whose folder is ``package``):
    ``sys.modules`` lookups of monarch modules (or of a computed name),
    ``importlib.import_module``/``__import__`` outside the allowed places, and
    assignments to attributes of another monarch module (slot filling)."""
    import ast

    rel = path.relative_to(package).as_posix()
    tree = ast.parse(path.read_text(), str(path))
    modules: set[str] = set()  # local names bound to monarch modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("monarch_core"):
            for a in node.names:
                if a.name.startswith("_"):
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("monarch_core") and a.asname and any(
                        part.startswith("_") for part in a.name.split(".")):
                    modules.add(a.asname)
    found = []

    def is_sys_modules(n: ast.AST) -> bool:
        return (isinstance(n, ast.Attribute) and n.attr == "modules" and isinstance(n.value, ast.Name)
                and n.value.id == "sys")

    def key_ok(k: ast.AST) -> bool:
        if isinstance(k, ast.Name) and (k.id == "__name__" or rel in _COMPUTED_PROBES_ALLOWED):
            return True
        return isinstance(k, ast.Constant) and k.value in _PROBES_ALLOWED

    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Subscript) and is_sys_modules(node.value) and not key_ok(node.slice):
            found.append(f"{where}: sys.modules[{ast.unparse(node.slice)}]")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if is_sys_modules(f.value) and f.attr in ("get", "pop", "setdefault") and not (
                    node.args and key_ok(node.args[0])):
                found.append(f"{where}: sys.modules.{f.attr}({ast.unparse(node.args[0]) if node.args else ''})")
            if f.attr == "import_module" and (rel, "import_module") not in _BY_NAME_ALLOWED:
                found.append(f"{where}: importlib.import_module(...)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            found.append(f"{where}: __import__(...)")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in modules:
                    found.append(f"{where}: assigns {ast.unparse(t)} (another module's slot)")
    return found


def test_no_hidden_up_calls_sys_modules_probes_or_slot_filling_in_monarch_core() -> None:
    """Every arrow between monarch modules is an import the checker sees:
    what calls up goes through a declared extension point (the lifecycle
    registry and hooks, the actor class's protocol), never through a
    ``sys.modules`` probe, an import by name, or a slot another module fills."""
    found = [f for p in sorted((ROOT / "monarch_core").rglob("*.py")) for f in _hidden_up_calls(p)]
    assert found == [], "\n".join(found)


def test_the_hidden_up_call_check_catches_each_kind(tmp_path: pathlib.Path) -> None:
    """The check finds each kind of hidden reach in a module of a throwaway
    ``monarch_core`` folder under ``tmp_path`` (never in the installed
    package, where a parallel test could import it)."""
    package = tmp_path / "monarch_core"
    package.mkdir()
    bad = package / "_probe_example_for_test.py"
    bad.write_text(
        "import sys\nfrom monarch_core._launch import _fork_server\n"
        "x = sys.modules.get('monarch_core.actor')\ny = sys.modules[name]\n"
        "_fork_server.warm_modules = ()\n"
        "import importlib\nz = importlib.import_module('monarch_core._actor._mesh')\n"
    )
    found = _hidden_up_calls(bad, package)
    assert sorted(f.split(": ", 1)[1] for f in found) == sorted([
        "sys.modules.get('monarch_core.actor')",
        "sys.modules[name]",
        "assigns _fork_server.warm_modules (another module's slot)",
        "importlib.import_module(...)",
    ]), found
    assert all(f.startswith("_probe_example_for_test.py:") for f in found), found
    assert not (ROOT / "monarch_core" / bad.name).exists()


def test_the_contracts_over_plugins_are_kept() -> None:
    """``plugins/importlinter.ini``: every plugin imports only monarch-core's
    public modules (hookspecs, errors, streams, settings, runtime, the API
    façades), never a private package, and no plugin imports another."""
    pytest.importorskip("importlinter")
    from importlib.util import find_spec

    missing = [p for p in ("monarch_transport_tcp", "monarch_transport_rdma", "monarch_scheduler_ssh",
                           "monarch_scheduler_slurm", "monarch_telemetry_otel", "monarch_debugger", "monarch_dashboard",
                           "monarch_tensor_engine", "monarch_spmd")
               if find_spec(p) is None]
    if missing:
        pytest.skip(f"plugins not installed here (scripts/test.sh installs them all): {missing}")
    out = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
         "sys.exit(lint_imports(config_filename='plugins/importlinter.ini'))"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 kept, 0 broken" in out.stdout, out.stdout


@pytest.mark.unit
def test_a_proc_runtime_is_assembled_in_one_place() -> None:
    """``_launch._start.build_runtime`` builds every runtime: the client's, a
    proc's (``_launch._proc_main``) and a worker loop's (``_launch._worker``)."""
    import ast

    found = []
    for p in sorted((ROOT / "monarch_core").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Call) and "ProcRuntime" in (getattr(node.func, "attr", None),
                                                                getattr(node.func, "id", None)):
                found.append(str(p.relative_to(ROOT / "monarch_core")))
    assert found == ["_launch/_start.py"]
