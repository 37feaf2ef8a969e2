"""The ``tcp`` and ``tls`` transports.

Address forms (``tls://`` takes the same forms as ``tcp://``)::

    tcp://host:port                 bind host:port, advertise it
    tcp://*:port                    bind every interface, advertise this host's name
    tcp://[::1]:port                IPv6 literal
    tcp://PUBLIC:PORT@tcp://BIND:PORT   advertise the left, bind the right

Port 0 binds a free port; the advertised address carries the port bound.
The advertised host defaults to ``MONARCH_ADVERTISE_HOST`` or this machine's
host name.  When that name resolves only to loopback (common on laptops and
VMs), procs of this host still reach each other, one warning is logged, and a
connection from another host fails with an error that names the fix.

``tls`` is TCP plus TLS 1.3 with mutual authentication: both sides present a
certificate signed by the configured CA and both verify the other's.
Credentials come from ``TlsTransport.set_credentials(ca=, cert=, key=)``
(what the core passes from ``attach_to_workers``/``run_worker_loop_forever``)
or else from ``MONARCH_TLS_CERT``, ``MONARCH_TLS_KEY`` and ``MONARCH_TLS_CA``
(each a file path or inline PEM); the key file may also hold the
certificate.  Procs and worker loops started from this process get them
through ``child_env()``.  ``MONARCH_TLS_VERIFY_HOSTNAME=0`` skips the host-name
check (the CA check stays).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import re
import socket as _stdsocket
import ssl
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from monarch_core import settings
from monarch_transport_tcp import _settings
from monarch_core.errors import AuthenticationError, ConnectError, ConnectionClosed, TransportError
from monarch_core.hookspecs import SESSION_CREDENTIALS, TRUST_ALL, Listener, Stream, Transport

if TYPE_CHECKING:
    from monarch_transport_tcp._record import TlsSocket

# trio, the socket streams and the TLS record layer are imported by the methods
# that listen, connect and accept: a client that only enables the transport (a
# scheduler's hosts_from_config, before it dials its hosts) does not wait for them.

logger = logging.getLogger("monarch.transport.tcp")

FORMS = "{s}://host:port, {s}://*:port, {s}://[::1]:port, {s}://PUBLIC:PORT@{s}://BIND:PORT, {s}://host:fdN"
CONNECT_TIMEOUT: float = _settings.get("MONARCH_CONNECT_TIMEOUT")
TLS_HANDSHAKE_TIMEOUT: float = _settings.get("MONARCH_TLS_HANDSHAKE_TIMEOUT")
_HOSTPORT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.%a-zA-Z]+)\]|(?P<host>[^\[\]:/@]*)):(?P<port>\d{1,5})$")
#: ``HOST:fdN``: listen on the socket this process inherited as descriptor N (bound already, to HOST)
_HOSTFD = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.%a-zA-Z]+)\]|(?P<host>[^\[\]:/@]*)):fd(?P<fd>\d{1,9})$")
_warned_loopback = False
_warn_lock = threading.Lock()


@dataclass(frozen=True)
class TcpSpec:
    """A parsed tcp/tls address: where to bind and what to advertise."""

    scheme: str
    bind_host: str  # "" = every interface
    bind_port: int
    adv_host: str | None  # None = decide at bind time (this host's name)
    adv_port: int | None  # None = the bound port
    fd: int | None = None  # listen on this inherited, bound socket (``HOST:fdN``) instead of binding


def _split_hostport(scheme: str, text: str, url: str) -> tuple[str, int]:
    m = _HOSTPORT.match(text)
    if not m:
        raise ValueError(f"malformed {scheme} address {url!r}; accepted forms: {FORMS.format(s=scheme)}")
    host = m.group("v6") if m.group("v6") is not None else m.group("host")
    port = int(m.group("port"))
    if port > 65535:
        raise ValueError(f"{scheme} address {url!r}: port {port} is out of range (0-65535)")
    if m.group("v6") is not None:
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise ValueError(f"{scheme} address {url!r}: {host!r} is not an IPv6 address") from None
    if host == "":
        raise ValueError(f"{scheme} address {url!r} has no host; use '*' for every interface")
    return host, port


def parse(url: str, scheme: str) -> TcpSpec:
    prefix = scheme + "://"
    if not url.startswith(prefix):
        raise ValueError(f"malformed {scheme} address {url!r}; accepted forms: {FORMS.format(s=scheme)}")
    rest = url[len(prefix) :]
    if "@" in rest:
        public, _, bind = rest.partition("@")
        if not bind.startswith(prefix):
            raise ValueError(
                f"malformed {scheme} alias address {url!r}: expected {scheme}://PUBLIC:PORT@{scheme}://BIND:PORT"
            )
        ph, pp = _split_hostport(scheme, public, url)
        bh, bp = _split_hostport(scheme, bind[len(prefix) :], url)
        if ph == "*":
            raise ValueError(f"{scheme} alias address {url!r}: the advertised (left) host cannot be '*'")
        return TcpSpec(scheme, "" if bh == "*" else bh, bp, ph, pp if pp else None)
    m = _HOSTFD.match(rest)
    if m is not None:
        host = m.group("v6") if m.group("v6") is not None else m.group("host")
        if host == "":
            raise ValueError(f"{scheme} address {url!r} has no host; use '*' for a socket bound to every interface")
        if host == "*":
            return TcpSpec(scheme, "", 0, None, None, fd=int(m.group("fd")))
        return TcpSpec(scheme, host, 0, host, None, fd=int(m.group("fd")))
    host, port = _split_hostport(scheme, rest, url)
    if host == "*":
        return TcpSpec(scheme, "", port, None, None)
    return TcpSpec(scheme, host, port, host, None)


def _format(scheme: str, host: str, port: int) -> str:
    if ":" in host:
        return f"{scheme}://[{host}]:{port}"
    return f"{scheme}://{host}:{port}"


def advertised_host() -> str:
    return _settings.get("MONARCH_ADVERTISE_HOST") or _stdsocket.gethostname()


def _resolves_only_to_loopback(host: str) -> bool:
    try:
        infos = _stdsocket.getaddrinfo(host, None)
    except OSError:
        return False
    addrs = {ipaddress.ip_address(str(i[4][0]).split("%", 1)[0]) for i in infos}
    return bool(addrs) and all(a.is_loopback for a in addrs)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return True
    except ValueError:
        return False


def _inherited_socket(spec: TcpSpec, bind_spec: str) -> _stdsocket.socket:
    """The listening socket of ``HOST:fdN``: descriptor N, which this process
    inherited (``subprocess.Popen(pass_fds=...)``), must be a TCP socket
    already bound to HOST (any address for ``*``), so that what the address
    says is where it listens (the worker loop's loopback rule reads HOST).
    It is put in listening mode; this transport owns it from then on."""
    fd = spec.fd
    assert fd is not None
    try:
        sock = _stdsocket.socket(fileno=fd)
    except OSError as e:
        raise TransportError(f"cannot listen on {bind_spec}: descriptor {fd} is not an open socket of this process "
                             f"({e.strerror or e}); pass it to the process (pass_fds) and bind it first") from None
    try:
        if sock.type != _stdsocket.SOCK_STREAM or sock.family not in (_stdsocket.AF_INET, _stdsocket.AF_INET6):
            raise TransportError(f"cannot listen on {bind_spec}: descriptor {fd} is not a TCP socket")
        bound, port = sock.getsockname()[:2]
        if port == 0:
            raise TransportError(f"cannot listen on {bind_spec}: descriptor {fd} is not bound; bind it to "
                                 f"{spec.bind_host or '0.0.0.0'}:PORT before passing it")
        if spec.bind_host and not _same_address(spec.bind_host, str(bound)):
            raise TransportError(f"cannot listen on {bind_spec}: descriptor {fd} is bound to {bound}, not "
                                 f"{spec.bind_host}; name the address it is bound to "
                                 f"({_url_host(str(bound))}:fd{fd}, or *:fd{fd} for a socket bound to every interface)")
        sock.setblocking(False)
        sock.listen(1024)
    except TransportError:
        sock.close()
        raise
    except OSError as e:
        sock.close()
        raise TransportError(f"cannot listen on {bind_spec}: {e.strerror or e}") from None
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _same_address(host: str, bound: str) -> bool:
    """Whether ``bound`` (an address) is ``host`` (an address or a name resolved here)."""
    try:
        want = {ipaddress.ip_address(host.split("%", 1)[0])}
    except ValueError:
        try:
            want = {ipaddress.ip_address(str(i[4][0]).split("%", 1)[0]) for i in _stdsocket.getaddrinfo(host, None)}
        except OSError:
            return False
    return ipaddress.ip_address(bound.split("%", 1)[0]) in want


class _TcpBase(Transport):
    scheme = "tcp"

    def default_bind_spec(self) -> str:
        return f"{self.scheme}://*:0"

    async def _wrap_accepted(self, stream: Stream) -> Stream:
        """The stream an accepted connection is served as (each transport says)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Import what listening, dialing and accepting need (trio, the socket
        streams, the TLS record layer, and the idna codec ``ssl`` encodes a
        ``server_hostname`` with): in a fork server, once for its procs."""
        import encodings.idna  # noqa: F401
        import trio  # noqa: F401

        from monarch_core import streams  # noqa: F401
        from monarch_transport_tcp import _record  # noqa: F401

    def normalize(self, url: str) -> str:
        parse(url, self.scheme)
        return url

    def child_bind_spec(self, parent_address: str) -> str:
        """Children bind every interface and advertise the parent's host."""
        try:
            spec = parse(parent_address, self.scheme)
        except ValueError:
            return self.default_bind_spec()
        host = spec.adv_host or spec.bind_host
        if not host or host == "*":
            return self.default_bind_spec()
        h = f"[{host}]" if ":" in host else host
        wildcard = "[::]" if ":" in host else "*"
        return f"{self.scheme}://{h}:0@{self.scheme}://{wildcard}:0"

    async def listen(self, bind_spec: str) -> Listener:
        import trio

        spec = parse(bind_spec, self.scheme)
        adv = spec.adv_host
        if adv is None:
            adv = advertised_host()
            if _resolves_only_to_loopback(adv):
                global _warned_loopback
                with _warn_lock:
                    if not _warned_loopback:
                        _warned_loopback = True
                        logger.warning(
                            "this host's name %r resolves only to loopback: procs on this host can reach each "
                            "other over %s, but other hosts cannot reach them. Use enable_transport('%s://"
                            "<routable address>:0') or set MONARCH_ADVERTISE_HOST=<routable name or address>.",
                            adv,
                            self.scheme,
                            self.scheme,
                        )
        if spec.fd is not None:
            sock = trio.socket.from_stdlib_socket(_inherited_socket(spec, bind_spec))
            return self._make_listener(sock, _format(self.scheme, adv, sock.getsockname()[1]))
        bind_host = spec.bind_host
        family = _stdsocket.AF_INET6 if ":" in bind_host else _stdsocket.AF_INET
        sock = trio.socket.socket(family, _stdsocket.SOCK_STREAM)
        try:
            sock.setsockopt(_stdsocket.SOL_SOCKET, _stdsocket.SO_REUSEADDR, 1)
            await sock.bind((bind_host or ("::" if family == _stdsocket.AF_INET6 else "0.0.0.0"), spec.bind_port))
            sock.listen(1024)
        except OSError as e:
            sock.close()
            hint = " (the port is in use; choose another, or 0 for any free port)" if e.errno == errno.EADDRINUSE else ""
            if e.errno == errno.EADDRNOTAVAIL:
                hint = f" ({bind_host!r} is not an address of this host)"
            raise TransportError(f"cannot listen on {bind_spec}: {e.strerror or e}{hint}") from None
        port = spec.adv_port or sock.getsockname()[1]
        return self._make_listener(sock, _format(self.scheme, adv, port))

    def _make_listener(self, sock: Any, address: str) -> Listener:
        return _TcpListener(sock, address, self)

    async def _connect_tcp(self, address: str) -> Any:
        import trio

        spec = parse(address, self.scheme)
        host, port = spec.adv_host or spec.bind_host, spec.adv_port or spec.bind_port
        if host in ("", "*") or port == 0:
            raise ConnectError(f"cannot connect to {address}: it is a bind spec, not an address")
        try:
            with trio.fail_after(CONNECT_TIMEOUT):
                infos = await trio.socket.getaddrinfo(host, port, type=_stdsocket.SOCK_STREAM)
                last: OSError | None = None
                for family, type_, proto, _c, sockaddr in infos:
                    sock = trio.socket.socket(family, type_, proto)
                    try:
                        await sock.connect(sockaddr)
                        return sock
                    except OSError as e:
                        sock.close()
                        last = e
                assert last is not None
                raise last
        except trio.TooSlowError:
            raise ConnectError(
                f"cannot connect to {address}: no answer within {CONNECT_TIMEOUT:.0f}s "
                f"(MONARCH_CONNECT_TIMEOUT){self._hint(host)}"
            ) from None
        except OSError as e:
            refused = e.errno == errno.ECONNREFUSED
            if isinstance(e, _stdsocket.gaierror):
                raise ConnectError(f"cannot connect to {address}: cannot resolve {host!r} ({e}){self._hint(host)}") from None
            raise ConnectError(f"cannot connect to {address}: {e.strerror or e}{self._hint(host)}", refused=refused) from None

    def _hint(self, host: str) -> str:
        if _is_ip(host):
            return ""
        return (
            f". If {host!r} resolves only to loopback on its own host, that proc advertised an address other "
            f"hosts cannot use: start it with enable_transport('{self.scheme}://<routable address>:0') or "
            "MONARCH_ADVERTISE_HOST=<routable name or address>"
        )

    async def connect(self, address: str) -> Stream:
        from monarch_core.streams import SocketStream

        sock = await self._connect_tcp(address)
        return SocketStream(sock, peer=address)


class _TcpListener(Listener):
    def __init__(self, sock: Any, address: str, transport: _TcpBase) -> None:
        from monarch_core.streams import SocketListener

        self._inner = SocketListener(sock, address)
        self.address = address
        self._t = transport

    async def accept(self) -> Stream:
        return await self._t._wrap_accepted(await self._inner.accept())

    async def aclose(self) -> None:
        await self._inner.aclose()


class TcpTransport(_TcpBase):
    """Plain TCP: no authentication (use ``tls`` across machines you do not trust)."""

    name = "tcp"
    scheme = "tcp"

    def set_credentials(self, *, ca: str | None = None, cert: str | None = None, key: str | None = None) -> None:
        """Checked as for ``tls`` (``ca="trust_all_connections"`` allowed), then unused: tcp authenticates nobody
        (``ca=SESSION_CREDENTIALS`` makes nothing)."""
        if ca == SESSION_CREDENTIALS and cert is None and key is None:
            return
        check_credentials(self.scheme, ca=ca, cert=cert, key=key)

    async def _wrap_accepted(self, stream: Stream) -> Stream:
        return stream


# ----------------------------------------------------------------- TLS


def _pem_or_path(value: str, what: str, temps: list[str]) -> str:
    """A file path for ``value`` (inline PEM goes to a private temp file,
    recorded in ``temps`` for removal once loaded)."""
    if "-----BEGIN" in value:
        fd, path = tempfile.mkstemp(prefix=f"monarch-{what}-", suffix=".pem")
        temps.append(path)
        with os.fdopen(fd, "w") as f:
            f.write(value)
        return path
    if not os.path.exists(value):
        raise TransportError(f"{what}: {value!r} is neither inline PEM nor an existing file")
    return value


#: The environment variables the tls transport reads its credentials from
#: (when ``set_credentials`` did not give them), by ``set_credentials`` argument.
TLS_VARS = {"ca": "MONARCH_TLS_CA", "cert": "MONARCH_TLS_CERT", "key": "MONARCH_TLS_KEY"}


def check_credentials(scheme: str, *, ca: str | None, cert: str | None, key: str | None) -> dict[str, str]:
    """Validate API credentials (``ca=``, ``private_key=``, ``cert=``) for
    ``scheme``; return them by variable name (file paths made absolute)."""
    if ca == TRUST_ALL:
        if scheme == "tls":
            raise ValueError(
                "ca='trust_all_connections' turns authentication off, which a tls:// address cannot do; "
                "pass the CA certificate that signed the peers' certificates (ca='ca.pem'), or use tcp://"
            )
        ca = None
    out = {}
    for value, var in ((ca, "MONARCH_TLS_CA"), (key, "MONARCH_TLS_KEY"), (cert, "MONARCH_TLS_CERT")):
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise TypeError(f"{var.split('_')[-1].lower()} must be a file path or inline PEM (str), got {value!r}")
        if "-----BEGIN" not in value and not os.path.exists(value):
            raise FileNotFoundError(f"{var}: {value!r} is neither inline PEM nor an existing file")
        out[var] = os.path.abspath(value) if "-----BEGIN" not in value else value
    return out


class _Credentials:
    """TLS contexts built from the credentials given to ``set_credentials``,
    else from MONARCH_TLS_* (rebuilt when they change)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self.server: ssl.SSLContext | None = None
        self.client: ssl.SSLContext | None = None
        self.given: dict[str, str] = {}
        self.lock = threading.Lock()
        #: session credentials were asked for (``set_credentials(ca=SESSION_CREDENTIALS)``)
        self.session_wanted = False
        self.session: Any = None  # _pki.SessionCA, made on first use
        self.identity: Any = None  # _pki.Issued: this process's certificate from the session CA
        self.identity_names: set[str] = set()  # the names it is valid for

    def configured(self) -> dict[str, str]:
        """The user's credentials, by variable name (given, else the environment)."""
        with self.lock:
            given = dict(self.given)
        out = {}
        for var in TLS_VARS.values():
            v = given.get(var) or settings.get(var)
            if v:
                out[var] = v
        return out

    def in_session(self) -> bool:
        """Session credentials are in effect (asked for, and none configured)."""
        return self.session_wanted and not self.configured()

    def start_session(self, bind_host: str | None) -> None:
        """Make the session CA and this process's certificate (valid for
        ``bind_host`` and this host's names), once; issue the certificate
        again when a later call names a host it does not cover (credentials
        asked for before the client listened: a scheduler starting its hosts
        while the client's kernel starts)."""
        from monarch_transport_tcp import _pki

        with self.lock:
            names = _pki.local_names(bind_host)
            if self.identity is not None and set(names) <= self.identity_names:
                return
            if self.session is None:
                self.session = _pki.SessionCA()
                logger.info("tls: session credentials made (a CA in this process's memory; valid until %s)",
                            self.session.not_after.isoformat(timespec="seconds"))
            names = list(dict.fromkeys([*sorted(self.identity_names), *names]))
            self.identity = self.session.issue("monarch client", names)
            self.identity_names = set(names)

    def values(self) -> dict[str, str]:
        """The credentials in effect, by variable name: configured ones, else
        the session's (made on first use)."""
        out = self.configured()
        if out or not self.session_wanted:
            return out
        self.start_session(None)
        return {"MONARCH_TLS_CA": self.session.ca_pem, "MONARCH_TLS_CERT": self.identity.cert_pem,
                "MONARCH_TLS_KEY": self.identity.key_pem}

    def issue(self, host: str) -> dict[str, str]:
        """Credentials for one worker loop listening on ``host`` (session mode)."""
        from monarch_transport_tcp import _pki

        self.start_session(None)
        worker = self.session.issue(f"monarch worker {host}", _pki.names_of(host))
        return {"MONARCH_TLS_CA": self.session.ca_pem, "MONARCH_TLS_CERT": worker.cert_pem,
                "MONARCH_TLS_KEY": worker.key_pem}

    def contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        v = self.values()
        key = (v.get("MONARCH_TLS_CERT"), v.get("MONARCH_TLS_KEY"), v.get("MONARCH_TLS_CA"),
               _settings.get("MONARCH_TLS_VERIFY_HOSTNAME"))
        with self.lock:
            if key != self._key or self.server is None or self.client is None:
                self.server, self.client = _build_contexts(*key)
                self._key = key
            return self.server, self.client


def _build_contexts(cert: str | None, key: str | None, ca: str | None, verify_host: bool) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    missing = [n for n, v in (("MONARCH_TLS_CA", ca), ("MONARCH_TLS_KEY", key or cert)) if not v]
    if missing:
        raise TransportError(
            f"the tls transport needs {' and '.join(missing)} (a file path or inline PEM; MONARCH_TLS_CERT too "
            "unless the key file holds the certificate), or ca=/private_key= arguments where the API takes them"
        )
    temps: list[str] = []
    try:
        ca_path = _pem_or_path(ca, "MONARCH_TLS_CA", temps)  # type: ignore[arg-type]
        key_path = _pem_or_path(key or cert, "MONARCH_TLS_KEY", temps)  # type: ignore[arg-type]
        cert_path = _pem_or_path(cert, "MONARCH_TLS_CERT", temps) if cert else key_path
        contexts = []
        for purpose in (ssl.Purpose.CLIENT_AUTH, ssl.Purpose.SERVER_AUTH):
            ctx = ssl.create_default_context(purpose, cafile=ca_path)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_cert_chain(cert_path, key_path)
            if purpose is ssl.Purpose.SERVER_AUTH:
                ctx.check_hostname = verify_host
            contexts.append(ctx)
    except (ssl.SSLError, OSError, ValueError) as e:
        raise TransportError(f"cannot load TLS credentials (MONARCH_TLS_CERT/KEY/CA): {e}") from None
    finally:
        for path in temps:  # inline PEM was only needed while loading
            try:
                os.unlink(path)
            except OSError:
                pass
    return contexts[0], contexts[1]


#: The first byte of a TLS handshake record (every ClientHello starts with it).
_TLS_HANDSHAKE = 0x16
#: A fatal TLS alert (unexpected_message), sent to a client whose first bytes
#: are not TLS (OpenSSL closes without a word): a monarch ``tcp://`` client
#: reads it and says that the port speaks TLS.
_ALERT_NOT_TLS = bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0A])


class _TlsStream(Stream):
    """A TLS connection (:class:`~._record.TlsSocket`) with errors mapped
    into monarch's; after the handshake, :meth:`raw_socket` hands the same
    connection to the kernel's fast path (poller reads, direct writes).

    ``raw``: the accepted trio socket of a server-side stream; its first
    bytes are looked at (not taken) before the handshake, which happens on
    the first read, to tell a client that does not speak TLS at all from one
    that fails the handshake."""

    def __init__(self, tls: TlsSocket, trio_sock: Any, peer: str, handshaken: bool = False, raw: Any = None) -> None:
        self._tls = tls
        self._trio_sock = trio_sock
        self.peer = peer
        self._handshaken = handshaken
        self._raw = raw

    async def _refuse_plaintext(self) -> None:
        """Raise AuthenticationError, after answering with a TLS alert, when
        the client's first bytes are not a TLS handshake record."""
        import trio

        raw, self._raw = self._raw, None
        try:
            head = await raw.recv(8, _stdsocket.MSG_PEEK)
        except OSError:
            return  # the TLS read reports it
        if not head or head[0] == _TLS_HANDSHAKE:
            return
        with trio.move_on_after(1):
            try:
                # take what it sent (closing on unread bytes would reset the
                # connection, and the alert could be lost), then answer
                await raw.recv(65536)
                await raw.send(_ALERT_NOT_TLS)
            except OSError:
                pass
        raise AuthenticationError(
            f"TLS handshake with {self.peer} failed: the peer is not speaking TLS (its first bytes: {bytes(head)!r}); "
            "a tcp:// client dialling this tls:// port?"
        )

    async def _server_handshake(self) -> None:
        import trio

        if self._raw is not None:
            await self._refuse_plaintext()
        try:
            with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                await self._tls.handshake()
        except trio.TooSlowError:
            raise AuthenticationError(
                f"TLS handshake with {self.peer} failed: no handshake within {TLS_HANDSHAKE_TIMEOUT:.0f}s") from None
        except (OSError, ssl.SSLError) as e:
            await self._flush_alert()
            raise self._error(e) from None
        self._handshaken = True

    @property
    def authenticated(self) -> bool:  # type: ignore[override]  # (read-only: only the handshake sets it)
        """The peer presented a certificate of our CA (the handshake is done)."""
        return self._handshaken

    async def _flush_alert(self) -> None:
        """After a failed handshake, send the TLS alert the SSL object queued, so
        the peer learns why."""
        import trio

        try:
            pending = self._tls.pending_alert()
            if pending:
                with trio.move_on_after(1):
                    await self._trio_sock.send(pending)
        except Exception:  # noqa: BLE001 - best effort
            pass

    def _error(self, e: BaseException) -> ConnectionClosed:
        if not self._handshaken:
            return AuthenticationError(
                f"TLS handshake with {self.peer} failed: {_ssl_reason(e, detail=True)} (the peer must present a "
                "certificate signed by this side's CA, over TLS 1.3)"
            )
        return ConnectionClosed(f"TLS connection with {self.peer} broke: {_ssl_reason(e)}")

    async def send_all(self, data: Any) -> None:
        if not self._handshaken:
            await self._server_handshake()
        try:
            await self._tls.send_all(data)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise self._error(e) from None

    async def receive_some(self, max_bytes: int = 65536) -> bytes:
        if not self._handshaken:
            await self._server_handshake()
        try:
            return await self._tls.receive_some(max_bytes)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise self._error(e) from None

    async def receive_into(self, buffer: memoryview) -> int:
        if not self._handshaken:
            await self._server_handshake()
        try:
            return await self._tls.receive_into(buffer)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise self._error(e) from None

    def raw_socket(self) -> Any:
        """The connection itself, for the kernel's fast path (after the
        handshake): a :class:`~._record.TlsSocket`, thread-safe, with the
        socket interface and ``pending``/``pending_output``."""
        return self._tls if self._handshaken else None

    async def aclose(self) -> None:
        import trio

        if self._handshaken:
            self._tls.close_notify()
        self._trio_sock.close()
        await trio.lowlevel.checkpoint()


def _ssl_reason(e: BaseException, detail: bool = False) -> str:
    """The OpenSSL reason of ``e`` (``detail``: with what the certificate check
    found, e.g. "certificate has expired")."""
    cause = e.__cause__ or e.__context__
    for x in (e, cause):
        if isinstance(x, ssl.SSLError):
            reason = getattr(x, "reason", None) or str(x)
            verify = getattr(x, "verify_message", None)
            return f"{reason}: {verify}" if detail and verify else reason
    return str(e) or type(e).__name__


def _closed_in_handshake(e: BaseException) -> bool:
    """The peer closed (or reset) the connection during our TLS handshake
    without a TLS alert: what a port that does not speak TLS does."""
    for x in (e, e.__cause__, e.__context__):
        if isinstance(x, (ssl.SSLEOFError, ConnectionResetError, BrokenPipeError)):
            return True
        if isinstance(x, ssl.SSLError) and x.reason == "UNEXPECTED_EOF_WHILE_READING":
            return True
    return False


class TlsTransport(_TcpBase):
    """TCP + TLS 1.3, mutual authentication."""

    name = "tls"
    scheme = "tls"

    def __init__(self) -> None:
        self._credentials = _Credentials()

    def set_credentials(self, *, ca: str | None = None, cert: str | None = None, key: str | None = None) -> None:
        """Use these (file paths or inline PEM) instead of ``MONARCH_TLS_CA``/
        ``_CERT``/``_KEY``; ``None`` keeps the variable's value.
        ``ca=SESSION_CREDENTIALS``: session credentials (``_pki``) unless
        credentials are configured."""
        if ca == SESSION_CREDENTIALS and cert is None and key is None:
            self._credentials.session_wanted = True
            return
        given = check_credentials(self.scheme, ca=ca, cert=cert, key=key)
        with self._credentials.lock:
            self._credentials.given.update(given)

    def prepare(self) -> None:
        """The base's imports, and the configured credentials loaded into TLS
        contexts now (a fork server's procs inherit them: ~3 ms of
        ``load_cert_chain`` and context set-up each); no contexts when no
        credentials are configured (session credentials are made by the
        client, not here) or they do not load (the proc reports that when it
        listens)."""
        super().prepare()
        if not self._credentials.configured():
            return
        try:
            self._credentials.contexts()
        except TransportError:
            pass

    def child_env(self, *, portable: bool = False) -> dict[str, str]:
        """``MONARCH_TLS_CA``/``_CERT``/``_KEY`` in effect (``portable``: as
        inline PEM, for a worker loop on another host)."""
        out = self._credentials.values()
        if portable and not self._credentials.in_session():
            for var, v in out.items():
                if "-----BEGIN" not in v and os.path.exists(v):
                    with open(v, encoding="ascii") as f:
                        out[var] = f.read()
        return out

    def worker_credentials(self, host: str) -> dict[str, str]:
        """With session credentials: a key and certificate for the worker loop
        listening on ``host`` alone (and the session CA); else the configured
        credentials as inline PEM."""
        if self._credentials.in_session():
            return self._credentials.issue(host)
        return self.child_env(portable=True)

    async def listen(self, bind_spec: str) -> Listener:
        if self._credentials.in_session():
            spec = parse(bind_spec, self.scheme)
            self._credentials.start_session(spec.adv_host or spec.bind_host)
        self._credentials.contexts()  # fail at listen time when credentials are missing
        return await super().listen(bind_spec)

    async def _wrap_accepted(self, stream: Stream) -> Stream:
        from monarch_core.streams import SocketStream
        from monarch_transport_tcp._record import TlsSocket

        server_ctx, _ = self._credentials.contexts()
        assert isinstance(stream, SocketStream)
        # The handshake happens on the first read, in the connection's own task:
        # a slow or bad client never blocks accepting others.
        tls = TlsSocket(stream._sock._sock, server_ctx, server_side=True)
        return _TlsStream(tls, stream._sock, peer=stream.peer, raw=stream._sock)

    async def connect(self, address: str) -> Stream:
        import trio
        from monarch_transport_tcp._record import TlsSocket

        _, client_ctx = self._credentials.contexts()
        spec = parse(address, self.scheme)
        host = spec.adv_host or spec.bind_host
        sock = await self._connect_tcp(address)
        s = TlsSocket(sock._sock, client_ctx, server_side=False, server_hostname=host.split("%", 1)[0])
        try:
            with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                await s.handshake()
        except trio.TooSlowError:
            sock.close()
            raise ConnectError(f"TLS handshake with {address} timed out after {TLS_HANDSHAKE_TIMEOUT:.0f}s") from None
        except (OSError, ssl.SSLError) as e:
            sock.close()
            if _closed_in_handshake(e):
                where = address.split("://", 1)[-1]
                raise ConnectError(
                    f"TLS handshake with {address} failed: {_ssl_reason(e)} (it closed the connection without a "
                    f"TLS answer); if it speaks plain tcp, use tcp://{where}"
                ) from None
            raise ConnectError(
                f"TLS handshake with {address} failed: {_ssl_reason(e)}. Both sides need certificates signed by "
                "the same CA (MONARCH_TLS_CERT/KEY/CA)"
            ) from None
        return _TlsStream(s, sock, peer=address, handshaken=True)
