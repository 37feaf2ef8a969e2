"""monarch-core: distributed PyTorch programs in the actor style of Monarch.

The public API is :mod:`monarch_core.actor`; plugins implement
:mod:`monarch_core.hookspecs`; errors live in :mod:`monarch_core.errors`.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

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
    raise AttributeError(f"module 'monarch_core' has no attribute {name!r}")
