"""Conformance checks for transport plugins (a public, supported module).

Every transport the project ships runs these in its own tests; third-party
transports should too::

    import trio
    from monarch_core.testing import check_transport
    from my_transport.plugin import DirTransport

    def test_conformance():
        trio.run(check_transport, DirTransport(), "dir:///tmp/monarch-test-sock")

:func:`check_transport` listens on ``bind_spec`` (default: the transport's
``default_bind_spec()``), connects to the advertised address, and checks:
ordered bytes both ways; a large payload received with ``receive_into``;
end of stream after the peer closes (``b""``/0, not an exception);
``ConnectionClosed`` (not ``OSError``/trio errors) when writing to a closed
stream; ``aclose`` idempotent; several concurrent connections; a bad or dead
address raising ``ConnectError`` that names it; ``normalize`` rejecting
garbage with ``ValueError``.  It raises ``AssertionError`` describing the
first violation.
"""

from __future__ import annotations

import os

import trio

from monarch_core.errors import ConnectError, ConnectionClosed, TransportError
from monarch_core.hookspecs import Stream, Transport

__all__ = ["check_transport", "check_stream_pair"]


async def _read_exactly(stream: Stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        assert chunk, f"stream ended after {len(buf)} of {n} bytes"
        buf += chunk
    return bytes(buf)


async def check_stream_pair(a: Stream, b: Stream, *, big: int = 8 << 20) -> None:
    """Checks on one connected pair of streams (``a`` dialled ``b``)."""
    await a.send_all(b"ping")
    assert await _read_exactly(b, 4) == b"ping", "bytes a->b differ"
    await b.send_all(memoryview(b"pong!")[:4])
    assert await _read_exactly(a, 4) == b"pong", "bytes b->a (from a memoryview) differ"
    payload = os.urandom(big)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.send_all, payload)
        out = bytearray(big)
        view = memoryview(out)
        have = 0
        while have < big:
            n = await b.receive_into(view[have:])
            assert n > 0, f"receive_into returned {n} after {have} of {big} bytes"
            have += n
    assert bytes(out) == payload, "large payload corrupted"
    await a.aclose()
    await a.aclose()  # idempotent
    end = await b.receive_some(100)
    assert end == b"", f"expected end of stream (b''), got {end!r}"
    try:
        with trio.fail_after(5):
            for _ in range(100):  # the peer is gone: writes must fail with ConnectionClosed
                await b.send_all(b"x" * 65536)
    except ConnectionClosed:
        pass
    except trio.TooSlowError:
        raise AssertionError("writing to a stream whose peer closed neither failed nor finished") from None
    await b.aclose()


async def check_transport(transport: Transport, bind_spec: str | None = None, *, bad_address: str | None = None) -> None:
    """Run every conformance check against ``transport`` (call from ``trio.run``)."""
    spec = bind_spec or transport.default_bind_spec()
    listener = await transport.listen(spec)
    try:
        address = listener.address
        assert address, "Listener.address is empty"
        assert transport.normalize(address) == address, "normalize() changes the advertised address"
        dialled = [await transport.connect(address) for _ in range(3)]  # the backlog holds them
        with trio.fail_after(10):
            accepted = [await listener.accept() for _ in range(3)]
        for i, a in enumerate(dialled):
            await a.send_all(bytes([i]))
        got = []
        for b in accepted:
            got.append((await _read_exactly(b, 1))[0])
        assert sorted(got) == [0, 1, 2], f"three connections delivered {got}"
        pairs = {g: b for g, b in zip(got, accepted)}
        accepted = [pairs[i] for i in range(3)]
        for s in dialled[1:] + accepted[1:]:
            await s.aclose()
        await check_stream_pair(dialled[0], accepted[0])
    finally:
        await listener.aclose()
        await listener.aclose()
    try:
        transport.normalize("\0 not an address \0")
    except ValueError:
        pass
    else:
        raise AssertionError("normalize() accepted garbage instead of raising ValueError")
    target = bad_address or address  # the closed listener's address: nothing listens there now
    try:
        s = await transport.connect(target)
    except ConnectError as e:
        assert target in str(e) or target.split("://", 1)[-1] in str(e), f"ConnectError does not name {target}: {e}"
    except TransportError as e:
        raise AssertionError(f"connect() to a dead address raised {type(e).__name__}, not ConnectError") from None
    else:
        await s.aclose()
        raise AssertionError(f"connect() to {target} (nothing listening) succeeded")
