"""The ``MONARCH_*`` variables monarch-dashboard reads, declared once (the
``monarch_settings`` hook of its plugin module returns them; :func:`get`
declares them first, for code imported before the plugin registry loads it)."""

from __future__ import annotations

from typing import Any

from monarch_core import settings
from monarch_core.hookspecs import Setting

DISTRIBUTION = "monarch-dashboard"

SETTINGS = [
    Setting("MONARCH_DASHBOARD", "bool", False, "1 serves the live dashboard of this client on 127.0.0.1 (URL with its token printed once; docs/dashboard.md)"),
    Setting("MONARCH_DASHBOARD_PORT", "int", 0, "the dashboard's loopback port (0: a free one)", minimum=0),
]


def get(name: str) -> Any:
    """``settings.get(name)`` of one of :data:`SETTINGS`."""
    settings.declare(SETTINGS, DISTRIBUTION)
    return settings.get(name)
