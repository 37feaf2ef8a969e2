"""A client in the root namespace drives worker loops on three namespace hosts.

Real processes, real sockets, real network namespaces (see conftest.py).
Every client is a subprocess; its result comes back as JSON.
"""

from __future__ import annotations

import re
import signal
import socket
import time

import pytest

from _helpers.transport import (
    NHOSTS,
    ROOT_ADDR,
    TCP_PORT,
    TLS_PORT,
    host_addr,
    wait_pids_gone,
)

HOSTS = list(range(1, NHOSTS + 1))


def worker_url(scheme: str, i: int, port: int | None = None) -> str:
    return f"{scheme}://{host_addr(i)}:{port or (TLS_PORT if scheme == 'tls' else TCP_PORT)}"


def opt_in(scheme: str) -> list[str] | None:
    """The arguments a worker loop on ``scheme`` needs to listen on a host's
    (non-loopback) address: plain tcp must be let out explicitly."""
    return ["--insecure-tcp"] if scheme == "tcp" else None


def attach_code(scheme: str, workers: list[str], pki=None, creds=None, timeout: float = 30, body: str = "") -> str:  # type: ignore[no-untyped-def]
    """A client snippet: enable ``scheme`` on the root namespace's address,
    attach to ``workers`` (with ``creds``' key and certificate and the good
    CA for tls), then run ``body``."""
    kw = ""
    if scheme == "tls":
        kw = f"ca={pki.ca!r}, private_key={creds.key!r}, cert={creds.cert!r}, "
    return (
        "import json, os, sys, time\n"
        "from monarch_core.actor import enable_transport, Channel\n"
        "from monarch_core.worker import attach_to_workers\n"
        "from monarch_core.errors import ConnectError, SupervisionError, UndeliverableMessageError\n"
        "from transport_actors import Where\n"
        f"enable_transport({scheme + '://' + ROOT_ADDR + ':0'!r})\n"
        f"def attach(workers={workers!r}, timeout={timeout!r}):\n"
        f"    return attach_to_workers(workers, {kw}timeout=timeout)\n" + body
    )


GOOD_CLIENT = """
hosts = attach()
pm = hosts.spawn_procs(per_host={"gpus": 1})
w = pm.spawn("w", Where)
out = {"echo": w.echo.call_one("still serving").get(timeout=60), "where": w.where.call_one().get(timeout=60)}
pm.stop().get(timeout=60)
print(json.dumps(out), flush=True)
# Leave without the at-exit shutdown of the attached hosts: this client must not
# end the worker loop that later checks use (see
# test_a_client_that_exits_without_shutdown_leaves_the_worker_serving).
os._exit(0)
"""


def check_good_client(run_client, scheme, i, pki=None, port=None) -> None:  # type: ignore[no-untyped-def]
    """A well-configured client attaches to the worker on ``hI``, starts a
    proc there and calls it."""
    out = run_client(attach_code(scheme, [worker_url(scheme, i, port)], pki, pki.client if pki else None,
                                 body=GOOD_CLIENT))
    assert out["echo"] == "still serving"
    assert out["where"]["hostname"] == f"h{i}"
    assert re.fullmatch(rf"{scheme}://{re.escape(host_addr(i))}:\d+", out["where"]["address"])


# ---------------------------------------------------------------- three hosts, tcp and tls

CROSS_HOSTS = """
from monarch_core._proc import _state
hosts = attach()
pm = hosts.spawn_procs(per_host={"gpus": 2})
a = pm.spawn("a", Where)
b = pm.spawn("b", Where)
where_a = a.where.call().get(timeout=60).values()
where_b = b.where.call().get(timeout=60).values()
calls = b.call_peers.call(a).get(timeout=60).values()
inbound = a.inbound.call().get(timeout=60).values()
client = _state.current().kernel.address
print(json.dumps({"pids": [w["pid"] for w in where_a]}), flush=True)
sys.stdin.readline()  # the test looks at the procs first
pm.stop().get(timeout=60)
print(json.dumps({"stopped": True}), flush=True)
hosts.shutdown().get(timeout=60)
print(json.dumps({"result": {"client": client, "where_a": where_a, "where_b": where_b, "calls": calls,
                             "inbound": inbound}}))
"""


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
def test_client_drives_three_namespace_hosts_and_actors_call_each_other_directly(
    netns, workers, clients, pki, scheme  # type: ignore[no-untyped-def]
) -> None:
    ws = {i: workers(worker_url(scheme, i), host=i, tls=pki.hosts[i] if scheme == "tls" else None, args=opt_in(scheme))
          for i in HOSTS}
    c = clients(attach_code(scheme, [w.address for w in ws.values()], pki, pki.client, body=CROSS_HOSTS))
    pids = c.expect("pids")
    assert len(set(pids)) == 2 * NHOSTS
    # the procs run under the worker loop of their host
    for r, pid in enumerate(pids):
        assert pid in ws[r // 2 + 1].children()
    c.send("stop")
    assert c.expect("stopped") is True
    assert wait_pids_gone(pids, 30) == []
    out = c.expect("result", timeout=60)
    c.finish()

    assert re.fullmatch(rf"{scheme}://{re.escape(ROOT_ADDR)}:\d+", out["client"])
    for mesh in ("where_a", "where_b"):
        c_where = out[mesh]
        assert [w["hostname"] for w in c_where] == ["h1", "h1", "h2", "h2", "h3", "h3"]
        for r, w in enumerate(c_where):
            i = r // 2 + 1
            assert re.fullmatch(rf"{scheme}://{re.escape(host_addr(i))}:\d+", w["address"]), w
            # procs inherit their worker's credentials, not the client's
            assert w["tls_cert"] == (pki.hosts[i].cert if scheme == "tls" else None)
        assert len({w["netns"] for w in c_where}) == NHOSTS
    assert out["where_a"][0]["pid"] == pids[0]
    a_addrs = [w["address"] for w in out["where_a"]]
    b_addrs = [w["address"] for w in out["where_b"]]
    assert out["calls"] == [{"me": b, "peers": a_addrs} for b in b_addrs]
    # Every actor of mesh A was dialled by the client (10.250.0.1), by its own
    # host's procs and worker loop, and straight from the other two hosts'
    # procs of mesh B: no relay through the client.
    everyone = sorted([ROOT_ADDR] + [host_addr(i) for i in HOSTS])
    assert out["inbound"] == [everyone] * (2 * NHOSTS)
    # HostMesh.shutdown() ends the worker loops
    for w in ws.values():
        assert w.wait_exit(30) == 0, w.output()


# ---------------------------------------------------------------- TLS: who may talk to a worker

ATTACH_ERROR = """
try:
    attach()
    out = None
except Exception as e:
    out = [type(e).__name__, str(e)]
print(json.dumps({"error": out}))
"""


REJECT_PORT = 29520  # the shared TLS worker's own port: no other test's worker collides with it


@pytest.fixture(scope="module")
def tls_h1(netns, pki):  # type: ignore[no-untyped-def]
    """One TLS worker loop on h1 shared by the rejection tests: each must
    leave it serving."""
    from _helpers.transport import WorkerSet

    ws = WorkerSet()
    try:
        yield ws.start(worker_url("tls", 1, port=REJECT_PORT), host=1, tls=pki.hosts[1])
    finally:
        ws.close()


def monarch_hello() -> bytes:
    from monarch_core._kernel import _wire as W

    return W.encode_handshake({"proc": "raw-test-client", "session": "raw-session", "address": ""})


def read_to_eof(sock: socket.socket, limit: int = 1 << 20) -> bytes:
    """Everything the peer sends until it closes (a reset counts as a close)."""
    data = b""
    while len(data) < limit:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data


def assert_rejected_and_still_serving(worker, log_fragments, run_client, pki, since: int) -> None:  # type: ignore[no-untyped-def]
    """The worker logged the rejection, is the same process, and serves a good client."""
    _, line = worker.out.wait_for(lambda l: "dropping connection from" in l and l, 30, since)
    for f in log_fragments:
        assert f in line, f"{f!r} not in worker log line {line!r}"
    assert worker.popen.poll() is None
    check_good_client(run_client, "tls", 1, pki, port=REJECT_PORT)


def test_tls_worker_rejects_a_client_without_a_certificate(tls_h1, pki, run_client) -> None:  # type: ignore[no-untyped-def]
    import ssl

    since = len(tls_h1.out.lines)
    ctx = ssl.create_default_context(cafile=pki.ca)  # verifies the worker, presents nothing
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    with socket.create_connection((host_addr(1), REJECT_PORT), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=host_addr(1)) as s:
            # TLS 1.3: the client's side of the handshake completes; the worker
            # checks the (missing) client certificate and answers with an alert
            s.sendall(monarch_hello())
            try:
                got: object = read_to_eof(s)
            except ssl.SSLError as e:
                got = e.reason
    # the connection ends without a monarch handshake: closed, or closed with
    # the "certificate required" alert
    assert got in (b"", "TLSV13_ALERT_CERTIFICATE_REQUIRED"), got
    assert_rejected_and_still_serving(tls_h1, ["TLS handshake with", "PEER_DID_NOT_RETURN_A_CERTIFICATE"],
                                      run_client, pki, since)


@pytest.mark.parametrize("who", ["other_ca", "expired"])
def test_tls_worker_rejects_a_client_certificate_it_cannot_verify(tls_h1, pki, run_client, who) -> None:  # type: ignore[no-untyped-def]
    since = len(tls_h1.out.lines)
    creds = pki.other_client if who == "other_ca" else pki.expired_client
    out = run_client(attach_code("tls", [tls_h1.address], pki, creds, timeout=3, body=ATTACH_ERROR))
    name, msg = out["error"]
    assert name == "ConnectError"
    assert msg.startswith(f"worker {tls_h1.address} did not answer within 3s"), msg
    assert_rejected_and_still_serving(tls_h1, ["TLS handshake with", "CERTIFICATE_VERIFY_FAILED"], run_client, pki,
                                      since)
    # ... and the rejected client is told why: the worker's TLS alert reaches it
    # (today the worker closes without sending it: the client sees UNEXPECTED_EOF_WHILE_READING)
    alert = "TLSV1_ALERT_UNKNOWN_CA" if who == "other_ca" else "SSLV3_ALERT_CERTIFICATE_EXPIRED"
    assert alert in msg, msg


def test_tls_worker_drops_plaintext_garbage(tls_h1, pki, run_client) -> None:  # type: ignore[no-untyped-def]
    since = len(tls_h1.out.lines)
    with socket.create_connection((host_addr(1), REJECT_PORT), timeout=20) as s:
        s.sendall(b"this is not a TLS record\r\n" * 8 + monarch_hello())
        data = read_to_eof(s)
    assert not data.startswith(b"MONARCH"), data
    assert data == b"" or data[:1] == b"\x15", data  # nothing, or one TLS alert record
    assert_rejected_and_still_serving(tls_h1, ["TLS handshake with"], run_client, pki, since)


def test_tls_worker_refuses_a_plaintext_tcp_client(tls_h1, pki, run_client) -> None:  # type: ignore[no-untyped-def]
    since = len(tls_h1.out.lines)
    url = f"tcp://{host_addr(1)}:{REJECT_PORT}"
    out = run_client(attach_code("tcp", [url], timeout=3, body=ATTACH_ERROR))
    name, msg = out["error"]
    assert name == "ConnectError"
    assert msg.startswith(f"worker {url} did not answer within 3s"), msg
    assert_rejected_and_still_serving(tls_h1, ["TLS handshake with"], run_client, pki, since)


def test_client_refuses_a_worker_whose_certificate_another_ca_signed(netns, workers, pki, run_client) -> None:  # type: ignore[no-untyped-def]
    # the worker trusts the good CA (so it would accept the client) but presents another CA's certificate
    w = workers(worker_url("tls", 2), host=2, tls=pki.other_host[2], ca=pki.ca)
    out = run_client(attach_code("tls", [w.address], pki, pki.client, timeout=3, body=ATTACH_ERROR))
    name, msg = out["error"]
    assert name == "ConnectError"
    assert msg.startswith(f"worker {w.address} did not answer within 3s"), msg
    assert f"(last error: TLS handshake with {w.address} failed: CERTIFICATE_VERIFY_FAILED." in msg, msg
    assert w.popen.poll() is None


# ---------------------------------------------------------------- unreachable workers


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
def test_attach_to_an_address_where_nothing_listens_raises_connect_error_naming_it(netns, pki, run_client, scheme) -> None:  # type: ignore[no-untyped-def]
    url = worker_url(scheme, 2, port=29599)
    out = run_client(attach_code(scheme, [url], pki, pki.client, timeout=3, body=ATTACH_ERROR))
    name, msg = out["error"]
    assert name == "ConnectError"
    assert msg == (
        f"worker {url} did not answer within 3s (last error: cannot connect to {url}: "
        f"Error connecting to ('{host_addr(2)}', 29599): Connection refused). "
        f"Is `python -m monarch_core.worker --address {url}` running there, and reachable from this host? "
        "(MONARCH_ATTACH_TIMEOUT sets the wait)"
    )


def test_attach_to_a_host_whose_link_is_down_raises_connect_error_naming_it(links_up, workers, run_client) -> None:  # type: ignore[no-untyped-def]
    w = workers(worker_url("tcp", 3), host=3, args=opt_in("tcp"))
    links_up.link(3, "down")
    out = run_client(attach_code("tcp", [w.address], timeout=3, body=ATTACH_ERROR))
    links_up.link(3, "up")
    name, msg = out["error"]
    assert name == "ConnectError"
    # packets vanish: the connect is still pending (MONARCH_CONNECT_TIMEOUT is 5s) when the 3s run out
    assert msg == (
        f"worker {w.address} did not answer within 3s. Is `python -m monarch_core.worker --address {w.address}` "
        "running there, and reachable from this host? (MONARCH_ATTACH_TIMEOUT sets the wait)"
    )
    # the link is back: the same worker serves
    assert w.popen.poll() is None
    check_good_client(run_client, "tcp", 3)


# ---------------------------------------------------------------- clients that go away

HOLD_PROCS = """
hosts = attach()
pm = hosts.spawn_procs(per_host={"gpus": 2})
w = pm.spawn("w", Where)
print(json.dumps({"pids": [x["pid"] for x in w.where.call().get(timeout=60).values()]}), flush=True)
sys.stdin.readline()  # killed while waiting here
"""


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
def test_worker_kills_the_procs_of_a_client_that_was_killed_and_serves_the_next(
    netns, workers, clients, pki, run_client, scheme  # type: ignore[no-untyped-def]
) -> None:
    # port 29510: the rejection tests' TLS worker may still hold h1's usual port
    w = workers(worker_url(scheme, 1, port=29510), host=1, tls=pki.hosts[1] if scheme == "tls" else None,
                args=opt_in(scheme))
    c = clients(attach_code(scheme, [w.address], pki, pki.client, body=HOLD_PROCS))
    pids = c.expect("pids")
    assert sorted(pids) == sorted(w.children())
    c.popen.send_signal(signal.SIGKILL)  # the client only: its procs live under the worker loop
    assert c.popen.wait(30) == -signal.SIGKILL
    # the procs notice their owner is gone, and the worker loop kills what is left of the client's work
    assert wait_pids_gone(pids, 30) == [], "the dead client's procs are still running"
    assert w.popen.poll() is None
    check_good_client(run_client, scheme, 1, pki, port=29510)
    assert w.popen.poll() is None


def test_a_client_that_exits_without_shutdown_leaves_the_worker_serving(netns, workers, run_client) -> None:  # type: ignore[no-untyped-def]
    """The worker loop's contract: "When a client goes away, the worker kills
    every proc it started for that client and keeps serving the next one.
    HostMesh.shutdown() ends it."  A client that simply returns from its
    script (never calling shutdown) is a client going away."""
    w = workers(worker_url("tcp", 2), host=2, args=opt_in("tcp"))
    out = run_client(attach_code("tcp", [w.address], body="""
hosts = attach()
pm = hosts.spawn_procs(per_host={"gpus": 1})
print(json.dumps(pm.spawn("w", Where).echo.call_one("first").get(timeout=60)))
"""))
    assert out == "first"
    out = run_client(attach_code("tcp", [w.address], timeout=5, body="""
try:
    hosts = attach()
    pm = hosts.spawn_procs(per_host={"gpus": 1})
    print(json.dumps(pm.spawn("w", Where).echo.call_one("second").get(timeout=60)))
except Exception as e:
    print(json.dumps([type(e).__name__, str(e)]))
os._exit(0)
"""))
    assert out == "second", f"the worker loop did not serve a second client: {out}\nworker log:\n{w.output()}"
    assert w.popen.poll() is None


# ---------------------------------------------------------------- partitions

STREAM = """
hosts = attach()
pm = hosts.spawn_procs(per_host={"gpus": 1})
w = pm.spawn("w", Where)
w.echo.call_one(0).get(timeout=60)
port, recv = Channel.open()
N = 10**5
fut = w.stream.call_one(port, N, 1000, 0.02)   # ~2s of sending, paced
got, gap, last = [], 0.0, time.monotonic()
while True:
    x = recv.recv().get(timeout=120)
    now = time.monotonic()
    gap, last = max(gap, now - last), now
    if x == "end":
        break
    got.append(x)
    if len(got) == 10_000:
        print(json.dumps({"progress": len(got)}), flush=True)
n = fut.get(timeout=60)
bad = next((i for i, v in enumerate(got) if v != i), None)
pm.stop().get(timeout=60)
hosts.shutdown().get(timeout=60)
print(json.dumps({"result": {"n": n, "count": len(got), "in_order": got == list(range(N)), "first_bad": bad,
                             "max_gap": gap}}))
"""

OUTAGE_S = 1.5  # how long the link stays down: a fault parameter, well under the delivery timeout


def test_stream_survives_a_link_flap_shorter_than_the_delivery_timeout(links_up, workers, clients) -> None:  # type: ignore[no-untyped-def]
    env = {"MONARCH_DELIVERY_TIMEOUT": "10"}
    w = workers(worker_url("tcp", 1), host=1, env=env, args=opt_in("tcp"))
    c = clients(attach_code("tcp", [w.address], body=STREAM), env=env)
    assert c.expect("progress") == 10_000
    links_up.link(1, "down")
    time.sleep(OUTAGE_S)  # the outage itself
    links_up.link(1, "up")
    out = c.expect("result", timeout=120)
    c.finish()
    assert out["n"] == 10**5
    assert (out["count"], out["first_bad"], out["in_order"]) == (10**5, None, True)  # exactly once, in order
    # premise: the outage hit the stream midway (without a fault, gaps are milliseconds; the
    # receiver's backlog hides part of the outage)
    assert out["max_gap"] >= 0.5, "the outage did not interrupt the stream; the test proved nothing"
    assert w.wait_exit(30) == 0


LONG_OUTAGE = """
import threading
import monarch_core.actor as api
faults, faulted = [], threading.Event()
def record(failure):  # the mesh's failure is expected here: record it instead of ending the client
    faults.append(failure.report())
    faulted.set()
api.unhandled_fault_hook = record
hosts = attach()
pm = hosts.spawn_procs(per_host={"gpus": 1})
w = pm.spawn("w", Where)
address = w.where.call_one().get(timeout=60)["address"]
port, recv = Channel.open()
fut = w.stream.call_one(port, 10**5, 1000, 0.02)
for _ in range(10_000):
    recv.recv().get(timeout=60)
print(json.dumps({"progress": address}), flush=True)
sys.stdin.readline()   # the test has cut the link
out = {}
try:
    out["echo"] = ["returned", w.echo.call_one("during the outage").get(timeout=20)]
except Exception as e:
    out["echo"] = [type(e).__name__, str(e)]
try:
    out["stream"] = ["returned", fut.get(timeout=10)]
except Exception as e:
    out["stream"] = [type(e).__name__, str(e)]
out["faults"] = faults if faulted.wait(15) else []
print(json.dumps({"result": out}), flush=True)
os._exit(0)   # its host is unreachable: nothing to shut down cleanly
"""


def test_link_down_longer_than_the_delivery_timeout_fails_the_senders_instead_of_hanging(links_up, workers, clients) -> None:  # type: ignore[no-untyped-def]
    env = {"MONARCH_DELIVERY_TIMEOUT": "3"}
    w = workers(worker_url("tcp", 1), host=1, env=env, args=opt_in("tcp"))
    c = clients(attach_code("tcp", [w.address], body=LONG_OUTAGE), env=env)
    proc_address = c.expect("progress")
    links_up.link(1, "down")
    c.send("go")
    try:
        out = c.expect("result", timeout=60)
    finally:
        links_up.link(1, "up")
    c.finish()
    for what in ("echo", "stream"):
        name, msg = out[what]
        assert name in ("UndeliverableMessageError", "SupervisionError"), f"{what}: {name}: {msg}"
        assert proc_address in msg, f"{what}: the error does not name the proc's address: {msg}"
    # and the actor mesh on the unreachable proc is reported failed to its owner
    assert len(out["faults"]) == 1, out["faults"]
    assert out["faults"][0].startswith("actor mesh 'w' failed"), out["faults"][0]
    assert proc_address in out["faults"][0], out["faults"][0]
