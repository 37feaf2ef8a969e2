"""monarch-core: distributed PyTorch programs in the actor style of Monarch.

The public API is :mod:`monarch_core.actor`; plugins implement
:mod:`monarch_core.hookspecs`; errors live in :mod:`monarch_core.errors`.
The reference's distributed-tensor names (``fetch_shard``, ``inspect``,
``reduce``, ``remote``, ``Tensor``, ``no_mesh``, ...) are attributes of this
package, resolved lazily from the tensor engine plugin
(``monarch-tensor-engine``), so that ``import monarch_core as monarch`` runs
the reference's programs.
"""

from __future__ import annotations

from typing import Any

from monarch_core._version import __version__

__all__ = ["BootstrapCommand", "ChannelTransport", "Workspace", "__version__"]


def __getattr__(name: str) -> Any:  # lazy: importing monarch_core stays cheap
    if name == "ChannelTransport":
        from monarch_core._proc._transport import ChannelTransport

        return ChannelTransport
    if name == "BootstrapCommand":
        from monarch_core._launch._bootstrap import BootstrapCommand

        return BootstrapCommand
    if name == "Workspace":
        from monarch_core._workspace import Workspace

        return Workspace
    if name == "random":  # the reference's monarch.random (the procs' generators), from the engine plugin
        import monarch_core.random as random_module  # (an import statement: `from monarch_core import` recurses)

        return random_module
    from monarch_core._compat import TENSOR_ENGINE_NAMES

    if name in TENSOR_ENGINE_NAMES:  # the reference's distributed-tensor names, from the engine plugin
        from monarch_core._actor._engine import engine

        return getattr(engine(f"monarch_core.{name}"), name)
    raise AttributeError(f"module 'monarch_core' has no attribute {name!r}")
