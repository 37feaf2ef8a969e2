"""What a peer that has only shaken hands can make a worker loop hold.

A plain ``tcp`` port authenticates no one, so anyone who reaches it can send
a handshake and then a 20-byte frame header announcing a 64 MiB payload.  The
worker must not allocate for what is only announced (its memory grows with
the bytes that actually arrive), must give back what a connection held as
soon as it ends (no reference cycle waiting for the cyclic GC: these worker
loops run with ``gc.disable()``), and must bound what peers that have not yet
delivered a message may hold, per connection and per process
(``MONARCH_UNPROVEN_CONN_BYTES_MAX`` / ``MONARCH_UNPROVEN_BYTES_MAX``),
dropping the connections beyond with a WARNING that names the peer.

The worker loops are real processes (``python -m monarch_core.worker`` with
the cyclic GC off); their memory is read from ``/proc/<pid>/status``.
"""

from __future__ import annotations

import itertools
import marshal
import re
import select
import socket
import struct
import subprocess
import time
from typing import Iterator

import pytest

from _helpers.transport import PY, LineReader, child_env, free_port, kill_tree
from monarch_core._kernel import _wire as W

MiB = 1 << 20
ANNOUNCED = 64 * MiB

WORKER = """
import gc, sys
gc.disable()  # whatever a connection held must be returned without the cyclic GC
from monarch_core.worker import main
sys.exit(main(["--address", sys.argv[1]]))
"""


class Loop:
    def __init__(self, popen: subprocess.Popen, port: int, out: LineReader) -> None:
        self.popen, self.port, self.out = popen, port, out

    def status(self, key: str) -> int:
        with open(f"/proc/{self.popen.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise AssertionError(f"no {key} in /proc/{self.popen.pid}/status")

    def rss(self) -> int:
        return self.status("VmRSS")

    def wait_rss(self, ok, timeout: float, what: str) -> int:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while True:
            r = self.rss()
            if ok(r):
                return r
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: RSS {r / MiB:.0f} MiB after {timeout}s\n{self.out.text()[-3000:]}")
            time.sleep(0.05)


@pytest.fixture
def start_loop() -> Iterator:
    started: list[Loop] = []

    def start(**env: str) -> Loop:
        port = free_port()
        popen = subprocess.Popen(
            [PY, "-c", WORKER, f"tcp://127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=child_env(env), cwd="/",
        )
        loop = Loop(popen, port, LineReader(popen.stdout, f"loop-{port}"))
        started.append(loop)
        loop.out.wait_for(lambda s: "listening on" in s, 60)
        return loop

    yield start
    for loop in started:
        kill_tree(loop.popen)
        loop.out.join(5)


# ---------------------------------------------------------------- a raw peer


def hello(name: str) -> bytes:
    return W.encode_handshake({"proc": name, "session": f"session-of-{name}", "address": ""})


NO_PORT = marshal.dumps((987654321, 0, W.S_VALUE))  # a port nobody has: routed, dropped, acknowledged


def big_header(seq: int = 1, plen: int = ANNOUNCED) -> bytes:
    """The start of a well-formed message with a ``plen``-byte payload."""
    return W.FIXED.pack(W.K_PORT, 0, 0, len(NO_PORT), plen, seq) + NO_PORT


def small_message(seq: int) -> bytes:
    return b"".join(bytes(p) for p in W.encode_message(W.K_PORT, 0, seq, NO_PORT, b"x", []))


class Peer:
    def __init__(self, port: int, name: str) -> None:
        self.s = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.name = name
        self.local = f"127.0.0.1:{self.s.getsockname()[1]}"  # what the worker calls this peer
        self._in = b""

    def send(self, data: bytes) -> bool:
        try:
            self.s.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def _recv(self) -> bytes:
        try:
            return self.s.recv(65536)
        except ConnectionResetError:
            return b""

    def read_handshake(self) -> None:
        while len(self._in) < 14 or len(self._in) < 14 + struct.unpack_from("<I", self._in, 10)[0]:
            chunk = self._recv()
            assert chunk, f"{self.name}: the worker closed the connection before its handshake"
            self._in += chunk
        self._in = self._in[14 + struct.unpack_from("<I", self._in, 10)[0]:]

    def wait_ack(self, seq: int) -> None:
        """Until the worker acknowledges ``seq`` (it delivered the message)."""
        while True:
            while len(self._in) >= W.FIXED_SIZE:
                kind, *_rest, got = W.FIXED.unpack_from(self._in)
                self._in = self._in[W.FIXED_SIZE:]
                assert kind == W.K_ACK
                if got >= seq:
                    return
            chunk = self._recv()
            assert chunk, f"{self.name}: the worker closed the connection instead of acknowledging {seq}"
            self._in += chunk

    def wait_closed(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"{self.name}: the worker kept the connection open for {timeout}s"
            r, _, _ = select.select([self.s], [], [], left)
            if r and not self._recv():
                return

    def close(self) -> None:
        self.s.close()


def proven(port: int, name: str) -> Peer:
    """A peer whose session has delivered one message (so it is known)."""
    p = Peer(port, name)
    p.send(hello(name))
    p.read_handshake()
    p.send(small_message(1))
    p.wait_ack(1)
    return p


_barriers = itertools.count()


def barrier(port: int) -> None:
    """Once a fresh peer's message is acknowledged, the worker has read the
    connections that sent everything before it."""
    proven(port, f"barrier-{next(_barriers)}").close()


# ---------------------------------------------------------------- the tests


def test_announced_payloads_are_not_allocated_before_their_bytes_arrive(start_loop) -> None:  # type: ignore[no-untyped-def]
    loop = start_loop()
    barrier(loop.port)
    base = loop.rss()
    peers = []
    n = 30
    for i in range(n):
        c = i % 5
        if c < 3:
            p = Peer(loop.port, f"announcer-{i}")
            p.send(hello(p.name))
            p.read_handshake()
        else:  # a peer that delivered a message first (a valid frame is all it takes)
            p = proven(loop.port, f"announcer-{i}")
        if c == 0 or c == 3:  # a payload
            frame = big_header(seq=1 + (c == 3))
        elif c == 1:  # an out-of-band buffer
            frame = W.FIXED.pack(W.K_PORT, 0, 1, 0, 0, 1) + struct.pack("<Q", ANNOUNCED)
        elif c == 2:  # an immutable ``bytes`` buffer
            frame = W.FIXED.pack(W.K_PORT, 0, 1, 0, 0, 1) + struct.pack("<Q", ANNOUNCED | W.BYTES_BIT)
        else:  # more than 64 MiB
            frame = big_header(seq=2, plen=200 * MiB)
        assert p.send(frame + b"\x01" * 4096)
        peers.append(p)
    barrier(loop.port)
    peak = loop.status("VmHWM")
    held = loop.rss()
    # 30 x 64 MiB or more announced: what is held is what arrived (4 KiB each) and then some, not gigabytes
    assert held - base < 64 * MiB, f"{(held - base) / MiB:.0f} MiB held for {n} announced payloads"
    assert peak - base < 96 * MiB, f"peak {(peak - base) / MiB:.0f} MiB over the start for {n} announced payloads"
    for p in peers:
        p.close()
    barrier(loop.port)
    assert loop.popen.poll() is None


def test_what_a_connection_held_is_returned_when_it_ends_without_the_cyclic_gc(start_loop) -> None:  # type: ignore[no-untyped-def]
    loop = start_loop()
    barrier(loop.port)
    base = loop.rss()
    n, sent = 8, 24 * MiB
    peers = []
    for i in range(n):
        p = Peer(loop.port, f"partial-{i}")
        assert p.send(hello(p.name) + big_header() + b"\x02" * sent)  # 24 of the 64 MiB announced
        p.read_handshake()
        peers.append(p)
    loop.wait_rss(lambda r: r - base >= n * sent * 3 // 4, 60, "the partial payloads did not arrive")
    for p in peers:
        p.close()
    loop.wait_rss(lambda r: r - base < 48 * MiB, 30, f"{n} closed connections' partial payloads were not returned")
    assert loop.popen.poll() is None


def test_a_proven_peer_s_partial_buffers_return_too(start_loop) -> None:  # type: ignore[no-untyped-def]
    """A peer that delivered a message first gets pooled, pre-sized buffers;
    when it breaks off mid-payload they return to the pool (bounded by
    MONARCH_BUFFER_POOL_MB) at once, not to a reference cycle."""
    loop = start_loop(MONARCH_BUFFER_POOL_MB="64")
    barrier(loop.port)
    base = loop.rss()
    peers = []
    for i in range(6):
        p = proven(loop.port, f"known-{i}")
        assert p.send(big_header(seq=2) + b"\x03" * (16 * MiB))
        peers.append(p)
    barrier(loop.port)
    for p in peers:
        p.close()
    # the pool keeps one 64 MiB buffer; the other five are unmapped
    loop.wait_rss(lambda r: r - base < 64 * MiB + 48 * MiB, 30, "a proven peer's partial buffers were not returned")
    assert loop.popen.poll() is None


def _dropped(loop: Loop, setting: str, want: int, timeout: float = 60) -> set[str]:
    """The peers the worker dropped over ``setting`` (at least ``want``)."""
    pat = re.compile(r"\[WARNING worker loop\] monarch\.kernel: dropping connection from (127\.0\.0\.1:\d+): "
                     r".*" + re.escape(setting))
    found: set[str] = set()
    i = 0
    while len(found) < want:
        i, m = loop.out.wait_for(pat.search, timeout, start=i)
        found.add(m.group(1))
        i += 1
    return found


def test_the_per_process_limit_drops_the_unproven_connections_beyond_it(start_loop) -> None:  # type: ignore[no-untyped-def]
    loop = start_loop(MONARCH_UNPROVEN_BYTES_MAX=str(64 * MiB), MONARCH_UNPROVEN_CONN_BYTES_MAX=str(48 * MiB),
                      MONARCH_DROP_LOG_INTERVAL="0")  # a line per dropped connection: the test counts them
    base = loop.rss()
    # a 24 MiB payload, 20 MiB of it sent: its buffer has grown to the full 24 MiB (1, 2, ... 16, 24),
    # so two such connections fit under 64 MiB and a third does not
    size, sent = 24 * MiB, 20 * MiB
    peers = []
    for i in range(6):
        p = Peer(loop.port, f"hog-{i}")
        p.send(hello(p.name) + big_header(plen=size) + b"\x04" * sent)
        peers.append(p)
    dropped = _dropped(loop, "MONARCH_UNPROVEN_BYTES_MAX", 4)
    assert dropped <= {p.local for p in peers}
    assert loop.rss() - base < 64 * MiB + 48 * MiB
    for p in peers:
        if p.local in dropped:
            p.wait_closed(30)
    kept = [p for p in peers if p.local not in dropped]
    assert len(kept) <= 2
    for p in kept:  # the connections under the limit are served: their messages complete
        p.read_handshake()
        assert p.send(b"\x04" * (size - sent))
        p.wait_ack(1)
    # what they held is free again: a new peer may send as much
    late = Peer(loop.port, "late")
    assert late.send(hello(late.name) + big_header(plen=size) + b"\x05" * size)
    late.read_handshake()
    late.wait_ack(1)
    assert loop.popen.poll() is None


def test_the_per_connection_limit_drops_an_unproven_connection_not_a_proven_one(start_loop) -> None:  # type: ignore[no-untyped-def]
    loop = start_loop(MONARCH_UNPROVEN_CONN_BYTES_MAX=str(8 * MiB), MONARCH_DROP_LOG_INTERVAL="0")
    stranger = Peer(loop.port, "stranger")
    stranger.send(hello(stranger.name) + big_header() + b"\x06" * (20 * MiB))
    assert _dropped(loop, "MONARCH_UNPROVEN_CONN_BYTES_MAX", 1) == {stranger.local}
    stranger.wait_closed(30)
    known = proven(loop.port, "known")
    assert known.send(big_header(seq=2) + b"\x07" * ANNOUNCED)
    known.wait_ack(2)
    assert loop.popen.poll() is None
