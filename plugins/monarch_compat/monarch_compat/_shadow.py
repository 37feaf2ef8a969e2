"""The check that ``monarch`` is not also provided by another distribution.

monarch-compat provides the import name ``monarch``, as torchmonarch (the
reference) does.  Installed in one environment, the two write into the same
``site-packages/monarch`` folder, and which one a program gets depends on the
order of installation, file by file.  So importing ``monarch`` from this
distribution refuses (``ImportError`` naming both distributions and the fix)
when any other installed distribution declares that it provides ``monarch``:
it never runs a program half on one and half on the other, silently.
"""

from __future__ import annotations

import logging
from importlib import metadata
from typing import Iterable

__all__ = ["OWN", "ShadowError", "check", "others_providing"]

logger = logging.getLogger("monarch.compat")

#: this distribution's name (as ``importlib.metadata`` normalises it)
OWN = "monarch-compat"

class ShadowError(ImportError):
    """Another installed distribution also provides the import name ``monarch``."""


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _provides_monarch(dist: metadata.Distribution) -> bool:
    """Whether ``dist`` declares the top-level name ``monarch`` (its ``top_level.txt``,
    else its ``RECORD``, read as text: parsing every file list of a large
    environment would make ``import monarch`` slow)."""
    top = dist.read_text("top_level.txt")
    if top is not None:
        return "monarch" in top.split()
    record = dist.read_text("RECORD") or ""
    return record.startswith("monarch/") or "\nmonarch/" in record


def others_providing(dists: Iterable[metadata.Distribution] | None = None) -> list[str]:
    """``"name version"`` of every installed distribution other than this one
    that provides the import name ``monarch`` (sorted; empty when none)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions() if dists is None else dists:
        if not _provides_monarch(dist):
            continue
        name = dist.metadata["Name"] or ""
        if name and _norm(name) != OWN:
            found[_norm(name)] = f"{name} {dist.version}"
    return [found[k] for k in sorted(found)]


def check() -> None:
    """Raise :class:`ShadowError` when another distribution provides ``monarch``."""
    others = others_providing()
    if not others:
        return
    names = ", ".join(others)
    raise ShadowError(
        f"both monarch-compat (monarch-core's compatibility layer) and {names} provide the Python package "
        f"`monarch` in this environment; their files overwrite each other, so `import monarch` would run a mix "
        f"of the two. Keep one of them: to run on the reference, `pip uninstall monarch-compat` (programs that "
        f"import monarch_core keep working); to run on monarch-core, `pip uninstall {others[0].split()[0]}` and "
        f"then reinstall the compatibility layer (`pip install --force-reinstall --no-deps ./plugins/monarch_compat`"
        f" from a monarch-core checkout), since uninstalling removed the shared files. Or use separate virtual "
        f"environments. See docs/compat.md."
    )
