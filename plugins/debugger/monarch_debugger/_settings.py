"""The ``MONARCH_*`` variables monarch-debugger reads, declared once (the
``monarch_settings`` hook of its plugin module returns them; :func:`get`
declares them first, for code imported before the plugin registry loads it)."""

from __future__ import annotations

from typing import Any

from monarch_core import settings
from monarch_core.hookspecs import Setting

DISTRIBUTION = "monarch-debugger"

SETTINGS = [
    Setting("MONARCH_DEBUG_SERVER_HOST", "str", "localhost", "host name or address the client's debug server binds at the first `breakpoint()` in an actor, and `monarch debug` connects to (loopback by default; see docs/debugging.md)"),
    Setting("MONARCH_DEBUG_SERVER_PORT", "int", 27000, "TCP port of the client's debug server (0: any free port; taken: a free one): the line the client prints names it", minimum=0),
    Setting("MONARCH_DEBUG_TOKEN_FILE", "path", None, "file (mode 0600) holding the debug server's access token, written by the client and read by `monarch debug`", default_text="~/.monarch/debug/PORT.token"),
]


def get(name: str) -> Any:
    """``settings.get(name)`` of one of :data:`SETTINGS`."""
    settings.declare(SETTINGS, DISTRIBUTION)
    return settings.get(name)
