"""The reference's ``monarch.fetch``: ``fetch_shard``, ``inspect``, ``show``
and ``call_on_shard_and_fetch``, from the tensor engine plugin
(``monarch-tensor-engine``) through ``monarch_core``; resolved on first use,
so importing this module needs neither torch nor the plugin."""

from __future__ import annotations

from typing import Any

__all__ = ["call_on_shard_and_fetch", "fetch_shard", "inspect", "show"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        import monarch_core

        return getattr(monarch_core, name)
    raise AttributeError(f"module 'monarch.fetch' has no attribute {name!r}")
