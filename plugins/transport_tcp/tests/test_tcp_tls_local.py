"""``tcp`` and ``tls`` on one host: every way of enabling them, procs that
call each other over them, and TLS credentials from files or inline PEM.

Each client is a fresh interpreter (one transport per process); it spawns two
procs with ``this_host()`` and makes each call the other.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess

import pytest

from _helpers.transport import NEEDS_V6, PY, child_env, run_client_full, tls_env


HOSTNAME = socket.gethostname()

PAIR = """
import json, os
from monarch_core.actor import ChannelTransport, enable_transport, this_host
from monarch_core._proc import _state
from transport_actors import Where, my_listening
choice = {choice}
enable_transport(choice)
enable_transport(choice)  # the same again: a no-op
pm = this_host().spawn_procs(per_host={{"gpus": 2}})
a = pm.spawn("a", Where)
where = a.where.call().get(timeout=60).values()
one_to_zero = a.slice(gpus=1).call_peers.call_one(a.slice(gpus=0)).get(timeout=60)
zero_to_one = a.slice(gpus=0).call_peers.call_one(a.slice(gpus=1)).get(timeout=60)
out = {{
    "client": _state.current().kernel.address,
    "client_transport": _state.current().transport,
    "client_listens": my_listening(),
    "where": where,
    "listens": a.listening.call().get(timeout=60).values(),
    "calls": [one_to_zero, zero_to_one],
}}
pm.stop().get(timeout=60)
print(json.dumps(out))
"""


def check_pair(out: dict, scheme: str, host: str, client_listens: list[str], proc_listens: list[str]) -> None:
    addr = rf"{scheme}://{re.escape(host)}:\d+"
    assert out["client_transport"] == scheme
    assert re.fullmatch(addr, out["client"]), out["client"]
    procs = [w["address"] for w in out["where"]]
    assert [bool(re.fullmatch(addr, p)) for p in procs] == [True, True], procs
    assert len(set(procs)) == 2 and len({w["pid"] for w in out["where"]}) == 2
    # each proc called the other one
    assert out["calls"] == [{"me": procs[1], "peers": [procs[0]]}, {"me": procs[0], "peers": [procs[1]]}]
    # where the kernels bound (the advertised address can differ: alias form, '*')
    assert out["client_listens"] == client_listens
    assert out["listens"] == [proc_listens, proc_listens]


# (choice as source, advertised host, client binds, procs bind)
TCP_FORMS = {
    "name-tcp": ('"tcp"', HOSTNAME, ["0.0.0.0"], ["0.0.0.0"]),
    "TcpWithHostname": ("ChannelTransport.TcpWithHostname", HOSTNAME, ["0.0.0.0"], ["0.0.0.0"]),
    "TcpWithLocalhost": ("ChannelTransport.TcpWithLocalhost", "127.0.0.1", ["127.0.0.1"], ["0.0.0.0"]),
    "url-ipv4": ('"tcp://127.0.0.1:0"', "127.0.0.1", ["127.0.0.1"], ["0.0.0.0"]),
    "url-wildcard": ('"tcp://*:0"', HOSTNAME, ["0.0.0.0"], ["0.0.0.0"]),
    "url-ipv6": ('"tcp://[::1]:0"', "[::1]", ["::1"], ["::"]),
    "alias": ('"tcp://127.0.0.1:0@tcp://0.0.0.0:0"', "127.0.0.1", ["0.0.0.0"], ["0.0.0.0"]),
}


@pytest.mark.parametrize(
    "form",
    [pytest.param(k, marks=NEEDS_V6) if k == "url-ipv6" else k for k in TCP_FORMS],
)
def test_tcp_form_carries_calls_between_two_procs(form: str) -> None:
    choice, host, client_binds, proc_binds = TCP_FORMS[form]
    out, _err = run_client_full(PAIR.format(choice=choice))
    check_pair(out, "tcp", host, client_binds, proc_binds)


# ---------------------------------------------------------------- tls


@pytest.mark.parametrize("inline", [False, True], ids=["files", "inline-pem"])
def test_tls_with_credentials_from_the_environment(pki, tmp_path, inline: bool) -> None:  # type: ignore[no-untyped-def]
    env = dict(tls_env(pki.client, inline=inline))
    env["TMPDIR"] = str(tmp_path)  # where inline PEM may be spilled to files
    choice = "ChannelTransport.Tls" if inline else '"tls://127.0.0.1:0"'
    out, _err = run_client_full(PAIR.format(choice=choice), env=env)
    if inline:
        # by name: every interface, advertised under this host's name (in the certificate's SANs)
        check_pair(out, "tls", HOSTNAME, ["0.0.0.0"], ["0.0.0.0"])
    else:
        check_pair(out, "tls", "127.0.0.1", ["127.0.0.1"], ["0.0.0.0"])
    # the procs use the client's credentials (inherited), as given
    assert [w["tls_cert"] for w in out["where"]] == [env["MONARCH_TLS_CERT"]] * 2
    # inline keys must not be left behind on disk once the processes are gone
    assert sorted(os.listdir(tmp_path)) == []


def test_tls_with_a_key_file_that_holds_the_certificate(pki) -> None:  # type: ignore[no-untyped-def]
    env = {"MONARCH_TLS_CA": pki.ca, "MONARCH_TLS_KEY": pki.client.combined}
    out, _err = run_client_full(PAIR.format(choice='"tls://127.0.0.1:0"'), env=env)
    check_pair(out, "tls", "127.0.0.1", ["127.0.0.1"], ["0.0.0.0"])


MISSING = """
import json
from monarch_core.actor import enable_transport, this_host
enable_transport({choice!r})
try:
    this_host().spawn_procs(per_host={{"gpus": 1}})
    out = None
except Exception as e:
    out = [type(e).__name__, [c.__name__ for c in type(e).__mro__], str(e)]
import threading
for t in threading.enumerate():  # let the kernel thread finish whatever it reports
    if t is not threading.current_thread() and t.name.startswith("monarch"):
        t.join(10)
print(json.dumps(out))
"""

NEEDS = ("a file path or inline PEM; MONARCH_TLS_CERT too unless the key file holds the certificate), "
         "or ca=/private_key= arguments where the API takes them")


@pytest.mark.parametrize(
    "case",
    ["nothing", "ca-only", "key-only", "missing-file", "not-pem"],
)
def test_tls_without_usable_credentials_fails_with_a_clear_error(pki, case: str) -> None:  # type: ignore[no-untyped-def]
    env, expected = {
        "nothing": ({}, f"the tls transport needs MONARCH_TLS_CA and MONARCH_TLS_KEY ({NEEDS}"),
        "ca-only": ({"MONARCH_TLS_CA": pki.ca}, f"the tls transport needs MONARCH_TLS_KEY ({NEEDS}"),
        "key-only": ({"MONARCH_TLS_KEY": pki.client.combined}, f"the tls transport needs MONARCH_TLS_CA ({NEEDS}"),
        "missing-file": ({"MONARCH_TLS_CA": "/nonexistent/ca.pem", "MONARCH_TLS_KEY": pki.client.key},
                         "MONARCH_TLS_CA: '/nonexistent/ca.pem' is neither inline PEM nor an existing file"),
        "not-pem": ({"MONARCH_TLS_CA": pki.ca, "MONARCH_TLS_KEY": "/etc/hostname"},
                    "cannot load TLS credentials (MONARCH_TLS_CERT/KEY/CA): "),
    }[case]
    out, err = run_client_full(MISSING.format(choice="tls"), env=env)
    assert out is not None, "the tls transport started without credentials"
    name, mro, msg = out
    assert name == "TransportError" and "MonarchError" in mro
    if case == "not-pem":
        assert msg.startswith(expected), msg
    else:
        assert msg == expected
    # the error is the whole story: no traceback of a "crashed" kernel loop on stderr
    assert "Traceback" not in err, err


@pytest.mark.parametrize(
    "args, expected",
    [
        ([], f"error: the tls transport needs MONARCH_TLS_CA and MONARCH_TLS_KEY ({NEEDS}"),
        (["--ca", "/nonexistent/ca.pem"], "error: MONARCH_TLS_CA: '/nonexistent/ca.pem' is neither inline PEM nor an existing file"),
        (["--ca", "trust_all_connections"], "error: ca='trust_all_connections' turns authentication off, which a tls:// "
         "address cannot do; pass the CA certificate that signed the peers' certificates (ca='ca.pem'), or use tcp://"),
    ],
    ids=["no-credentials", "missing-ca-file", "trust-all"],
)
def test_tls_worker_loop_without_usable_credentials_exits_2_with_one_error_line(args: list[str], expected: str) -> None:
    res = subprocess.run(
        [PY, "-m", "monarch_core.worker", "--address", "tls://127.0.0.1:0", *args],
        capture_output=True, text=True, timeout=60, env=child_env(), cwd="/",
    )
    assert (res.returncode, res.stdout, res.stderr) == (2, "", expected + "\n")


def test_attach_with_trust_all_to_tls_workers_is_refused(pki) -> None:  # type: ignore[no-untyped-def]
    out, _err = run_client_full(f"""
import json
from monarch_core.worker import attach_to_workers
try:
    attach_to_workers(["tls://127.0.0.1:1"], ca="trust_all_connections", private_key={pki.client.combined!r})
    out = None
except Exception as e:
    out = [type(e).__name__, str(e)]
print(json.dumps(out))
""")
    assert out == ["ValueError", "ca='trust_all_connections' turns authentication off, which a tls:// address cannot "
                   "do; pass the CA certificate that signed the peers' certificates (ca='ca.pem'), or use tcp://"]
