"""``enable_transport`` and ``ChannelTransport``: choosing the channel once."""

from __future__ import annotations

import enum
import threading

from monarch_core.errors import UnknownTransportError


class ChannelTransport(enum.Enum):
    """The channel kinds ``enable_transport`` accepts as an enum."""

    Unix = "ipc"
    TcpWithHostname = "tcp"
    TcpWithLocalhost = "tcp-localhost"
    Tls = "tls"
    MetaTlsWithIpV6 = "metatls"
    MetaTlsWithHostname = "metatls-hostname"
    #: in-process channels (the ``inproc`` transport: every actor in this process)
    Local = "inproc"


_SHORTCUTS = {
    "ipc": ChannelTransport.Unix,
    "unix": ChannelTransport.Unix,
    "tcp": ChannelTransport.TcpWithHostname,
    "tcp-localhost": ChannelTransport.TcpWithLocalhost,
    "tls": ChannelTransport.Tls,
    "metatls": ChannelTransport.MetaTlsWithIpV6,
    "metatls-hostname": ChannelTransport.MetaTlsWithHostname,
}

URL_FORMS = (
    "ipc:///path, ipc://@abstract-name, tcp://host:port, tcp://*:port, tcp://[::1]:port, "
    "tls://host:port, tcp://PUBLIC:PORT@tcp://BIND:PORT"
)


class TransportChoice:
    """A resolved choice: transport name + this process's bind spec (or None
    for the transport's default)."""

    __slots__ = ("name", "bind_spec", "label")

    def __init__(self, name: str, bind_spec: str | None, label: str) -> None:
        self.name, self.bind_spec, self.label = name, bind_spec, label

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransportChoice) and (self.name, self.bind_spec) == (other.name, other.bind_spec)

    def __hash__(self) -> int:
        return hash((self.name, self.bind_spec))

    def __repr__(self) -> str:
        return self.label


def parse_transport(transport: object) -> TransportChoice:
    """Turn any accepted form into a :class:`TransportChoice` (raises
    ``TypeError``/``ValueError``/``UnknownTransportError``)."""
    from monarch_core._plugins import registry

    reg = registry()
    if isinstance(transport, ChannelTransport):
        key = transport.value
        label = f"ChannelTransport.{transport.name}"
    elif isinstance(transport, str):
        if not transport:
            raise ValueError(f"enable_transport(''): expected a name ({sorted(_SHORTCUTS)}) or a URL ({URL_FORMS})")
        if "://" in transport:
            scheme = transport.split("://", 1)[0]
            if not scheme or not scheme.replace("+", "").replace("-", "").isalnum():
                raise ValueError(f"malformed transport URL {transport!r}; accepted forms: {URL_FORMS}")
            t = reg.transport(scheme)  # UnknownTransportError names the plugin to install
            bind = t.normalize(transport)  # ValueError naming the accepted forms
            return TransportChoice(t.name, bind, repr(transport))
        if ":" in transport or "/" in transport:
            raise ValueError(
                f"malformed transport {transport!r}: a URL needs a scheme, e.g. 'tcp://host:port'. "
                f"Accepted: names {sorted(_SHORTCUTS)} or URLs {URL_FORMS}"
            )
        enum_value = _SHORTCUTS.get(transport)
        key = enum_value.value if enum_value is not None else transport
        label = repr(transport)
    else:
        raise TypeError(
            f"enable_transport() takes a ChannelTransport, a name such as 'ipc' or 'tcp', or a URL "
            f"such as 'tcp://host:port'; got {type(transport).__name__}"
        )
    if key == "tcp-localhost":
        t = reg.transport("tcp")
        return TransportChoice(t.name, t.normalize("tcp://127.0.0.1:0"), label)
    if key.startswith("metatls"):
        raise UnknownTransportError(
            f"{label} is Meta's internal TLS; no plugin provides it outside Meta. Use 'tls' "
            "(mutual TLS with MONARCH_TLS_CERT/MONARCH_TLS_KEY/MONARCH_TLS_CA) from monarch-transport-tcp."
        )
    t = reg.transport(key)
    return TransportChoice(t.name, None, label)


_lock = threading.Lock()
_enabled: TransportChoice | None = None
_in_use = False


def enable_transport(transport: "ChannelTransport | str") -> None:
    """Allow monarch to communicate with transport type ``transport``.

    Call before any other monarch API call.  If never called, ``"ipc"`` (Unix
    sockets) is enabled implicitly at first use.  Enabling the same transport
    again is a no-op; enabling a different one after one is enabled raises
    ``RuntimeError``.

    Accepted values: a :class:`ChannelTransport`; the names ``"ipc"``,
    ``"tcp"``, ``"tls"``; or a ZMQ-style URL giving this process's address
    (``ipc:///path``, ``ipc://@name``, ``tcp://host:port``, ``tcp://*:port``,
    ``tcp://[::1]:port``, ``tls://host:port``,
    ``tcp://PUBLIC:PORT@tcp://BIND:PORT``).  A malformed URL raises
    ``ValueError`` naming the accepted forms; a name or scheme no installed
    plugin provides raises ``UnknownTransportError`` naming the plugin to
    install.
    """
    global _enabled
    choice = parse_transport(transport)
    with _lock:
        if _enabled is None:
            _enabled = choice
            return
        if _enabled == choice:
            return
        why = "it is already in use by this process's kernel" if _in_use else "it was enabled earlier"
        raise RuntimeError(
            f"enable_transport({choice.label}): transport {_enabled.label} is already enabled and {why}; "
            "only one transport can be enabled per process. Call enable_transport() once, before any "
            "other monarch API call, in every process of the program."
        )


def current_choice(*, mark_used: bool = True) -> TransportChoice:
    """The enabled transport, enabling ``ipc`` implicitly if none was chosen."""
    global _enabled, _in_use
    with _lock:
        if _enabled is None:
            _enabled = parse_transport("ipc")
        if mark_used:
            _in_use = True
        return _enabled


def enabled_choice() -> TransportChoice | None:
    """The enabled transport, or None if none was chosen yet."""
    return _enabled


def set_from_parent(name: str) -> None:
    """In a worker: adopt the transport its parent chose (before first use)."""
    global _enabled
    from monarch_core._plugins import registry

    with _lock:
        if _enabled is None:
            t = registry().transport(name)
            _enabled = TransportChoice(t.name, None, repr(name))
