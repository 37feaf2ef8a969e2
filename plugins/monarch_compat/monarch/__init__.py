"""The reference's ``import monarch`` (torchmonarch 0.7.0) on monarch-core.

Programs written for the reference run unchanged: ``monarch.actor``,
``monarch.job``, ``monarch.spmd``, ``monarch.rdma`` and ``monarch.random``
*are* the monarch-core modules (``monarch_core.actor`` ...), and the
reference's other modules and the private paths its own examples import
(``monarch._src.actor.mock`` ...) are small modules here that name
monarch-core's objects.  docs/compat.md lists every name honoured, and every
difference kept on purpose.

Importing ``monarch`` refuses (``ImportError``) when another installed
distribution, such as torchmonarch, also provides ``monarch``.
"""

from __future__ import annotations

from typing import Any

from monarch_compat import _alias, _attributes, _cpu, _shadow

_shadow.check()
_alias.install()
_attributes.install()
_cpu.install()  # only with MONARCH_COMPAT_CPU=1: a test aid (docs/compat.md)

from monarch_core._version import __version__  # noqa: E402

#: the reference's top-level names that are not distributed-tensor names -> (module, name)
_NAMES = {
    "configure": ("monarch_core.config", "configure"),
    "configured": ("monarch_core.config", "configured"),
    "Extent": ("monarch_core.actor", "Extent"),
    "Future": ("monarch_core.actor", "Future"),
    "ActorFuture": ("monarch_core.actor", "Future"),
    "Simulator": ("monarch_compat._simulator", "Simulator"),
}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _NAMES:
        module, attr = _NAMES[name]
        return getattr(importlib.import_module(module), attr)
    if name in ("timer", "fetch", "random", "actor", "config", "job", "spmd", "rdma"):
        return importlib.import_module(f"monarch.{name}")
    from monarch_core._compat import TENSOR_ENGINE_NAMES

    if name in TENSOR_ENGINE_NAMES:  # fetch_shard, inspect, remote, ...: the tensor engine plugin's
        import monarch_core

        return getattr(monarch_core, name)
    raise AttributeError(f"module 'monarch' has no attribute {name!r} (monarch-compat: see docs/compat.md for "
                         f"the names it provides)")


__all__ = ["__version__", *sorted(_NAMES)]
