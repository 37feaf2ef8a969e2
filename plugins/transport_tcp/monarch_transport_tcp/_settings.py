"""The ``MONARCH_*`` variables monarch-transport-tcp reads, declared once (the
``monarch_settings`` hook of its plugin module returns them; :func:`get`
declares them first, for code imported before the plugin registry loads it)."""

from __future__ import annotations

from typing import Any

from monarch_core import settings
from monarch_core.hookspecs import Setting

DISTRIBUTION = "monarch-transport-tcp"

SETTINGS = [
    Setting("MONARCH_TLS_CERT", "credential", None, "this process's TLS certificate for the `tls` transport (may be in the key file)"),
    Setting("MONARCH_TLS_KEY", "credential", None, "this process's TLS private key for the `tls` transport"),
    Setting("MONARCH_TLS_CA", "credential", None, "the CA the `tls` transport's peers must chain to"),
    Setting("MONARCH_TLS_SESSION_DAYS", "float", 8.0, "days the session CA a client makes for its scheduled hosts (and its certificates) stays valid", minimum=0.01),
    Setting("MONARCH_TLS_VERIFY_HOSTNAME", "bool", True, "0 skips the host-name check of TLS peers (the CA check stays)"),
    Setting("MONARCH_ADVERTISE_HOST", "str", None, "host name or address `tcp`/`tls` procs advertise (default: the host name)"),
    Setting("MONARCH_CONNECT_TIMEOUT", "seconds", 5.0, "seconds a TCP connect may take", minimum=0.001),
    Setting("MONARCH_TLS_HANDSHAKE_TIMEOUT", "seconds", 10.0, "seconds a TLS handshake may take", minimum=0.001),
]


def get(name: str) -> Any:
    """``settings.get(name)`` of one of :data:`SETTINGS`."""
    settings.declare(SETTINGS, DISTRIBUTION)
    return settings.get(name)
