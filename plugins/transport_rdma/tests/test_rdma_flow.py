"""The channel fallback moves a large buffer in chunks: other messages of the
same session pass between them (no starvation)."""

from __future__ import annotations

import time

from monarch_transport_rdma._buffers import _channel

from rdma_actors import pattern


def test_calls_to_the_owner_proc_complete_during_a_large_channel_read(owner, monkeypatch) -> None:
    monkeypatch.setenv("MONARCH_RDMA_BACKEND", "channel")
    n = 256 << 20
    assert n // _channel.CHUNK >= 8 or _channel.CHUNK >= n  # many chunks (one: the check of this test)
    buf = owner.make.call_one("bytearray", n, 5).get(timeout=120)
    want = pattern(n, 5)
    first = want[0]
    assert first != 0
    dst = bytearray(n)
    buf.read_into(dst).get(timeout=120)  # warm: buffers, connection
    dst[0] = 0
    fut = buf.read_into(dst, timeout=120)
    while dst[0] != first and not fut.done():  # the read is under way: its first bytes landed
        time.sleep(0.0002)
    during = 0
    while not fut.done():
        owner.ping.call_one().get(timeout=60)  # its reply shares the session with the read's data
        if not fut.done():
            during += 1
    fut.get(timeout=120)
    # Chunked (32 chunks of 8 MiB, 4 in flight), calls complete all along (6-8 here); as one
    # 256 MiB message, at most the one or two that fit in the final copy into dst.
    assert during >= 3, f"only {during} calls completed while the read was under way: the read held the session"
    assert dst == want
    owner.forget.call_one(5).get(timeout=60)
    buf.drop().get(timeout=60)
