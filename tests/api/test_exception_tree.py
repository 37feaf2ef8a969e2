"""One exception tree: every public error class the core and the plugins
define derives from ``MonarchError`` (or is ``ActorError``, user code's), and
``monarch_core.errors``' docstring draws it by name."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import monarch_core.errors as errors
from monarch_core.errors import ActorError, MonarchError

ROOT = Path(__file__).resolve().parents[2]
#: (package directory, import name) of the core and every plugin package
PACKAGES = [(ROOT / "monarch_core", "monarch_core")] + [
    (pkg, pkg.name) for plugin in sorted((ROOT / "plugins").iterdir()) if plugin.is_dir()
    for pkg in sorted(plugin.iterdir()) if (pkg / "__init__.py").exists() and pkg.name != "tests"]
#: error classes outside the tree on purpose, and why
OUTSIDE = {
    # the reference's name for "torchmonarch is installed beside the compat package": an ImportError
    # raised while `import monarch` runs, before anything of monarch-core is imported
    "monarch_compat._shadow.ShadowError",
    # internal: the spawn catches it and execs the proc instead; it never reaches a caller
    "monarch_core._launch._fork_server.ForkServerUnavailable",
}


def _error_classes() -> list[tuple[str, str]]:
    """(module, class name) of every public class whose bases name an error."""
    out = []
    for pkg_dir, name in PACKAGES:
        for path in sorted(pkg_dir.rglob("*.py")):
            rel = path.relative_to(pkg_dir.parent).with_suffix("")
            if "tests" in rel.parts:
                continue
            module = ".".join(rel.parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    bases = [ast.unparse(b) for b in node.bases]
                    if any(b.endswith(("Error", "Exception", "Failed", "Mismatch", "Died", "Disconnected"))
                           for b in bases):
                        out.append((module, node.name))
    return out


def test_every_public_error_class_is_in_the_tree_and_drawn_in_the_docstring() -> None:
    found = _error_classes()
    assert len(found) > 20, found  # the walk found the packages
    outside, undrawn = [], []
    for module, name in found:
        cls = getattr(importlib.import_module(module), name)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            continue
        if f"{module}.{name}" in OUTSIDE:
            continue
        if not issubclass(cls, (MonarchError, ActorError)):
            outside.append(f"{module}.{name} ({', '.join(b.__name__ for b in cls.__mro__[1:-2])})")
        elif cls.__module__.startswith("monarch_core") is False and name not in (errors.__doc__ or ""):
            undrawn.append(f"{module}.{name}")
    assert not outside, f"error classes outside monarch_core.errors' tree: {outside}"
    assert not undrawn, f"plugin error classes monarch_core.errors' docstring does not draw: {undrawn}"
