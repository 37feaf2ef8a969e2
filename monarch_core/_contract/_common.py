"""What every seam of the plugin contract shares: the project name, the hook
markers, and the lazy ``"module:attr"`` factories of the ``*Spec.load`` methods.

Public through :mod:`monarch_core.hookspecs`; import from there.
"""

from __future__ import annotations

from typing import Any, Callable

import pluggy

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

PROJECT_NAME = "monarch"

#: Decorator for hook *specifications* (used by the contract's modules only).
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Decorator for hook *implementations*: plugins mark their functions with it.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


def _call_factory(factory: Callable[[], Any] | str) -> Any:
    fn = _import_object(factory) if isinstance(factory, str) else factory
    return fn()


def _import_object(spec: str) -> Any:
    """What ``spec`` (``"pkg.mod"`` or ``"pkg.mod:obj.attr"``, a factory or an
    entry point's value) names."""
    import importlib

    module_name, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module_name.strip())
    for part in filter(None, attr.strip().split(".")):
        obj = getattr(obj, part)
    return obj
