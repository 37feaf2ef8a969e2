"""``TlsTransport.prepare()``: what a fork server calls before it forks procs.
Configured credentials are loaded into TLS contexts once, and a process forked
afterwards uses those contexts without loading them again; nothing is made
(no session CA) when none are configured, and credentials that do not load
raise nothing there -- the process that listens or dials reports them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("cryptography.x509")

from monarch_core.errors import TransportError  # noqa: E402
from monarch_core.hookspecs import SESSION_CREDENTIALS  # noqa: E402
from monarch_transport_tcp import _pki, _tcp  # noqa: E402
from monarch_transport_tcp._tcp import TlsTransport  # noqa: E402


def _configured() -> TlsTransport:
    ca = _pki.SessionCA()
    issued = ca.issue("monarch worker 127.0.0.1", ["127.0.0.1"])
    t = TlsTransport()
    t.set_credentials(ca=ca.ca_pem, cert=issued.cert_pem, key=issued.key_pem)
    return t


def test_prepare_loads_configured_credentials_once_and_a_forked_process_reuses_them() -> None:
    t = _configured()
    assert t._credentials.server is None
    t.prepare()
    server, client = t._credentials.server, t._credentials.client
    assert server is not None and client is not None
    assert t._credentials.contexts() == (server, client)  # not built again
    pid = os.fork()
    if pid == 0:  # a proc forked from the fork server: building contexts again would fail here
        code = 1
        try:
            def no_second_build(*args: object) -> None:
                raise AssertionError("contexts built again after the fork")

            _tcp._build_contexts = no_second_build  # type: ignore[assignment]
            code = 0 if t._credentials.contexts() == (server, client) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.unit
def test_prepare_makes_no_session_credentials() -> None:
    t = TlsTransport()
    t.set_credentials(ca=SESSION_CREDENTIALS)  # the client makes them when it listens, never a fork server
    t.prepare()
    assert t._credentials.session is None and t._credentials.server is None


@pytest.mark.unit
def test_prepare_raises_nothing_for_credentials_that_do_not_load_and_the_listener_reports_them() -> None:
    t = TlsTransport()
    t.set_credentials(ca="-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n",
                      key="-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    t.prepare()
    with pytest.raises(TransportError, match="cannot load TLS credentials"):
        t._credentials.contexts()


LAZY = """
import sys
from monarch_transport_tcp._tcp import TlsTransport, TcpTransport
t = TlsTransport()
t.normalize("tls://127.0.0.1:0")
t.child_env()  # what a client does before its scheduler dials its hosts
assert "trio" not in sys.modules, "trio imported before the transport listens or dials"
TcpTransport().prepare()
for name in ("trio", "monarch_core.streams", "monarch_transport_tcp._record", "encodings.idna"):
    assert name in sys.modules, name
print("ok")
"""


def test_trio_waits_for_the_first_listen_or_dial_and_prepare_imports_what_they_need() -> None:
    # (a client's SSH connections start before trio loads; a fork server's procs import nothing after their fork)
    r = subprocess.run([sys.executable, "-c", LAZY], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
