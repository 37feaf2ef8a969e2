"""The plugin module (entry point ``dashboard`` of group ``monarch``).

Its one hook returns the dashboard's sink when ``MONARCH_DASHBOARD=1``; then,
and only then, the server is imported and started (the client's runtime start).
"""

from __future__ import annotations

from collections.abc import Sequence

from monarch_core.hookspecs import TelemetrySink, hookimpl
from monarch_dashboard import _settings


@hookimpl
def monarch_telemetry_sinks() -> Sequence[TelemetrySink]:
    """The dashboard's sink when ``MONARCH_DASHBOARD`` is on, else none."""
    if not _settings.get("MONARCH_DASHBOARD"):
        return []
    from monarch_dashboard import _dashboard

    return [_dashboard.start(add_sink=False).sink]


@hookimpl
def monarch_settings() -> list:
    from monarch_dashboard import _settings

    return _settings.SETTINGS
