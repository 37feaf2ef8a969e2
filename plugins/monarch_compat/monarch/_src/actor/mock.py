"""The reference's ``monarch._src.actor.mock``: ``patch_actor`` and
``patch_tensor_engine`` are ``monarch_core.testing``'s."""

from __future__ import annotations

from monarch_core.testing import patch_actor, patch_tensor_engine

__all__ = ["patch_actor", "patch_tensor_engine"]
