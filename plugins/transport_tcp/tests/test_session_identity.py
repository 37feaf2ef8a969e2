"""Session credentials asked for before the client listens (a scheduler
starts its hosts while the client's kernel starts): the client's certificate
is issued again once it listens, so that it names the address it listens on,
and the session CA stays the same (workers keep trusting it)."""

from __future__ import annotations

import pytest

x509 = pytest.importorskip("cryptography.x509")

from monarch_core.hookspecs import SESSION_CREDENTIALS  # noqa: E402
from monarch_transport_tcp._tcp import TlsTransport  # noqa: E402


def _ips(pem: str) -> set[str]:
    cert = x509.load_pem_x509_certificate(pem.encode())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in sans.get_values_for_type(x509.IPAddress)}


def test_credentials_asked_before_listening_are_issued_again_for_the_listening_address() -> None:
    t = TlsTransport()
    t.set_credentials(ca=SESSION_CREDENTIALS)
    early = t.child_env(portable=True)  # what a scheduler reads before the kernel listens
    worker = t.worker_credentials("10.250.0.11")
    assert "10.250.0.1" not in _ips(early["MONARCH_TLS_CERT"])
    t._credentials.start_session("10.250.0.1")  # what listen("tls://10.250.0.1:0") does
    late = t.child_env(portable=True)
    assert "10.250.0.1" in _ips(late["MONARCH_TLS_CERT"])
    assert _ips(early["MONARCH_TLS_CERT"]) <= _ips(late["MONARCH_TLS_CERT"])  # what it named before, it still names
    assert late["MONARCH_TLS_CA"] == early["MONARCH_TLS_CA"] == worker["MONARCH_TLS_CA"]
    t._credentials.start_session("10.250.0.1")  # covered: not issued again
    assert t.child_env(portable=True)["MONARCH_TLS_CERT"] == late["MONARCH_TLS_CERT"]
