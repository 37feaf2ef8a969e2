"""``_Outbound._write_blocking``: a large batch written from a worker thread
arrives byte for byte, whatever the mix of part sizes and however the socket
splits the writes (at most 512 parts per ``sendmsg``, partial writes)."""

from __future__ import annotations

import random
import socket
import threading
import types

import pytest

from monarch_core._kernel._runtime import _Outbound


def _drain(sock: socket.socket, out: bytearray, done: threading.Event) -> None:
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            done.set()
            return
        out += chunk


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_batch_of_thousands_of_parts_arrives_intact(seed: int) -> None:
    rng = random.Random(seed)
    parts: list = []
    for i in range(5000):
        n = rng.choice([0, 1, 7, 20, 100, 4096, 70_000]) if i % 97 else 300_000
        body = bytes([i % 251]) * n
        parts.append(memoryview(bytearray(body)) if i % 3 == 0 else body)
    expected = b"".join(bytes(p) for p in parts)
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)  # many partial writes
    a.setblocking(False)
    got = bytearray()
    done = threading.Event()
    reader = threading.Thread(target=_drain, args=(b, got, done), daemon=True)
    reader.start()
    stub = types.SimpleNamespace(failed=None, kernel=types.SimpleNamespace(_closing=False), proc_id="p")
    try:
        _Outbound._write_blocking(stub, a, list(parts))  # type: ignore[arg-type]
    finally:
        a.close()
    assert done.wait(60)
    b.close()
    assert len(got) == len(expected)
    assert got == expected
    # the caller's parts are untouched (they stay queued for a retransmission)
    assert b"".join(bytes(p) for p in parts) == expected
