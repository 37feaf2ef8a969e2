"""Hook implementations of monarch-transport-tcp.

Kept import-light: the transports themselves are imported only when first used.
"""

from __future__ import annotations

from monarch_core.hookspecs import TransportSpec, hookimpl


@hookimpl
def monarch_transports() -> list[TransportSpec]:
    return [
        TransportSpec(
            name="tcp",
            schemes=("tcp",),
            factory="monarch_transport_tcp._tcp:TcpTransport",
            description="TCP (tcp://host:port, tcp://*:port, tcp://[::1]:port, tcp://PUBLIC:PORT@tcp://BIND:PORT)",
        ),
        TransportSpec(
            name="tls",
            schemes=("tls",),
            factory="monarch_transport_tcp._tcp:TlsTransport",
            description="TCP + TLS 1.3, mutual authentication (MONARCH_TLS_CERT/KEY/CA)",
        ),
    ]


@hookimpl
def monarch_settings() -> list:
    from monarch_transport_tcp import _settings

    return _settings.SETTINGS
