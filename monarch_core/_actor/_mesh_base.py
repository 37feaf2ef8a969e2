"""What every mesh shares: ``_ProcSlot`` (one proc of a mesh: ``_proc._slot``), owner checks."""

from __future__ import annotations

from typing import Any

from monarch_core._proc._slot import EMPTY_REGION as _EMPTY_REGION
from monarch_core._proc._slot import START_TIMEOUT
from monarch_core._proc._slot import ProcSlot as _ProcSlot
from monarch_core._proc._slot import slot_from_ref as _slot_from_ref

__all__ = ["START_TIMEOUT", "_EMPTY_REGION", "_ProcSlot", "_owner_check", "_slot_from_ref"]


def _owner_check(mesh: Any, what: str) -> None:
    if not mesh._owner:
        kind = type(mesh).__name__
        raise RuntimeError(
            f"cannot {what} {kind} {mesh._name!r}: this object is a reference (a slice, or received from "
            f"another actor), not the owner. Only the owner can {what} it: call {what}() on the "
            f"{kind} returned by the spawn call."
        )
