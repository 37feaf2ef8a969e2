"""How an outbound session reconnects, over real ``tcp`` sockets on loopback.

The kernel under test runs on its own thread and sends to a "peer" that is a
bare socket served by a thread of the test, which counts the connections it
accepts and treats each one as the case asks: closes it at once, answers the
handshake and then drops it, or never answers.  A peer that drops every
connection must see a few attempts a second, not hundreds; messages to it
fail after the delivery timeout; a proven session still resumes at once after
its connection breaks, and a peer that went away is still declared dead.
"""

from __future__ import annotations

import logging
import marshal
import socket
import threading
import time
import uuid
from typing import Any, Iterator

import pytest

from monarch_core._kernel import _outbound
from monarch_core._kernel import _wire as W
from monarch_core._kernel._runtime import Kernel
from monarch_core._kernel._throttle import ThrottledLog, peer_host
from monarch_core._plugins import registry
from monarch_core.errors import ConnectError, SupervisionError, UndeliverableMessageError

WINDOW_S = 3.0


class Recorder:
    """A port handler: deliveries and failures, with events."""

    def __init__(self, expect: int = 1) -> None:
        self.values: list[bytes] = []
        self.failures: list[BaseException] = []
        self.expect = expect
        self.got_all = threading.Event()
        self.failed = threading.Event()

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        self.values.append(bytes(payload))
        if len(self.values) >= self.expect:
            self.got_all.set()

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        self.failures.append(exc)
        self.failed.set()


class Peer:
    """A listening socket on 127.0.0.1 that counts connections and, per
    ``mode``: "close" closes each at once; "greet" reads the handshake,
    answers with one, reads what follows and closes without acknowledging;
    "silent" holds it and never sends."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.accepted: list[float] = []
        self.held: list[socket.socket] = []
        threading.Thread(target=self._run, name="test-peer", daemon=True).start()

    def count(self, since: float = 0.0) -> int:
        return sum(1 for t in list(self.accepted) if t >= since)

    def _run(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(time.monotonic())
            if self.mode == "silent":
                self.held.append(c)
                continue
            if self.mode == "greet":
                c.settimeout(5)
                try:
                    c.recv(65536)  # the handshake
                    c.sendall(W.encode_handshake({"proc": "peer", "last": 0}))
                    c.recv(65536)  # the message: not acknowledged
                except OSError:
                    pass
            c.close()

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    k = Kernel(proc_id=f"a-{uuid.uuid4().hex[:8]}", name="a", transport=registry().transport("tcp"),
               bind_spec="tcp://127.0.0.1:0")
    k.start_thread(name="test-kernel-a")
    yield k
    k.stop_loop()
    k.join(10)


@pytest.fixture
def peer() -> Iterator[Any]:
    made: list[Peer] = []

    def make(mode: str) -> Peer:
        p = Peer(mode)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def _send(k: Kernel, proc_id: str, address: str, rec: Recorder | None = None, body: bytes = b"hi",
          port: int = 1) -> None:
    rp = k.add_port(rec) if rec is not None else None
    k.send(proc_id, address, W.K_PORT, 0, marshal.dumps((port, 0, W.S_VALUE)), body, [], rp)


def _wait_first(p: Peer, timeout: float = 10) -> float:
    deadline = time.monotonic() + timeout
    while not p.accepted:
        assert time.monotonic() < deadline, "the kernel never connected"
        time.sleep(0.01)
    return p.accepted[0]


@pytest.mark.parametrize("mode", ["close", "greet"])
def test_a_peer_that_drops_every_connection_is_retried_a_few_times_a_second(kernel, peer, mode: str) -> None:  # type: ignore[no-untyped-def]
    p = peer(mode)
    _send(kernel, "peer-x", p.address)
    first = _wait_first(p)
    time.sleep(WINDOW_S)
    n = p.count(since=first)
    # resetting the backoff on every connect that succeeds: 300+ in 3 s
    assert 1 <= n <= 15, f"{n} connection attempts in {WINDOW_S}s"
    assert kernel.join(0) is False, "the kernel loop died"


@pytest.mark.parametrize("mode", ["close", "greet"])
def test_messages_to_a_peer_that_drops_every_connection_fail_after_the_delivery_timeout(kernel, peer, mode: str) -> None:  # type: ignore[no-untyped-def]
    kernel.delivery_timeout = 1.0
    p = peer(mode)
    rec = Recorder()
    _send(kernel, "peer-x", p.address, rec)
    assert rec.failed.wait(30), "the message was never given up on"
    exc = rec.failures[0]
    assert isinstance(exc, (UndeliverableMessageError, SupervisionError)), repr(exc)
    assert "no connection for 1s" in str(exc), str(exc)
    # ... and the session stopped trying
    time.sleep(0.5)
    n = p.count()
    time.sleep(1.0)
    assert p.count() == n


def test_a_peer_that_never_answers_the_handshake_is_a_connect_error_not_a_crash(kernel, peer, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_outbound, "HANDSHAKE_TIMEOUT", 0.3)  # the outbound session's wait for the answer
    p = peer("silent")
    _send(kernel, "peer-x", p.address)
    _wait_first(p)
    deadline = time.monotonic() + 20
    while not (isinstance(kernel.last_error("peer-x"), ConnectError) and p.count() >= 2):
        assert kernel.join(0) is False, "the kernel loop died (see 'monarch kernel loop crashed')"
        assert time.monotonic() < deadline, f"no retry after the handshake timeout: {kernel.last_error('peer-x')!r}"
        time.sleep(0.05)
    assert "took the connection but sent no handshake within 0.3s" in str(kernel.last_error("peer-x"))


def _two_kernels() -> tuple[Kernel, Kernel]:
    ks = []
    for name in ("a", "b"):
        k = Kernel(proc_id=f"{name}-{uuid.uuid4().hex[:8]}", name=name, transport=registry().transport("tcp"),
                   bind_spec="tcp://127.0.0.1:0")
        k.start_thread(name=f"test-kernel-{name}")
        ks.append(k)
    return ks[0], ks[1]


def test_a_proven_session_resumes_after_each_of_many_breaks_and_delivers_everything_once() -> None:
    a, b = _two_kernels()
    try:
        rec = Recorder(expect=0)
        port = b.add_port(rec)
        sent = 0
        for round_ in range(6):
            rec.expect = sent + 20
            rec.got_all.clear()
            for _ in range(20):
                _send(a, b.proc_id, b.address, body=b"%d" % sent, port=port)
                sent += 1
            assert rec.got_all.wait(30), f"round {round_}: {len(rec.values)} of {sent} delivered"
            # break the connection under the session (its socket, as the direct path holds it)
            out = a._outbound[b.proc_id]
            deadline = time.monotonic() + 10
            while (sock := out.sock) is None:
                assert time.monotonic() < deadline, "the session did not come back"
                time.sleep(0.01)
            sock.shutdown(socket.SHUT_RDWR)
        assert rec.values == [b"%d" % i for i in range(sent)]
    finally:
        for k in (a, b):
            k.stop_loop()
            k.join(10)


def test_a_peer_that_went_away_is_still_declared_dead_by_refused_reconnects() -> None:
    a, b = _two_kernels()
    try:
        waiting = Recorder()
        # delivered (to a port b does not have) and acknowledged, never answered:
        # the reply port waits on b, over a session b proved itself on
        _send(a, b.proc_id, b.address, waiting, port=999)
        deadline = time.monotonic() + 10
        while not (b.proc_id in a._outbound and not a._outbound[b.proc_id].unacked):
            assert time.monotonic() < deadline, "not acknowledged"
            time.sleep(0.01)
        b.stop_loop()
        assert b.join(10)
        assert waiting.failed.wait(20), "the gone peer was never declared dead"
        assert isinstance(waiting.failures[0], SupervisionError), repr(waiting.failures[0])
        assert "nothing listens at" in str(waiting.failures[0]), str(waiting.failures[0])
    finally:
        a.stop_loop()
        a.join(10)


# ---------------------------------------------------------------- the rate-limited log


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_throttled_log_writes_one_line_per_host_and_reason_per_interval_and_counts_the_rest(caplog) -> None:  # type: ignore[no-untyped-def]
    log = logging.getLogger("test.throttle")
    clock = Clock()
    t = ThrottledLog(log, 10.0, clock=clock)
    caplog.set_level(logging.WARNING, logger="test.throttle")

    def reject(peer: str, why: str = "CERTIFICATE_VERIFY_FAILED") -> None:
        t.warning(peer, f"dropping connection from {peer}: TLS handshake with {peer} failed: {why}")

    for i in range(58):  # one host, new port each time, over 5.7 s
        reject(f"10.0.0.5:{40000 + i}")
        clock.t += 0.1
    reject("10.0.0.6:40000")  # another host
    reject("10.0.0.5:41000", "PEER_DID_NOT_RETURN_A_CERTIFICATE")  # another reason
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "dropping connection from 10.0.0.5:40000: TLS handshake with 10.0.0.5:40000 failed: CERTIFICATE_VERIFY_FAILED",
        "dropping connection from 10.0.0.6:40000: TLS handshake with 10.0.0.6:40000 failed: CERTIFICATE_VERIFY_FAILED",
        "dropping connection from 10.0.0.5:41000: TLS handshake with 10.0.0.5:41000 failed: "
        "PEER_DID_NOT_RETURN_A_CERTIFICATE",
    ]
    caplog.clear()
    clock.t += 10.0
    reject("10.0.0.5:42000")
    assert [r.getMessage() for r in caplog.records] == [
        "dropping connection from 10.0.0.5:42000: TLS handshake with 10.0.0.5:42000 failed: CERTIFICATE_VERIFY_FAILED"
        " (and 57 more like it from 10.0.0.5 in the last 16 s)"
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records)


def test_throttled_log_keeps_a_bounded_table() -> None:
    clock = Clock()
    t = ThrottledLog(logging.getLogger("test.throttle.bounded"), 10.0, clock=clock, max_keys=64)
    for i in range(10_000):
        t.warning(f"10.1.{i // 256}.{i % 256}:1", "x")
    assert len(t._last) <= 64


@pytest.mark.parametrize("peer, host", [("10.0.0.5:4000", "10.0.0.5"), ("[::1]:4000", "[::1]"),
                                        ("peer of ipc://@x", "peer of ipc://@x"), ("h1:22", "h1")])
def test_peer_host(peer: str, host: str) -> None:
    assert peer_host(peer) == host
