"""Clients a worker loop rejects, on one host (loopback): they back off, the
worker logs the rejections a few times instead of a hundred times a second,
a failed ``attach_to_workers`` leaves no session retrying, and a transport
mismatch (``tcp://`` to a TLS port, ``tls://`` to a plain one) is named.

Real processes and sockets: a worker loop subprocess, a client subprocess,
and in between (where connections are counted) a TCP proxy or a bare
listening socket run by the test.  Counts are taken over windows of a few
seconds with generous bounds (a client that reconnects after every rejection
makes 300+ attempts in 3 s).
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Iterator

import pytest

from _helpers.transport import LISTENING, PY, LineReader, child_env, kill_tree

ATTACH_S = 3  # attach_to_workers(timeout=...) in the clients below
AFTER_S = 2.0  # how long to watch for connections after a failed attach


class Worker:
    """``python -m monarch_core.worker --address {scheme}://127.0.0.1:0`` (its
    stdout and stderr in ``out``)."""

    def __init__(self, scheme: str, pki: Any = None) -> None:
        argv = [PY, "-m", "monarch_core.worker", "--address", f"{scheme}://127.0.0.1:0"]
        if scheme == "tls":
            creds = pki.hosts[1]  # also for 127.0.0.1, signed by the good CA
            argv += ["--ca", pki.ca, "--cert", creds.cert, "--key", creds.key]
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=child_env(), cwd="/")
        self.out = LineReader(self.popen.stdout, f"worker-{scheme}")
        try:
            _, m = self.out.wait_for(LISTENING.match, 60)
        except (EOFError, TimeoutError) as e:
            kill_tree(self.popen)
            raise AssertionError(f"worker loop did not start ({e}):\n{self.out.text()}") from None
        self.address = m.group(1)
        self.port = int(self.address.rsplit(":", 1)[1])

    def warnings(self, since: int = 0) -> list[str]:
        with self.out._cond:
            return [l for l in self.out.lines[since:] if l.startswith("[WARNING")]

    def close(self) -> None:
        kill_tree(self.popen)
        self.out.join(5)


@pytest.fixture
def worker(pki) -> Iterator[Callable[[str], Worker]]:  # type: ignore[no-untyped-def]
    started: list[Worker] = []

    def start(scheme: str) -> Worker:
        w = Worker(scheme, pki)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()


class Listener:
    """A TCP socket on 127.0.0.1 that counts the connections it accepts and
    does ``mode`` with each: "proxy" forwards it to ``target`` (a port),
    "silent" holds it open and never sends, "close" closes it at once."""

    def __init__(self, mode: str, target: int | None = None, port: int = 0) -> None:
        self.mode, self.target = mode, target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[float] = []  # time.monotonic() of each accept
        self.closed_by_peer: list[float] = []  # held ("silent") connections the client closed
        self.held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, name="test-listener", daemon=True).start()

    def count(self, since: float = 0.0) -> int:
        return sum(1 for t in list(self.accepted) if t >= since)

    def _accept(self) -> None:
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(time.monotonic())
            if self.mode == "close":
                c.close()
            elif self.mode == "silent":
                self.held.append(c)
                threading.Thread(target=self._drain, args=(c,), daemon=True).start()
            else:
                try:
                    up = socket.create_connection(("127.0.0.1", self.target), timeout=10)
                except OSError:
                    c.close()
                    continue
                for a, b in ((c, up), (up, c)):
                    threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _drain(self, c: socket.socket) -> None:
        try:
            while c.recv(65536):
                pass
        except OSError:
            pass
        self.closed_by_peer.append(time.monotonic())

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def listener() -> Iterator[Callable[..., Listener]]:
    made: list[Listener] = []

    def make(mode: str, target: int | None = None, port: int = 0) -> Listener:
        lst = Listener(mode, target, port)
        made.append(lst)
        return lst

    yield make
    for lst in made:
        lst.close()


CLIENT = """
import json, sys, time
import monarch_core
from monarch_core.actor import enable_transport
from monarch_core.worker import attach_to_workers
enable_transport({scheme!r} + "://127.0.0.1:0")
try:
    attach_to_workers([{url!r}], {kw}timeout={timeout})
    out = None
except Exception as e:
    out = [type(e).__name__, str(e)]
print(json.dumps({{"error": out, "at": time.monotonic(), "monarch_core": monarch_core.__file__}}), flush=True)
sys.stdin.readline()  # alive (its kernel too) while the test watches
"""


def tls_kw(pki: Any, creds: Any) -> str:
    return f"ca={pki.ca!r}, private_key={creds.key!r}, cert={creds.cert!r}, "


def attach_and_fail(clients: Any, scheme: str, url: str, kw: str = "", timeout: float = ATTACH_S) -> tuple[Any, Any]:
    """Start a client that attaches to ``url`` and wait for its error; return
    (the client, [exception type, message])."""
    c = clients(CLIENT.format(scheme=scheme, url=url, kw=kw, timeout=timeout))
    out = c.expect("error", timeout=90)
    assert out is not None, "attach_to_workers succeeded"
    return c, out


def client_info(c: Any) -> dict:
    line = next(l for l in c.out.lines if '"error"' in l)
    return json.loads(line)


def test_the_subprocesses_run_this_checkout(clients) -> None:  # type: ignore[no-untyped-def]
    import monarch_core

    # the workers' environment is the clients' (child_env)
    c, _err = attach_and_fail(clients, "tcp", "tcp://127.0.0.1:1", timeout=0.5)
    assert client_info(c)["monarch_core"] == monarch_core.__file__
    c.send("done")
    c.finish()


def test_a_rejected_client_backs_off_and_the_worker_logs_the_rejections_rate_limited(worker, listener, clients, pki) -> None:  # type: ignore[no-untyped-def]
    w = worker("tls")
    proxy = listener("proxy", target=w.port)
    c, (name, msg) = attach_and_fail(clients, "tls", f"tls://127.0.0.1:{proxy.port}", tls_kw(pki, pki.other_client))
    # the error says why (the worker's TLS alert reached the client)
    assert name == "ConnectError" and "TLSV1_ALERT_UNKNOWN_CA" in msg, msg
    attempts = proxy.count()
    lines = w.warnings()
    # with a backoff that resets on every "successful" TLS connect: 300+ of each in these 3 s
    assert 1 <= attempts <= 15, f"{attempts} connection attempts in {ATTACH_S}s"
    assert 1 <= len(lines) <= 3, "\n".join(lines)
    assert "dropping connection from 127.0.0.1" in lines[0] and "CERTIFICATE_VERIFY_FAILED" in lines[0], lines[0]
    c.send("done")
    c.finish()
    assert w.popen.poll() is None


@pytest.mark.parametrize("case", ["rejected", "unreachable", "silent"])
def test_a_failed_attach_leaves_no_session_retrying(worker, listener, clients, pki, case: str) -> None:  # type: ignore[no-untyped-def]
    if case == "rejected":  # a TLS worker that rejects the client's certificate
        w = worker("tls")
        watch = listener("proxy", target=w.port)
        c, (name, msg) = attach_and_fail(clients, "tls", f"tls://127.0.0.1:{watch.port}",
                                         tls_kw(pki, pki.other_client))
    elif case == "unreachable":  # nothing listens ... until just after the attach gave up
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        c, (name, msg) = attach_and_fail(clients, "tcp", f"tcp://127.0.0.1:{port}")
        assert "Connection refused" in msg, msg
        watch = listener("close", port=port)
    else:  # accepts and never answers
        watch = listener("silent")
        c, (name, msg) = attach_and_fail(clients, "tcp", f"tcp://127.0.0.1:{watch.port}")
    assert name == "ConnectError" and "did not answer within" in msg, msg
    failed_at = client_info(c)["at"]  # time.monotonic() is one clock for every process
    before = watch.count()
    time.sleep(AFTER_S)
    # the client (and its kernel) still run, but nothing of the attach does:
    # no connection attempts after the error
    assert watch.count(since=failed_at + 0.2) == 0, (
        f"{watch.count(since=failed_at + 0.2)} connections in the {AFTER_S}s after attach failed "
        f"({before} before)"
    )
    if case == "silent":  # the connection the session held open was closed
        assert watch.closed_by_peer, "the client still holds its connection to the silent listener"
    c.send("done")
    c.finish()


def test_a_plain_tcp_dial_of_a_tls_worker_says_it_speaks_tls(worker, clients) -> None:  # type: ignore[no-untyped-def]
    w = worker("tls")
    url = f"tcp://127.0.0.1:{w.port}"
    c, (name, msg) = attach_and_fail(clients, "tcp", url)
    assert name == "ConnectError", msg
    assert f"{url} speaks TLS: use tls://127.0.0.1:{w.port} and pass ca=/private_key=" in msg, msg
    lines = w.warnings()
    assert 1 <= len(lines) <= 3, "\n".join(lines)
    assert "is not speaking TLS" in lines[0] and "MONARCH" in lines[0], lines[0]
    c.send("done")
    c.finish()


def test_a_tls_dial_of_a_plain_tcp_worker_says_it_may_speak_plain_tcp(worker, clients, pki) -> None:  # type: ignore[no-untyped-def]
    w = worker("tcp")
    url = f"tls://127.0.0.1:{w.port}"
    c, (name, msg) = attach_and_fail(clients, "tls", url, tls_kw(pki, pki.client))
    assert name == "ConnectError", msg
    assert f"if it speaks plain tcp, use tcp://127.0.0.1:{w.port}" in msg, msg
    c.send("done")
    c.finish()
