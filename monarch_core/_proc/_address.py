"""A rendezvous address every rank can reach, and a free port on the master
(public through :mod:`monarch_core.runtime`: ``host_address``,
``master_address``, ``free_port``, ``transport_host``, ``AddrType``; used by
``monarch-spmd``'s ``SPMDActor`` and the tensor engine's collectives).

The master's address comes from the address its own proc's transport listens
on (``tcp://10.0.0.7:4123`` -> ``10.0.0.7``): that is the address the other
procs of the mesh already reach it at.  A proc whose transport is local to the
machine (``ipc``) has only local peers, so loopback is right for it.  A name
is resolved only when an address family is asked for; loopback results
(Debian's ``127.0.1.1`` for the host name) are never used for a proc whose
transport crosses hosts.
"""

from __future__ import annotations

import enum
import ipaddress
import socket

LOCAL_SCHEMES = ("ipc", "unix", "inproc", "local")


class AddrType(enum.Enum):
    """Which address family ``get_host_port(use_ipaddr)`` answers with (the
    reference's ``monarch.tools.network.AddrType``): ``Default`` prefers IPv6
    and falls back to IPv4; ``IPv4`` and ``IPv6`` insist on one."""

    Default = enum.auto()
    IPv4 = enum.auto()
    IPv6 = enum.auto()


def _families(use_ipaddr: AddrType | None) -> tuple[socket.AddressFamily, ...]:
    if use_ipaddr is None or use_ipaddr is AddrType.Default:
        return (socket.AF_INET6, socket.AF_INET)
    if use_ipaddr is AddrType.IPv4:
        return (socket.AF_INET,)
    if use_ipaddr is AddrType.IPv6:
        return (socket.AF_INET6,)
    raise TypeError(f"use_ipaddr must be None or a monarch_core.runtime.AddrType ({', '.join(AddrType.__members__)}), "
                    f"got {use_ipaddr!r}")


def transport_host(url: str) -> tuple[str, str]:
    """``(scheme, host)`` of a kernel's listen address: ``tls://h1:4000`` ->
    ``("tls", "h1")``; ``tcp://[::1]:4000`` -> ``("tcp", "::1")``; the
    public half of ``tcp://PUBLIC:P@tcp://BIND:P``; ``("ipc", "")`` for
    local transports."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a transport address: {url!r}")
    if scheme in LOCAL_SCHEMES:
        return scheme, ""
    rest = rest.split("@", 1)[0].split("/", 1)[0]
    if rest.startswith("["):
        return scheme, rest[1:].split("]", 1)[0]
    return scheme, rest.rsplit(":", 1)[0] if ":" in rest else rest


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None


def master_address(url: str, use_ipaddr: AddrType | None = None) -> str:
    """The address the other ranks use to reach the proc listening at ``url``
    (see the module docstring).  ``use_ipaddr=None`` keeps what the
    transport uses (a name stays a name); an ``AddrType`` gives an IP
    address of that family.  Raises ``ValueError`` naming the transport when
    no such address exists."""
    families = _families(use_ipaddr)
    scheme, host = transport_host(url)
    if not host:  # a transport local to this machine: every peer is here too
        return "::1" if families == (socket.AF_INET6,) else "127.0.0.1"
    wildcard = host in ("*", "0.0.0.0", "::")
    lit = None if wildcard else _literal(host)
    if lit is not None:
        fam = socket.AF_INET6 if lit.version == 6 else socket.AF_INET
        if use_ipaddr is not None and use_ipaddr is not AddrType.Default and fam not in families:
            raise ValueError(f"use_ipaddr={use_ipaddr.name}: this proc's transport listens on {url}, an "
                             f"IPv{lit.version} address; enable a transport of that family "
                             f"(e.g. enable_transport('tcp://[::]:0') for IPv6) or pass another use_ipaddr")
        return str(lit)
    if use_ipaddr is None and not wildcard:
        return host
    name = socket.gethostname() if wildcard else host
    loopback_ok = not wildcard and (_literal(host) is not None or host == "localhost")
    found: list[str] = []
    for fam in families:
        try:
            infos = socket.getaddrinfo(name, None, fam, socket.SOCK_STREAM)
        except socket.gaierror:
            continue
        for info in infos:
            addr = str(info[4][0])
            if loopback_ok or not ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback:
                found.append(addr)
        if found:
            return found[0]
    want = "IPv6 or IPv4" if len(families) == 2 else ("IPv4" if families == (socket.AF_INET,) else "IPv6")
    raise ValueError(f"no {want} address of {name!r} (this proc's transport listens on {url}) that other hosts "
                     f"can reach (loopback addresses are left out); pass master_addr explicitly, or another "
                     f"use_ipaddr")


def free_port(address: str) -> int:
    """A TCP port that is free on every interface of this host in the family
    of ``address`` (the store rank 0 starts binds there).  The port is
    released before returning: as with torchrun, another program could take
    it before rank 0 binds it."""
    lit = _literal(address)
    fam = socket.AF_INET6 if lit is not None and lit.version == 6 else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind(("::" if fam == socket.AF_INET6 else "0.0.0.0", 0))
        return int(s.getsockname()[1])
