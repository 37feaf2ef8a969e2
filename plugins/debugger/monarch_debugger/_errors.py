"""The debugger's errors: all derive from :class:`DebuggerError`, a
``monarch_core.errors.MonarchError`` (the documented exception tree)."""

from __future__ import annotations

from monarch_core.errors import MonarchError

__all__ = ["DebuggerError"]


class DebuggerError(MonarchError):
    """Base of what monarch-debugger raises on purpose (``monarch debug``'s
    one-line errors: a bad rank argument, a refused command, a lost server,
    a CLI problem it exits on)."""
