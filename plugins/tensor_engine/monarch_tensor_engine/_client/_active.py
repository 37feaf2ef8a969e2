"""The active mesh of each thread: a stack of ``with mesh.activate():``
blocks (``_controller.Active``; ``None`` for a ``no_mesh()`` block).  The
client's modules ask :func:`active` for the controller of the innermost
mesh; only ``_controller`` pushes and pops."""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["active", "stack"]

_state = threading.local()


def stack() -> list:
    """This thread's stack of active blocks (innermost last)."""
    s = getattr(_state, "stack", None)
    if s is None:
        s = _state.stack = []
    return s


def active() -> Any:
    """The controller of this thread's innermost active mesh, or None (none, or a ``no_mesh()`` block)."""
    s = stack()
    return s[-1].ctl if s and s[-1] is not None else None
