"""What the ``tls`` transport says when a connection cannot be a TLS session:
a plaintext client at a TLS port is answered with a TLS alert and reported as
"not speaking TLS"; a certificate the server cannot verify is reported with
what the check found; a TLS dial of a port that closes without a TLS answer
suggests plain tcp.  In one process, over loopback, with trustme certificates.
"""

from __future__ import annotations

import datetime
import socket
import ssl
from typing import Any

import pytest
import trio

from monarch_core.errors import AuthenticationError, ConnectError
from monarch_transport_tcp._tcp import TlsTransport

trustme = pytest.importorskip("trustme")

MONARCH_HELLO = b"MONARCH\x00\x01\x00\x05\x00\x00\x00" + b"x" * 5


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("tls-pki")
    ca, other = trustme.CA(), trustme.CA()
    now = datetime.datetime.now(datetime.timezone.utc)
    out: dict[str, Any] = {"ca_obj": ca, "ca": str(d / "ca.pem")}
    ca.cert_pem.write_to_path(out["ca"])
    for name, leaf in {
        "good": ca.issue_cert("127.0.0.1"),
        "other": other.issue_cert("127.0.0.1"),
        "expired": ca.issue_cert("127.0.0.1", not_before=now - datetime.timedelta(days=10),
                                 not_after=now - datetime.timedelta(days=1)),
    }.items():
        path = d / f"{name}.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(path))
        out[name] = str(path)
    return out


@pytest.fixture
def tls(pki: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> TlsTransport:
    monkeypatch.setenv("MONARCH_TLS_CA", pki["ca"])
    monkeypatch.setenv("MONARCH_TLS_KEY", pki["good"])
    monkeypatch.delenv("MONARCH_TLS_CERT", raising=False)
    monkeypatch.delenv("MONARCH_TLS_VERIFY_HOSTNAME", raising=False)
    return TlsTransport()


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


async def _serve_one(listener: Any, errors: list) -> None:
    """Accept one connection and read from it until it fails (the error goes to ``errors``)."""
    stream = await listener.accept()
    try:
        while await stream.receive_some(65536):
            pass
    except Exception as e:  # noqa: BLE001 - the test looks at it
        errors.append(e)
    finally:
        await stream.aclose()


async def _read_to_eof(sock: Any) -> bytes:
    data = b""
    while True:
        try:
            chunk = await sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def test_a_good_client_still_gets_through(tls: TlsTransport) -> None:
    """(The server looks at a client's first bytes before its handshake.)"""

    async def go() -> bytes:
        with trio.fail_after(20):
            listener = await tls.listen("tls://127.0.0.1:0")

            async def echo() -> None:
                stream = await listener.accept()
                data = await stream.receive_some(65536)
                await stream.send_all(data.upper())
                await stream.aclose()

            async with trio.open_nursery() as n:
                n.start_soon(echo)
                client = await tls.connect(listener.address)
                await client.send_all(MONARCH_HELLO)
                got = await client.receive_some(65536)
                await client.aclose()
            await listener.aclose()
        return got

    assert trio.run(go) == MONARCH_HELLO.upper()


def test_a_plaintext_client_is_answered_with_a_tls_alert_and_reported_as_not_speaking_tls(tls: TlsTransport) -> None:
    async def go() -> tuple[bytes, list]:
        errors: list = []
        with trio.fail_after(20):
            listener = await tls.listen("tls://127.0.0.1:0")
            async with trio.open_nursery() as n:
                n.start_soon(_serve_one, listener, errors)
                sock = trio.socket.socket()
                await sock.connect(("127.0.0.1", _port(listener.address)))
                await sock.send(MONARCH_HELLO)
                reply = await _read_to_eof(sock)
                sock.close()
            await listener.aclose()
        return reply, errors

    reply, errors = trio.run(go)
    assert reply[:3] == b"\x15\x03\x03" and len(reply) == 7, reply  # one fatal TLS alert record
    assert len(errors) == 1 and isinstance(errors[0], AuthenticationError), errors
    msg = str(errors[0])
    assert "failed: the peer is not speaking TLS (its first bytes: b'MONARCH\\x00')" in msg, msg
    assert "a tcp:// client dialling this tls:// port?" in msg, msg


@pytest.mark.parametrize("who, found", [("other", "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate"),
                                        ("expired", "CERTIFICATE_VERIFY_FAILED: certificate has expired")])
def test_a_client_certificate_the_server_cannot_verify_is_reported_with_what_the_check_found(
    tls: TlsTransport, pki: dict[str, Any], who: str, found: str
) -> None:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=pki["ca"])
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(pki[who])

    async def go() -> list:
        errors: list = []
        with trio.fail_after(20):
            listener = await tls.listen("tls://127.0.0.1:0")
            async with trio.open_nursery() as n:
                n.start_soon(_serve_one, listener, errors)
                raw = await trio.open_tcp_stream("127.0.0.1", _port(listener.address))
                s = trio.SSLStream(raw, ctx, server_hostname="127.0.0.1")
                try:
                    await s.do_handshake()  # TLS 1.3: the client's side completes
                    await s.send_all(MONARCH_HELLO)
                    await s.receive_some(100)
                except (trio.BrokenResourceError, ssl.SSLError):
                    pass
                await raw.aclose()
            await listener.aclose()
        return errors

    errors = trio.run(go)
    assert len(errors) == 1 and isinstance(errors[0], AuthenticationError), errors
    assert "TLS handshake with 127.0.0.1:" in str(errors[0]) and found in str(errors[0]), str(errors[0])


def test_a_tls_dial_of_a_port_that_closes_without_a_tls_answer_suggests_plain_tcp(tls: TlsTransport) -> None:
    plain = socket.socket()
    plain.bind(("127.0.0.1", 0))
    plain.listen(4)
    port = plain.getsockname()[1]

    async def serve() -> None:  # a plain monarch port: reads the first bytes, does not like them, closes
        conn, _ = await trio.to_thread.run_sync(plain.accept)
        conn.recv(65536)
        conn.close()

    async def go() -> BaseException:
        with trio.fail_after(20):
            async with trio.open_nursery() as n:
                n.start_soon(serve)
                with pytest.raises(ConnectError) as ei:
                    await tls.connect(f"tls://127.0.0.1:{port}")
        return ei.value

    try:
        e = trio.run(go)
    finally:
        plain.close()
    assert f"if it speaks plain tcp, use tcp://127.0.0.1:{port}" in str(e), str(e)
