"""A kernel on ``tcp`` against raw-socket peers that are not (yet) proven.

In-process, so that what the receive path holds can be read exactly
(``_wire.receive_stats()``): no allocation for what is only announced, the
limits on not-yet-proven peers, every buffer of a connection returned when it
ends with the cyclic GC off, and a seeded fuzz over many connections after
which nothing is held, nothing was logged at ERROR, and a real client is
served.  Each test runs on both inbound paths: the poller thread (default)
and the trio loop (``MONARCH_THREADED_INBOUND=0``, also how TLS is read).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import marshal
import os
import random
import socket
import struct
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import pytest

from monarch_core._kernel import _runtime
from monarch_core._kernel import _wire as W
from monarch_core._kernel._runtime import Kernel
from monarch_core._plugins import registry

MiB = 1 << 20
SEED = 20260517


class Port:
    """A port handler that records what arrives (any thread)."""

    def __init__(self) -> None:
        self.got: list[tuple[int, int, Any, list]] = []
        self.cond = threading.Condition()

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        with self.cond:
            self.got.append((rank, status, payload, buffers))
            self.cond.notify_all()

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:  # pragma: no cover
        pass

    def wait(self, n: int, timeout: float = 60) -> list:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.got) >= n, timeout), f"{len(self.got)} of {n} arrived"
            return list(self.got)


@pytest.fixture(autouse=True)
def every_drop_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests count dropped connections by their log lines: one each
    (the kernel otherwise writes one per peer host and reason every 10 s)."""
    monkeypatch.setattr(_runtime._dropped, "interval", 0.0)


@pytest.fixture(params=["poller", "loop"])
def server(request, monkeypatch) -> Iterator[Kernel]:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(_runtime, "THREADED_INBOUND", request.param == "poller")
    k = Kernel(proc_id=f"srv-{uuid.uuid4().hex[:8]}", name="srv", transport=registry().transport("tcp"),
               bind_spec="tcp://127.0.0.1:0")
    k.start_thread(name="test-unproven-server")
    try:
        yield k
    finally:
        k.stop_loop()
        k.join(10)


def port_of(k: Kernel) -> int:
    return int(k.address.rsplit(":", 1)[1])  # type: ignore[union-attr]


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} (after {timeout}s): {W.receive_stats()}")
        time.sleep(0.02)


def in_use() -> int:
    """Bytes of receive mappings alive and not kept by the pool for reuse."""
    s = W.receive_stats()
    return s["mapped"] - s["pooled"]


class Log(logging.Handler):
    """What the ``monarch`` loggers say, as (level, message, had a traceback).
    (Handlers that keep records, like pytest's, keep their arguments: the
    kernel logs a dropped connection's error as a string, so that no
    traceback or context of it keeps a buffer alive.)"""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[tuple[int, str, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage(), record.exc_info is not None))

    def messages(self, fragment: str = "") -> list[str]:
        return [m for _l, m, _e in list(self.lines) if fragment in m]


@pytest.fixture
def log() -> Iterator[Log]:
    h = Log()
    lg = logging.getLogger("monarch")
    old = lg.level
    lg.addHandler(h)
    lg.setLevel(logging.WARNING)
    try:
        yield h
    finally:
        lg.removeHandler(h)
        lg.setLevel(old)


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def hello(name: str) -> bytes:
    return W.encode_handshake({"proc": name, "session": f"s-{name}", "address": ""})


def message(seq: int, port_id: int, payload: bytes, bufs: list = ()) -> bytes:  # type: ignore[assignment]
    h = marshal.dumps((port_id, 0, W.S_VALUE))
    return b"".join(bytes(p) for p in W.encode_message(W.K_PORT, 0, seq, h, payload, list(bufs)))


def connect(k: Kernel) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port_of(k)), timeout=60)


def read_acks(s: socket.socket, seq: int) -> None:
    data = b""
    while len(data) < 14 or len(data) < 14 + struct.unpack_from("<I", data, 10)[0]:
        chunk = s.recv(65536)
        assert chunk, "closed before the handshake"
        data += chunk
    data = data[14 + struct.unpack_from("<I", data, 10)[0]:]
    while True:
        while len(data) >= W.FIXED_SIZE:
            kind, *_r, got = W.FIXED.unpack_from(data)
            data = data[W.FIXED_SIZE:]
            if kind == W.K_ACK and got >= seq:
                return
        chunk = s.recv(65536)
        assert chunk, f"closed before acknowledging {seq}"
        data += chunk


# ---------------------------------------------------------------- legitimate large messages


def test_a_first_message_of_64_mib_from_an_unproven_peer_arrives_intact_and_then_it_is_proven(server) -> None:  # type: ignore[no-untyped-def]
    port = Port()
    pid = server.add_port(port)
    rng = random.Random(1)
    payload = rng.randbytes(64 * MiB)
    oob = [rng.randbytes(3 * MiB), bytearray(rng.randbytes(2 * MiB))]
    with connect(server) as s:
        s.sendall(hello("first") + message(1, pid, payload, oob))
        read_acks(s, 1)
        rank, status, p, b = port.wait(1)[0]
        assert bytes(p) == payload
        assert type(b[0]) is bytes and b[0] == oob[0]
        assert not memoryview(b[1]).readonly and bytes(b[1]) == oob[1]
        assert W.receive_stats()["unproven"] == 0
        # proven now: the next one goes straight into a buffer of its size
        s.sendall(message(2, pid, payload[::-1], [payload[:5 * MiB]]))
        _r, _s, p2, b2 = port.wait(2)[1]
        assert bytes(p2) == payload[::-1] and b2[0] == payload[:5 * MiB]
    del p, b, p2, b2, port.got[:]


# ---------------------------------------------------------------- announced, not sent


def test_announcing_64_mib_payloads_allocates_only_what_arrives(server, log) -> None:  # type: ignore[no-untyped-def]
    pid = server.add_port(Port())
    before = in_use()
    socks = []
    try:
        for i in range(32):
            s = connect(server)
            fixed = W.FIXED.pack(W.K_PORT, 0, 0, len(marshal.dumps((pid, 0, 0))), 64 * MiB, 1)
            s.sendall(hello(f"announcer-{i}") + fixed + marshal.dumps((pid, 0, 0)) + b"\0" * 100_000)
            socks.append(s)
        # 100 kB arrived on each: every one is reading into a 1 MiB buffer, charged as such
        wait_until(lambda: W.receive_stats()["unproven"] >= 32 * MiB, 30, "not all 32 payloads started")
        assert W.receive_stats()["unproven"] <= 32 * MiB
        assert in_use() - before <= 32 * MiB, "announced bytes were allocated"
    finally:
        for s in socks:
            s.close()
    wait_until(lambda: W.receive_stats()["unproven"] == 0 and in_use() <= before, 30, "buffers not returned")


# ---------------------------------------------------------------- released at the end, no cyclic GC


@pytest.mark.parametrize("known", [False, True], ids=["unproven", "proven"])
def test_partly_received_buffers_are_returned_when_connections_end_without_the_cyclic_gc(server, known, log) -> None:  # type: ignore[no-untyped-def]
    pid = server.add_port(Port())
    with no_cyclic_gc():
        before = in_use()
        socks = []
        for i in range(8):
            s = connect(server)
            name = f"partial-{known}-{i}"
            start = hello(name)
            seq = 1
            if known:  # one message delivered first: the peer is proven
                s.sendall(start + message(1, pid, b"hi"))
                read_acks(s, 1)
                start, seq = b"", 2
            h = marshal.dumps((pid, 0, 0))
            s.sendall(start + W.FIXED.pack(W.K_PORT, 0, 1, len(h), 3 * MiB, seq) + struct.pack("<Q", 64 * MiB)
                      + h + os.urandom(3 * MiB) + b"\1" * (5 * MiB))  # the payload, 5 MiB of the buffer
            socks.append(s)
        wait_until(lambda: in_use() - before >= 8 * 8 * MiB, 30, "the partial messages did not arrive")
        for s in socks:
            s.close()
        wait_until(lambda: W.receive_stats()["unproven"] == 0 and in_use() <= before, 30,
                   "buffers of ended connections still held (a reference cycle?)")


# ---------------------------------------------------------------- the limits


def test_limits_on_unproven_peers_drop_the_connections_beyond_them(server, monkeypatch, log) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(W, "UNPROVEN_CONN_MAX", 16 * MiB)
    monkeypatch.setattr(W, "UNPROVEN_MAX", 40 * MiB)
    port = Port()
    pid = server.add_port(port)
    h = marshal.dumps((pid, 0, 0))
    # over the per-connection limit: a 64 MiB payload, 20 MiB sent
    with connect(server) as s:
        local = "127.0.0.1:%d" % s.getsockname()[1]
        s.sendall(hello("big") + W.FIXED.pack(W.K_PORT, 0, 0, len(h), 64 * MiB, 1) + h)
        with contextlib.suppress(OSError):
            s.sendall(b"\0" * (20 * MiB))
        wait_until(lambda: log.messages("MONARCH_UNPROVEN_CONN_BYTES_MAX"), 30, "no warning about the per-connection limit")
    level, msg, _tb = next(x for x in log.lines if "MONARCH_UNPROVEN_CONN_BYTES_MAX" in x[1])
    assert level == logging.WARNING and f"dropping connection from {local}: " in msg
    # over the per-process limit: 16 MiB payloads, 15 MiB of each sent: two fit under 40 MiB, the rest are dropped
    socks = []
    for i in range(5):
        s = connect(server)
        s.sendall(hello(f"hog-{i}") + W.FIXED.pack(W.K_PORT, 0, 0, len(h), 16 * MiB, 1) + h)
        with contextlib.suppress(OSError):
            s.sendall(b"\0" * (15 * MiB))
        socks.append(s)
    wait_until(lambda: len(log.messages("MONARCH_UNPROVEN_BYTES_MAX")) >= 3, 30, "no warnings about the per-process limit")
    assert W.receive_stats()["unproven"] <= 40 * MiB
    dropped = {m.split("dropping connection from ", 1)[1].split(":", 2)[1] for m in log.messages("MONARCH_UNPROVEN_BYTES_MAX")}
    kept = [s for s in socks if str(s.getsockname()[1]) not in dropped]
    assert len(kept) <= 2
    for s in kept:  # the ones within the limit complete
        s.sendall(b"\0" * MiB)
        read_acks(s, 1)
    for s in socks:
        s.close()
    port.wait(len(kept))
    wait_until(lambda: W.receive_stats()["unproven"] == 0, 30, "charges not released")
    assert [x for x in log.lines if x[0] >= logging.ERROR or x[2]] == []


# ---------------------------------------------------------------- seeded fuzz


def _fuzz_plan(rng: random.Random, pid: int) -> bytes:
    """One connection's bytes: mutated handshakes, headers announcing large
    parts followed by some of their bytes, random bytes, sometimes after a
    valid message (a proven peer)."""
    name = f"fz-{rng.randrange(1 << 40)}"
    hs = hello(name)
    c = rng.randrange(8)
    if c == 0:  # a mutated handshake
        b = bytearray(hs)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b) + rng.randbytes(rng.randrange(300))
    if c == 1:  # random bytes
        return rng.randbytes(rng.randrange(1, 2000))
    out = bytearray(hs)
    seq = 1
    if c >= 6:  # proven first
        out += message(1, pid, rng.randbytes(rng.randrange(100)))
        seq = 2
    h = marshal.dumps((pid, 0, 0))
    size = rng.choice([W._BIG, W.POOL_MIN, 3 * MiB, 12 * MiB, 64 * MiB, 64 * MiB, W._EAGER + 1, 200 * MiB])
    nb = rng.choice([0, 0, 1, 3])
    lens = [rng.choice([10, W._BIG + 1, size]) | (W.BYTES_BIT if rng.random() < 0.4 else 0) for _ in range(nb)]
    fixed = W.FIXED.pack(W.K_PORT, 0, nb, len(h), rng.choice([0, 7, size, size, size]), seq)
    frame = fixed + (struct.pack(f"<{nb}Q", *lens) if nb else b"") + h
    if rng.random() < 0.3:  # a mutated header
        frame = bytearray(frame)
        frame[rng.randrange(len(frame))] = rng.randrange(256)
        frame = bytes(frame)
    out += frame + b"\x5a" * rng.choice([0, 1000, 70_000, 2 * MiB, 5 * MiB, 7 * MiB, 12 * MiB, 12 * MiB])
    if rng.random() < 0.2:
        out += rng.randbytes(rng.randrange(100))
    return bytes(out)


NO_PORT = 987654321  # fuzz messages that complete are routed to a port nobody has


def _throw(port: int, seeds: list[int]) -> None:
    """Four connections at a time: send each its plan, then close them."""
    for i in range(0, len(seeds), 4):
        socks = []
        for seed in seeds[i:i + 4]:
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            socks.append(s)
            try:
                s.sendall(_fuzz_plan(random.Random(seed), NO_PORT))
            except OSError:  # dropped already
                pass
        for s in socks:
            s.close()


def test_seeded_fuzz_over_many_connections_leaves_nothing_held_and_the_kernel_serving(server, monkeypatch, log) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(W, "UNPROVEN_CONN_MAX", 8 * MiB)
    monkeypatch.setattr(W, "UNPROVEN_MAX", 12 * MiB)
    port = Port()
    pid = server.add_port(port)
    rng = random.Random(SEED)
    seeds = [rng.randrange(1 << 62) for _ in range(400)]
    with no_cyclic_gc():
        before = in_use()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda k: _throw(port_of(server), seeds[k::8]), range(8)))
        wait_until(lambda: W.receive_stats()["unproven"] == 0 and in_use() <= before, 60,
                   "the fuzz left buffers held")
    errors = [x for x in log.lines if x[0] >= logging.ERROR or x[2]]
    assert errors == [], errors[:5]
    drops = log.messages("dropping connection")
    assert len(drops) > 200, f"only {len(drops)} of 400 connections were dropped"
    for setting in ("MONARCH_UNPROVEN_CONN_BYTES_MAX", "MONARCH_UNPROVEN_BYTES_MAX"):
        n = sum(setting in m for m in drops)
        assert n >= 5, f"the fuzz reached {setting} {n} times: {len(drops)} drops"
    # a real client is served: small and 64 MiB messages
    client = Kernel(proc_id=f"cli-{uuid.uuid4().hex[:8]}", name="cli", transport=registry().transport("tcp"),
                    bind_spec="tcp://127.0.0.1:0")
    client.start_thread(name="test-unproven-client")
    try:
        big = os.urandom(64 * MiB)
        n0 = len(port.got)
        header = marshal.dumps((pid, 0, W.S_VALUE))
        client.send(server.proc_id, server.address, W.K_PORT, 0, header, b"small", [])
        client.send(server.proc_id, server.address, W.K_PORT, 0, header, big, [big[:MiB]])
        got = port.wait(n0 + 2)[n0:]
        assert bytes(got[0][2]) == b"small"
        assert bytes(got[1][2]) == big and got[1][3][0] == big[:MiB]
    finally:
        client.stop_loop()
        client.join(10)
