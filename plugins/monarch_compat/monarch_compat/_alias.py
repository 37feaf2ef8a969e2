"""Modules of ``monarch`` that *are* modules of monarch-core.

``import monarch.actor`` gives the module object ``monarch_core.actor``
itself (not a copy and not a re-export): one set of classes and functions,
one ``unhandled_fault_hook``.  A meta path finder placed first on
``sys.meta_path`` answers every name under an aliased prefix
(``monarch.job.spmd`` -> ``monarch_core.job.spmd``), so that no core module
is ever loaded a second time under a ``monarch.`` name.  The module keeps its
own ``__name__`` and ``__spec__`` (pickles name it by its real name).

Names the reference has and monarch-core deliberately does not
(:data:`REFUSED`) raise ``ModuleNotFoundError`` saying why and what to use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Optional, Sequence

__all__ = ["ALIASES", "REFUSED", "install"]

#: ``monarch`` module -> the monarch-core module it is (and so for its submodules)
ALIASES: dict[str, str] = {
    "monarch.actor": "monarch_core.actor",
    "monarch.rdma": "monarch_core.rdma",
    "monarch.spmd": "monarch_core.spmd",
    "monarch.random": "monarch_core.random",
    "monarch.job": "monarch_core.job",
}

#: reference modules not provided, and why (their submodules too)
REFUSED: dict[str, str] = {
    "monarch.job.meta": "MASTJob is Meta-internal and has no counterpart",
    "monarch.gather_mount": "gather_mount (a FUSE mount of the hosts' files) has no counterpart; "
                            "HostMesh.sync_workspace copies the other way (docs/workspace.md)",
    "monarch.remotemount": "remotemount (a FUSE mount) has no counterpart; see docs/workspace.md",
    "monarch._rust_bindings": "the reference's Rust extension has no counterpart; its public names are "
                              "in monarch.actor, monarch.config and monarch.job (docs/compat.md)",
    "monarch.simulator": "the reference's simulator (its model of GPUs) has no counterpart; monarch.Simulator(hosts, "
                         "gpus) runs the program for real on local CPU procs and records the run's trace, and "
                         "monarch_core.testing.patch_tensor_engine runs a patched actor's tensor engine on local CPU "
                         "procs (docs/compat.md)",
}


def _match(name: str, table: dict[str, str]) -> Optional[str]:
    """The key of ``table`` that is ``name`` or a package above it."""
    for key in table:
        if name == key or name.startswith(key + "."):
            return key
    return None


class _AliasLoader(importlib.abc.Loader):
    """Loads a ``monarch`` name by importing its monarch-core module and
    putting that module in ``sys.modules`` under the ``monarch`` name."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name)  # a placeholder: exec_module replaces it

    def exec_module(self, module: types.ModuleType) -> None:
        real = importlib.import_module(self.target)
        # the import system reads sys.modules back after exec_module, so the
        # alias becomes the real module (whose own __spec__ stays untouched)
        sys.modules[module.__name__] = real


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Answers the ``monarch`` names of :data:`ALIASES` and :data:`REFUSED`."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if not fullname.startswith("monarch."):
            return None
        refused = _match(fullname, REFUSED)
        if refused is not None:
            raise ModuleNotFoundError(
                f"{fullname}: monarch-compat does not provide {refused}: {REFUSED[refused]}", name=fullname)
        alias = _match(fullname, ALIASES)
        if alias is None:
            return None
        real = ALIASES[alias] + fullname[len(alias):]
        if importlib.util.find_spec(real) is None:
            raise ModuleNotFoundError(f"{fullname}: monarch-compat maps it to {real}, which is not installed "
                                      f"(see docs/compat.md)", name=fullname)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), is_package=True)


_FINDER = _AliasFinder()


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)

