"""Where a plain ``tcp`` worker loop may listen.

``tcp`` authenticates nobody: anyone who can reach a plain tcp worker port
can run arbitrary code as the worker's user (one forged spawn frame does).
So a tcp worker loop binds loopback -- and its procs too -- unless started
with ``--insecure-tcp`` / ``insecure_tcp=True``, which logs a warning.
``tls`` binds anywhere.

Nothing here needs namespaces; the refused addresses are refused before
anything binds or resolves them.
"""

from __future__ import annotations

import getpass
import subprocess
import textwrap

import pytest

from _helpers.transport import LISTENING, NEEDS_V6, PY, LineReader, child_env, free_port, kill_tree, run_client
from transport_actors import listening_on

USER = getpass.getuser()

REFUSED = {
    "wildcard": ("tcp://*:29500", "every interface"),
    "any-v4": ("tcp://0.0.0.0:29500", "every interface"),
    "any-v6": ("tcp://[::]:29500", "every interface"),
    "ip": ("tcp://192.0.2.7:29500", "'192.0.2.7'"),
    "hostname": ("tcp://h1.example:29500", "'h1.example'"),
    "alias-binding-everything": ("tcp://127.0.0.1:29500@tcp://*:29500", "every interface"),
    "inherited-socket-on-every-interface": ("tcp://*:fd3", "every interface"),
}


def refusal(address: str, where: str) -> str:
    return (
        f"refusing to start a worker loop on plain tcp at {address}: it would listen on {where}, not only on "
        "loopback, and tcp authenticates nobody: anyone who can reach a plain tcp worker port can run arbitrary "
        f"code on this host as {USER}. Use tls:// with --ca/--key (ca=/private_key=), or pass --insecure-tcp "
        "(insecure_tcp=True) on a network you trust"
    )


def insecure_warning(address: str, where: str) -> str:
    return (
        f"INSECURE: worker loop on plain tcp at {address} (listening on {where}, --insecure-tcp/insecure_tcp=True): "
        "nothing is authenticated; anyone who can reach this port or its procs' ports can run arbitrary code on this host "
        f"as {USER}. Use tls:// unless every host that can reach it is trusted."
    )


@pytest.mark.parametrize("case", list(REFUSED))
def test_cli_refuses_a_non_loopback_tcp_bind_without_the_opt_in(case: str) -> None:
    address, where = REFUSED[case]
    res = subprocess.run([PY, "-m", "monarch_core.worker", "--address", address],
                         capture_output=True, text=True, timeout=30, env=child_env(), cwd="/")
    assert (res.returncode, res.stdout, res.stderr) == (2, "", f"error: {refusal(address, where)}\n")


FUNCTION_REFUSES = """
import json
from monarch_core.worker import run_worker_loop_forever
out = []
for address in {addresses!r}:
    try:
        run_worker_loop_forever(address)
        out.append(None)
    except Exception as e:
        out.append([type(e).__name__, str(e)])
print(json.dumps(out))
"""


def test_function_refuses_a_non_loopback_tcp_bind_without_the_opt_in() -> None:
    addresses = [a for a, _w in REFUSED.values()]
    out = run_client(FUNCTION_REFUSES.format(addresses=addresses), timeout=30)
    assert out == [["ValueError", refusal(a, w)] for a, w in REFUSED.values()]


LOOPBACK_CLIENT = """
import json, os
from monarch_core.actor import enable_transport
from monarch_core.worker import attach_to_workers
from transport_actors import Where
enable_transport("tcp://127.0.0.1:0")
hosts = attach_to_workers([{address!r}], timeout=30)
pm = hosts.spawn_procs(per_host={{"gpus": 2}})
w = pm.spawn("w", Where)
out = {{"listens": w.listening.call().get(timeout=60).values(),
       "where": [x["address"] for x in w.where.call().get(timeout=60).values()]}}
pm.stop().get(timeout=60)
print(json.dumps(out), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("host, bound", [("127.0.0.1", "127.0.0.1"), pytest.param("[::1]", "::1", marks=NEEDS_V6),
                                         ("localhost", "127.0.0.1")])
def test_loopback_tcp_worker_loop_starts_and_its_procs_listen_on_loopback_only(workers, host: str, bound: str) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    w = workers(f"tcp://{host}:{port}")
    assert listening_on(port) == [bound]
    out = run_client(LOOPBACK_CLIENT.format(address=w.address))
    # the procs it starts are as unauthenticated as it is: loopback too, not every interface
    assert out["listens"] == [[bound], [bound]], out
    assert all(a.startswith(f"tcp://{host}:") for a in out["where"]), out
    assert "INSECURE" not in w.output() and "WARNING" not in w.output(), w.output()


def test_cli_opt_in_binds_every_interface_and_warns(workers) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    address = f"tcp://0.0.0.0:{port}"
    w = workers(address, args=["--insecure-tcp"])
    assert listening_on(port) == ["0.0.0.0"]
    assert f"[WARNING worker loop] monarch.worker: {insecure_warning(address, 'every interface')}" in w.output()


FUNCTION_OPT_IN = """
import logging
logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
from monarch_core.worker import run_worker_loop_forever
run_worker_loop_forever({address!r}, insecure_tcp=True)
"""


def test_function_opt_in_binds_and_warns() -> None:
    port = free_port()
    address = f"tcp://0.0.0.0:{port}"
    popen = subprocess.Popen([PY, "-c", textwrap.dedent(FUNCTION_OPT_IN.format(address=address))],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=child_env(), cwd="/")
    out = LineReader(popen.stdout, "function-worker")
    try:
        _, m = out.wait_for(LISTENING.match, 30)
        assert m.group(1) == address
        assert listening_on(port) == ["0.0.0.0"]
        assert f"WARNING monarch.worker: {insecure_warning(address, 'every interface')}" in out.text()
    finally:
        kill_tree(popen)
        out.join(5)


def test_tls_worker_loop_binds_every_interface_without_an_opt_in(workers, pki) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    w = workers(f"tls://0.0.0.0:{port}", tls=pki.hosts[1])
    assert listening_on(port) == ["0.0.0.0"]
    assert "INSECURE" not in w.output() and "WARNING" not in w.output(), w.output()


def test_opt_in_on_loopback_changes_nothing(workers) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    w = workers(f"tcp://127.0.0.1:{port}", args=["--insecure-tcp"])
    assert listening_on(port) == ["127.0.0.1"]
    assert "INSECURE" not in w.output(), w.output()


FD_WORKER = """
import socket, subprocess, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(({bind!r}, 0))
port, fd = sock.getsockname()[1], sock.fileno()
code = ("from monarch_core.worker import run_worker_loop_forever; "
        f"run_worker_loop_forever(address='tcp://{host}:fd{{fd}}')")
p = subprocess.Popen([sys.executable, "-c", code], pass_fds=(fd,))
sock.close()  # the worker loop owns it now
print("PORT", port, flush=True)
sys.exit(p.wait())
"""


def _fd_worker(bind: str, host: str) -> tuple[subprocess.Popen, LineReader]:
    popen = subprocess.Popen([PY, "-c", FD_WORKER.format(bind=bind, host=host)], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd="/",
                             start_new_session=True)
    return popen, LineReader(popen.stdout, "fd-worker")


def test_a_worker_loop_listens_on_an_inherited_bound_socket() -> None:
    """``tcp://HOST:fdN`` (the reference's fd bootstrap): the worker loop
    listens on descriptor N, bound by its parent, and advertises its port."""
    popen, out = _fd_worker("127.0.0.1", "127.0.0.1")
    try:
        _, m = out.wait_for(LISTENING.match, 60)
        port = int(out.text().split("PORT ", 1)[1].split()[0])
        assert m.group(1) == f"tcp://127.0.0.1:{port}", out.text()
        assert listening_on(port) == ["127.0.0.1"]
        got = run_client(LOOPBACK_CLIENT.format(address=f"tcp://127.0.0.1:{port}"))
        assert got["listens"] == [["127.0.0.1"], ["127.0.0.1"]], got
    finally:
        kill_tree(popen)
        out.join(5)


def test_an_inherited_socket_bound_elsewhere_than_its_address_says_is_refused() -> None:
    """The address names where the socket listens (the loopback rule reads
    it): a socket bound to every interface given as ``127.0.0.1:fdN`` is refused."""
    popen, out = _fd_worker("0.0.0.0", "127.0.0.1")
    try:
        assert popen.wait(timeout=60) != 0, out.text()
        out.join(5)
        text = out.text()
        assert "is bound to 0.0.0.0, not 127.0.0.1; name the address it is bound to" in text, text
    finally:
        kill_tree(popen)
