"""Every transport of monarch-transport-tcp (and the built-in inproc) passes
the public conformance kit, monarch_core.testing.check_transport."""

from __future__ import annotations

import os
import tempfile

import pytest
import trio

from monarch_core._builtins._inproc import InprocTransport
from monarch_core.testing import check_transport
from monarch_core._builtins._ipc import IpcTransport
from monarch_transport_tcp._tcp import TcpTransport

pytestmark = pytest.mark.unit


def test_ipc_abstract_passes_the_conformance_kit() -> None:
    trio.run(check_transport, IpcTransport())


def test_ipc_path_passes_the_conformance_kit() -> None:
    with tempfile.TemporaryDirectory() as d:
        trio.run(check_transport, IpcTransport(), f"ipc://{os.path.join(d, 'sock')}")


def test_tcp_loopback_passes_the_conformance_kit() -> None:
    trio.run(check_transport, TcpTransport(), "tcp://127.0.0.1:0")


def test_inproc_passes_the_conformance_kit() -> None:
    trio.run(check_transport, InprocTransport())


def test_the_kit_catches_a_transport_that_leaks_oserror() -> None:
    class Leaky(IpcTransport):
        async def connect(self, address: str):  # type: ignore[override]
            raise OSError(111, "Connection refused")

    with pytest.raises(AssertionError, match=r"Leaky\.connect\('ipc://@.*'\): ConnectionRefusedError escaped \(\[Errno 111\] "
                                             r"Connection refused\); map library errors"):
        trio.run(check_transport, Leaky())


def _pki(tmp_path) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    ca_path, key_path = str(tmp_path / "ca.pem"), str(tmp_path / "key.pem")
    ca.cert_pem.write_to_path(ca_path)
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(key_path)
    return ca_path, key_path


def test_tls_with_api_credentials_passes_the_conformance_kit(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """(connect() handshakes before the kit's first read: the kit accepts and
    reads concurrently.)  Credentials through set_credentials, none in the env."""
    from monarch_transport_tcp._tcp import TlsTransport

    for var in ("MONARCH_TLS_CA", "MONARCH_TLS_CERT", "MONARCH_TLS_KEY"):
        monkeypatch.delenv(var, raising=False)
    ca, key = _pki(tmp_path)
    tls = TlsTransport()
    tls.set_credentials(ca=ca, key=key)
    trio.run(check_transport, tls, "tls://127.0.0.1:0")
    assert tls.child_env() == {"MONARCH_TLS_CA": ca, "MONARCH_TLS_KEY": key}
    portable = tls.child_env(portable=True)
    assert portable["MONARCH_TLS_CA"].startswith("-----BEGIN CERTIFICATE-----")
    assert "PRIVATE KEY-----" in portable["MONARCH_TLS_KEY"]
    assert "MONARCH_TLS_CA" not in os.environ  # the core writes no MONARCH_TLS_* into this process


def test_tls_api_credentials_override_the_environment_and_are_checked(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from monarch_transport_tcp._tcp import TcpTransport as Tcp, TlsTransport

    ca, key = _pki(tmp_path)
    monkeypatch.setenv("MONARCH_TLS_CA", "/env/ca.pem")
    monkeypatch.setenv("MONARCH_TLS_KEY", key)
    tls = TlsTransport()
    assert tls.child_env() == {"MONARCH_TLS_CA": "/env/ca.pem", "MONARCH_TLS_KEY": key}
    tls.set_credentials(ca=ca)
    assert tls.child_env() == {"MONARCH_TLS_CA": ca, "MONARCH_TLS_KEY": key}
    with pytest.raises(FileNotFoundError, match="MONARCH_TLS_CERT: '/nonexistent.pem' is neither inline PEM"):
        tls.set_credentials(cert="/nonexistent.pem")
    with pytest.raises(ValueError, match="ca='trust_all_connections' turns authentication off"):
        tls.set_credentials(ca="trust_all_connections")
    Tcp().set_credentials(ca="trust_all_connections")  # plain tcp: nothing to authenticate
    assert Tcp().child_env() == {}
