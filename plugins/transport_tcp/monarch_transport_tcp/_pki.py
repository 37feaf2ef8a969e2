"""Session credentials of the ``tls`` transport: a short-lived CA, held in the
client's memory, that signs one certificate per process identity.

A client that allocates hosts through a scheduler (SSH, Slurm) and has no TLS
credentials of its own asks its ``tls`` transport for *session* credentials
(``set_credentials(ca=SESSION_CREDENTIALS)``).  Then:

* the client creates a CA (an EC P-256 key and a self-signed certificate,
  valid for ``MONARCH_TLS_SESSION_DAYS``) in memory: its key is never written
  anywhere and never leaves the client;
* the client's own certificate, made when it first listens, names the address
  it listens on (and its host name, ``localhost``, the loopback addresses);
  the procs it starts share it (they listen on the same host);
* every worker loop gets a key and certificate of its own
  (:meth:`SessionCA.issue`, through ``Transport.worker_credentials(host)``),
  valid for the name or address it listens on, plus the CA certificate;
  the procs a worker starts share the worker's;
* every peer requires a certificate chaining to this CA (mutual TLS), so only
  the client, its procs, its workers and their procs talk to each other: a
  stranger, or another user's job with its own CA, is refused at the handshake.

``cryptography`` is imported only when a session CA is made.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import threading
from dataclasses import dataclass
from typing import Iterable

from monarch_transport_tcp import _settings


@dataclass(frozen=True)
class Issued:
    """A private key and its certificate, PEM (the key holds a secret)."""

    cert_pem: str
    key_pem: str


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
        return True
    except ValueError:
        return False


def names_of(host: str, *, resolve: bool = True) -> list[str]:
    """``host`` and, when it is a name, the addresses it resolves to (so a peer
    may dial either); no duplicates, order kept."""
    out = [host]
    if resolve and host and not _is_ip(host):
        try:
            for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM):
                out.append(str(info[4][0]))
        except (OSError, UnicodeError):
            pass
    return list(dict.fromkeys(h for h in out if h))


class SessionCA:
    """A CA for one client session, and the certificates it signs."""

    def __init__(self, name: str = "monarch session") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._x509, self._hashes, self._ec, self._ser = x509, hashes, ec, serialization
        self._NameOID = NameOID
        days = float(_settings.get("MONARCH_TLS_SESSION_DAYS"))
        now = datetime.datetime.now(datetime.timezone.utc)
        self.not_before = now - datetime.timedelta(minutes=5)  # clock skew between hosts
        self.not_after = now + datetime.timedelta(days=days)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self._name = subject
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.not_before)
            .not_valid_after(self.not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                              key_encipherment=False, data_encipherment=False, key_agreement=False,
                              encipher_only=False, decipher_only=False),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_pem = self._cert.public_bytes(serialization.Encoding.PEM).decode("ascii")
        self._lock = threading.Lock()

    def issue(self, common_name: str, hosts: Iterable[str] = ()) -> Issued:
        """A fresh key and a certificate for ``common_name``, valid (as a
        server and as a client) for the names and addresses in ``hosts``."""
        x509, NameOID = self._x509, self._NameOID
        key = self._ec.generate_private_key(self._ec.SECP256R1())
        sans: list = []
        for h in dict.fromkeys(hosts):
            if _is_ip(h):
                sans.append(x509.IPAddress(ipaddress.ip_address(h.split("%", 1)[0])))
            else:
                sans.append(x509.DNSName(h))
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64] or "monarch")]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.not_before)
            .not_valid_after(self.not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH,
                                       x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        with self._lock:
            cert = builder.sign(self._key, self._hashes.SHA256())
        ser = self._ser
        return Issued(
            cert_pem=cert.public_bytes(ser.Encoding.PEM).decode("ascii"),
            key_pem=key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()).decode("ascii"),
        )


def local_names(bind_host: str | None) -> list[str]:
    """What a peer may dial to reach this host: ``bind_host`` (and what it
    resolves to), the host name, ``localhost`` and the loopback addresses."""
    out: list[str] = []
    if bind_host and bind_host not in ("*", "0.0.0.0", "::"):
        out += names_of(bind_host)
    try:
        name = socket.gethostname()
        out += names_of(name)
    except OSError:
        pass
    out += ["localhost", "127.0.0.1", "::1"]
    return list(dict.fromkeys(out))
