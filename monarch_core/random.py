"""The reference's ``monarch.random``: the random number generators of the
procs of the active mesh (``get_state``, ``set_state``, ``new_state``,
``make_deterministic``, ``State``), from the tensor engine plugin
(``monarch-tensor-engine``), resolved when first used so that importing this
module stays cheap.  See docs/tensors.md."""

from __future__ import annotations

from typing import Any

__all__ = ["State", "get_state", "make_deterministic", "new_state", "set_state"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from monarch_core._actor._engine import engine

        return getattr(engine(f"monarch_core.random.{name}").random, name)
    raise AttributeError(f"module 'monarch_core.random' has no attribute {name!r}")
