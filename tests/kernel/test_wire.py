"""The wire format (``monarch_core._kernel._wire``) over real socket pairs.

Every test moves real bytes through ``trio.socket.socketpair()`` wrapped in
``monarch_core.streams.SocketStream``: no fake streams.  Reads that must fail
*without waiting for more bytes* are checked by keeping the writer's end open:
if the reader waited, ``trio.fail_after`` would fire.

The fuzz tests run in a child interpreter with an address-space limit
(``RLIMIT_AS``) so that a length that makes the reader allocate gigabytes
surfaces as a ``MemoryError`` (a failure of the property) instead of taking the
test machine down.
"""

from __future__ import annotations

import array
import gc
import json
import marshal
import os
import pickle
import random
import struct
import subprocess
import sys
import textwrap
import tracemalloc

import pytest
import trio

from monarch_core._proc import _serial
from monarch_core._compat import leaf_exceptions
from monarch_core._kernel import _wire as W
from monarch_core.errors import ConnectionClosed, ProtocolError
from monarch_core.streams import SocketStream

from _helpers import run_async as _run

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- helpers


def _pair() -> tuple[SocketStream, SocketStream]:
    a, b = trio.socket.socketpair()
    # ``peer`` describes the other end: the reader's peer is the writer
    return SocketStream(a, peer="reader"), SocketStream(b, peer="writer")


async def _send_then_close(stream: SocketStream, data: bytes) -> None:
    await stream.send_all(data)
    await stream.aclose()


def _run(afn, *args, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        with trio.fail_after(timeout):
            return await afn(*args)

    return trio.run(main)


async def _roundtrip(messages: list[tuple], trusted: bool | None = None) -> list[tuple]:
    """Write ``messages`` (kind, flags, seq, header, payload, buffers) with
    ``write_parts`` on one end and read them back with ``FrameReader``
    (``trusted=False``: as from a peer not yet proven)."""
    w, r = _pair()
    out: list[tuple] = []
    async with trio.open_nursery() as nursery:

        async def writer() -> None:
            for kind, flags, seq, header, payload, bufs in messages:
                await W.write_parts(w, W.encode_message(kind, flags, seq, header, payload, bufs))

        nursery.start_soon(writer)
        reader = W.FrameReader(r, trusted=trusted)
        for _ in messages:
            out.append(await reader.read_message())
        assert reader.buffered() == 0
    await w.aclose()
    # after the last message the stream ends cleanly
    with pytest.raises(ConnectionClosed):
        await reader.read_message()
    await r.aclose()
    return out


def _as_bytes(x) -> bytes:  # type: ignore[no-untyped-def]
    return memoryview(x).cast("B").tobytes() if isinstance(x, memoryview) else bytes(x)


# ---------------------------------------------------------------- round trips

BUFFER_SETS = {
    "no-buffers": [],
    "one-small": [b"x" * 10],
    "one-empty": [b""],
    "one-big": [os.urandom(W._BIG + 17)],
    "small-and-big-mixed": [b"a", os.urandom(3 * W._BIG), b"", bytearray(b"b" * 1000), os.urandom(W._BIG)],
    "exactly-at-thresholds": [os.urandom(W._BIG - 1), os.urandom(W._BIG), os.urandom(W._COALESCE + 1)],
    "many-small": [bytes([i % 256]) * (i % 50) for i in range(300)],
    "2MiB": [os.urandom(2 << 20)],
}


@pytest.mark.parametrize("bufs", list(BUFFER_SETS.values()), ids=list(BUFFER_SETS))
@pytest.mark.parametrize("payload_size", [0, 5, W._BIG - 1, W._BIG, 300_000])
def test_message_with_out_of_band_buffers_round_trips_exactly(bufs: list, payload_size: int) -> None:
    header = marshal.dumps((7, "endpoint", ("client", "ipc://@x", 3), 0, ("gpus",), (2,), "sender"))
    payload = os.urandom(payload_size)
    (got,) = _run(_roundtrip, [(W.K_ACTOR, 3, 12345678901, header, payload, bufs)])
    kind, flags, seq, h, p, b = got
    assert (kind, flags, seq) == (W.K_ACTOR, 3, 12345678901)
    assert h == header
    assert _as_bytes(p) == payload
    assert [_as_bytes(x) for x in b] == [bytes(x) for x in bufs]
    # buffers sent as ``bytes`` arrive as ``bytes`` (large ones received in
    # place); every other buffer arrives writable (pickle-5 consumers rely on
    # it: numpy arrays rebuilt on them must not be read-only)
    for x, o in zip(b, bufs):
        if type(o) is bytes:
            assert type(x) is bytes
        else:
            assert not memoryview(x).readonly


@pytest.mark.parametrize("size", [0, 10, W._BIG - 1, W._BIG, 3 << 20])
def test_bytes_buffers_arrive_as_bytes_and_others_as_bytearrays(size: int) -> None:
    data = os.urandom(size)
    bufs = [data, bytearray(data), memoryview(data)]
    (got,) = _run(_roundtrip, [(W.K_PORT, 0, 1, marshal.dumps((1, 0, 0)), b"p", bufs)])
    b = got[5]
    assert type(b[0]) is bytes
    assert not memoryview(b[1]).readonly and not memoryview(b[2]).readonly
    assert all(bytes(x) == data for x in b)
    if size:
        assert hash(b[0]) == hash(data)  # a proper bytes object: hashable, equal, its hash not stale


def test_bytes_flag_does_not_lift_the_message_size_limit() -> None:
    data = W.FIXED.pack(W.K_PORT, 0, 1, 0, 0, 1) + struct.pack("<Q", (1 << 40) | W.BYTES_BIT)
    e, peak = _measure(lambda: _run(_frame_error, data, timeout=5))
    assert f"announced a {1 << 40}-byte message (limit {W.MAX_MESSAGE})" in str(e)
    assert peak < 1 << 20


def test_buffers_given_as_typed_and_multidimensional_memoryviews_round_trip_as_raw_bytes() -> None:
    doubles = array.array("d", [float(i) / 3 for i in range(20_000)])  # 160 kB, itemsize 8
    ints = array.array("i", range(100))  # small, itemsize 4
    grid = memoryview(bytearray(range(256)) * 300).cast("B", (300, 256))  # 2-D, 76.8 kB
    bufs = [memoryview(doubles), memoryview(ints), grid]
    (got,) = _run(_roundtrip, [(W.K_PORT, 0, 1, marshal.dumps((1, 0, 0)), b"p", bufs)])
    _k, _f, _s, _h, _p, b = got
    assert [len(x) for x in b] == [doubles.itemsize * len(doubles), ints.itemsize * len(ints), 300 * 256]
    assert bytes(b[0]) == doubles.tobytes()
    assert bytes(b[1]) == ints.tobytes()
    assert bytes(b[2]) == grid.tobytes()


def test_many_messages_of_varied_shapes_back_to_back_keep_order_and_boundaries() -> None:
    rng = random.Random(1234)
    msgs = []
    for seq in range(1, 401):
        nb = rng.choice([0, 0, 1, 2, 3, 8])
        bufs = [rng.randbytes(rng.choice([0, 1, 100, 5000, W._BIG + rng.randrange(100)])) for _ in range(nb)]
        payload = rng.randbytes(rng.choice([0, 3, 700, W._BIG + 5]))
        header = marshal.dumps((seq, "m", rng.randrange(10)))
        msgs.append((rng.randint(1, W.K_BYE), rng.randrange(256), seq, header, payload, bufs))
    got = _run(_roundtrip, msgs, timeout=60)
    assert len(got) == len(msgs)
    for (kind, flags, seq, header, payload, bufs), (gk, gf, gs, gh, gp, gb) in zip(msgs, got):
        assert (gk, gf, gs, gh) == (kind, flags, seq, header)
        assert _as_bytes(gp) == payload
        assert [bytes(x) for x in gb] == bufs


def test_pickle5_payload_with_out_of_band_buffers_is_rebuilt_after_the_wire() -> None:
    big = bytearray(os.urandom(200_000))
    obj = {"tensor": pickle.PickleBuffer(big), "small": bytearray(b"in-band"), "n": 42}
    payload, bufs = _serial.dumps(obj)
    assert len(bufs) == 1  # the large buffer travels out of band
    assert len(payload) < 1000  # ... and was not copied into the pickle
    (got,) = _run(_roundtrip, [(W.K_PORT, 0, 1, marshal.dumps((5, 0, W.S_VALUE)), payload, bufs)])
    _k, _f, _s, _h, p, b = got
    back = _serial.loads(p, b)
    assert bytes(back["tensor"]) == bytes(big)
    assert back["small"] == bytearray(b"in-band")
    assert back["n"] == 42


# ---------------------------------------------------------------- peers not yet proven


def test_who_counts_as_proven() -> None:
    async def go() -> None:
        a, b = trio.socket.socketpair()  # AF_UNIX, this user on both ends (SO_PEERCRED)
        assert W.FrameReader(SocketStream(a, "x")).proven
        assert not W.FrameReader(SocketStream(a, "x"), trusted=False).proven
        lst = trio.socket.socket()
        await lst.bind(("127.0.0.1", 0))
        lst.listen(1)
        c = trio.socket.socket()
        await c.connect(lst.getsockname())
        srv, _ = await lst.accept()
        reader = W.FrameReader(SocketStream(srv, "tcp-peer"))  # tcp: nobody is authenticated
        assert not reader.proven
        delivered: dict[str, int] = {}
        reader.prove_by(lambda: "session-1" in delivered)
        assert not reader.proven
        delivered["session-1"] = 1  # the session delivered a message
        assert reader.proven

        class Declared(SocketStream):
            authenticated = True  # e.g. TLS once its handshake is done

        assert W.FrameReader(Declared(c, "declared")).proven
        from monarch_transport_tcp._tcp import _TlsStream

        tls = _TlsStream(None, None, "tls-peer")  # type: ignore[arg-type]
        tls_reader = W.FrameReader(tls)
        assert not tls.authenticated and not tls_reader.proven  # the handshake comes with the first read
        tls._handshaken = True
        assert tls.authenticated and tls_reader.proven
        for x in (a, b, lst, c, srv):
            x.close()

    _run(go)


UNPROVEN_SETS = {
    "payload-3MiB": (3 << 20, []),
    "over-eager": (W._EAGER + 12345, []),
    "mixed-buffers": (W._BIG + 1, [os.urandom(2 << 20), bytearray(os.urandom(W.POOL_MIN + 7)), b"x" * 100,
                                   os.urandom(W._BIG), bytearray(os.urandom(5 << 20))]),
    "bytes-over-eager": (10, [os.urandom(W._EAGER + 1)]),
}


@pytest.mark.parametrize("case", list(UNPROVEN_SETS), ids=list(UNPROVEN_SETS))
def test_an_unproven_peer_s_large_parts_grow_as_they_arrive_and_round_trip_exactly(case: str) -> None:
    plen, bufs = UNPROVEN_SETS[case]
    payload = os.urandom(plen)
    before = W.receive_stats()
    (got,) = _run(_roundtrip, [(W.K_PORT, 0, 1, marshal.dumps((1, 0, 0)), payload, bufs)], False, timeout=60)
    _k, _f, _s, _h, p, b = got
    assert _as_bytes(p) == payload
    assert [_as_bytes(x) for x in b] == [bytes(x) for x in bufs]
    for x, o in zip(b, bufs):
        assert type(x) is bytes if type(o) is bytes else not memoryview(x).readonly
    assert W.receive_stats()["unproven"] == before["unproven"] == 0  # charged only while under way


def test_an_unproven_peer_s_announced_payload_is_not_allocated_and_is_returned_on_failure() -> None:
    """64 MiB announced, 100 kB sent: a 1 MiB buffer, charged; when the
    connection ends, it is unmapped at once (the cyclic GC is off)."""
    seen: list[dict] = []

    async def go() -> BaseException:
        w, r = _pair()
        reader = W.FrameReader(r, trusted=False)
        await w.send_all(W.FIXED.pack(W.K_PORT, 0, 0, 0, 64 << 20, 1) + b"\0" * 100_000)
        failure: list[BaseException] = []

        async def read() -> None:
            try:
                await reader.read_message()
            except ConnectionClosed as e:
                failure.append(e)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            while W.receive_stats()["unproven"] < 1 << 20:
                await trio.sleep(0.01)
            seen.append(W.receive_stats())
            await w.aclose()
        await r.aclose()
        return failure[0]

    gc.collect()
    gc.disable()
    try:
        base = W.receive_stats()
        e = _run(go, timeout=20)
        after = W.receive_stats()
    finally:
        gc.enable()
    assert "closed mid-message" in str(e)
    assert seen[0]["unproven"] == 1 << 20 and seen[0]["mapped"] - base["mapped"] == 1 << 20
    assert after["unproven"] == 0 and after["maps"] == base["maps"] and after["mapped"] == base["mapped"]


@pytest.mark.parametrize("which", ["connection", "process"])
def test_unproven_limits_are_protocol_errors_naming_the_peer_and_the_setting(which: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(W, "UNPROVEN_CONN_MAX" if which == "connection" else "UNPROVEN_MAX", 4 << 20)
    data = W.FIXED.pack(W.K_PORT, 0, 0, 0, 64 << 20, 1) + os.urandom(5 << 20)

    async def go() -> BaseException:
        w, r = _pair()
        reader = W.FrameReader(r, trusted=False)
        got: list[BaseException] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(w.send_all, data)
            try:
                await reader.read_message()
            except ProtocolError as e:
                got.append(e)
            nursery.cancel_scope.cancel()
        await r.aclose()
        await w.aclose()
        assert got, "read past the limit"
        return got[0]

    e = _run(go, timeout=20)
    setting = "MONARCH_UNPROVEN_CONN_BYTES_MAX" if which == "connection" else "MONARCH_UNPROVEN_BYTES_MAX"
    assert str(e).startswith("peer writer has not delivered a message yet") and setting in str(e)
    assert W.receive_stats()["unproven"] == 0


def test_coalesce_joins_small_parts_and_keeps_large_ones_separate() -> None:
    big = b"B" * W._COALESCE
    parts = [b"a", b"bc", big, b"d", memoryview(b"ef"), big, b"g"]
    out = W.coalesce(parts)
    assert [bytes(x) for x in out] == [b"abc", big, b"def", big, b"g"]
    assert out[1] is big and out[3] is big  # large parts are not copied


# ---------------------------------------------------------------- handshake


def test_handshake_round_trips_a_mapping() -> None:
    info = {"proc": "client-1", "session": "abc", "address": "ipc://@x", "last": 17}

    async def go() -> dict:
        w, r = _pair()
        await w.send_all(W.encode_handshake(info) + W.encode_handshake({"proc": "p2"}))
        reader = W.FrameReader(r)
        first = await W.read_handshake(reader)
        second = await W.read_handshake(reader)
        return first, second

    first, second = _run(go)
    assert first == info
    assert second == {"proc": "p2"}


async def _handshake_error(data: bytes, close: bool) -> BaseException:
    """Feed ``data`` to ``read_handshake``; keep the writer open unless ``close``
    (so a reader that waits for more would hit the timeout instead)."""
    w, r = _pair()
    await w.send_all(data)
    if close:
        await w.aclose()
    reader = W.FrameReader(r)
    try:
        await W.read_handshake(reader)
    except (ProtocolError, ConnectionClosed) as e:
        return e
    finally:
        await w.aclose()
        await r.aclose()
    raise AssertionError("read_handshake accepted bad input")


def test_handshake_with_wrong_magic_is_a_protocol_error_naming_the_peer_and_bytes() -> None:
    e = _run(_handshake_error, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", False, timeout=5)
    assert type(e) is ProtocolError
    msg = str(e)
    assert "peer writer is not speaking the monarch protocol (first bytes b'GET / HT')" in msg


def test_handshake_with_other_version_is_a_protocol_error_naming_both_versions() -> None:
    data = struct.pack("<8sHI", W.MAGIC, W.VERSION + 1, 2) + marshal.dumps({})
    e = _run(_handshake_error, data, False, timeout=5)
    assert type(e) is ProtocolError
    assert "peer writer " in str(e)
    assert f"speaks monarch wire version {W.VERSION + 1}, this process speaks {W.VERSION}" in str(e)
    assert "install the same monarch-core version on every host" in str(e)


def test_handshake_announcing_an_oversized_body_fails_before_reading_it() -> None:
    data = struct.pack("<8sHI", W.MAGIC, W.VERSION, W.MAX_HANDSHAKE + 1)
    # the writer stays open: a reader that tried to read the body would time out
    e = _run(_handshake_error, data, False, timeout=5)
    assert type(e) is ProtocolError
    assert f"sent a {W.MAX_HANDSHAKE + 1}-byte handshake (limit {W.MAX_HANDSHAKE})" in str(e)


@pytest.mark.parametrize(
    "body, fragment",
    [
        (b"\xff\xff\xff", "malformed handshake"),
        (marshal.dumps([1, 2, 3]), "malformed handshake (not a mapping)"),
        (marshal.dumps("just a string"), "malformed handshake (not a mapping)"),
        (b"", "malformed handshake"),
    ],
    ids=["garbage", "list", "str", "empty"],
)
def test_handshake_with_a_malformed_body_is_a_protocol_error(body: bytes, fragment: str) -> None:
    data = struct.pack("<8sHI", W.MAGIC, W.VERSION, len(body)) + body
    e = _run(_handshake_error, data, False, timeout=5)
    assert type(e) is ProtocolError
    assert fragment in str(e)


@pytest.mark.parametrize("cut", [0, 3, 8, 13, 14, 20])
def test_truncated_handshake_is_connection_closed(cut: int) -> None:
    full = W.encode_handshake({"proc": "p", "session": "s" * 20})
    e = _run(_handshake_error, full[:cut], True, timeout=5)
    assert type(e) is ConnectionClosed


# ---------------------------------------------------------------- frame limits


async def _frame_error(data: bytes) -> BaseException:
    """Feed ``data`` to ``read_message`` with the writer kept open."""
    w, r = _pair()
    await w.send_all(data)
    reader = W.FrameReader(r)
    try:
        await reader.read_message()
    except ProtocolError as e:
        return e
    finally:
        await w.aclose()
        await r.aclose()
    raise AssertionError("read_message accepted an over-limit frame")


def _measure(fn):  # type: ignore[no-untyped-def]
    tracemalloc.start()
    try:
        res = fn()
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return res, peak


def test_frame_with_oversized_header_fails_before_reading_or_allocating() -> None:
    data = W.FIXED.pack(W.K_ACTOR, 0, 0, W.MAX_HEADER + 1, 0, 1)
    e, peak = _measure(lambda: _run(_frame_error, data, timeout=5))
    assert "oversized frame" in str(e)
    assert f"header {W.MAX_HEADER + 1} B" in str(e)
    assert peak < W.MAX_HEADER


def test_frame_with_too_many_buffers_fails_before_reading_their_lengths() -> None:
    nbufs = 0xFFFF  # the largest count a frame can announce
    data = W.FIXED.pack(W.K_ACTOR, 0, nbufs, 0, 0, 1)
    e, peak = _measure(lambda: _run(_frame_error, data, timeout=5))
    assert "oversized frame" in str(e)
    assert f"{nbufs} buffers" in str(e)
    assert peak < 8 * nbufs


def test_frame_with_oversized_payload_fails_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    # plen is a u32, so the default limit (MONARCH_MAX_MESSAGE_BYTES, 64 GiB)
    # cannot be exceeded by the payload alone: use a configured lower limit.
    monkeypatch.setattr(W, "MAX_MESSAGE", 1 << 20)
    data = W.FIXED.pack(W.K_PORT, 0, 0, 0, (1 << 20) + 1, 1)
    e, peak = _measure(lambda: _run(_frame_error, data, timeout=5))
    assert "oversized frame" in str(e)
    assert f"payload {(1 << 20) + 1} B" in str(e)
    assert peak < 1 << 20


def test_buffers_announcing_more_than_the_message_limit_fail_before_allocating() -> None:
    lens = [1 << 40, 1]  # 1 TiB announced with the default limit
    data = W.FIXED.pack(W.K_ACTOR, 0, len(lens), 0, 0, 1) + struct.pack("<2Q", *lens)
    e, peak = _measure(lambda: _run(_frame_error, data, timeout=5))
    assert f"announced a {(1 << 40) + 1}-byte message (limit {W.MAX_MESSAGE})" in str(e)
    assert "MONARCH_MAX_MESSAGE_BYTES" in str(e)
    assert peak < 1 << 20


@pytest.mark.parametrize("kind", [0, W.K_BYE + 1, 255])
def test_frame_of_unknown_kind_is_a_protocol_error(kind: int) -> None:
    data = W.FIXED.pack(kind, 0, 0, 0, 0, 1)
    e = _run(_frame_error, data, timeout=5)
    assert f"sent a frame of unknown kind {kind}" in str(e)


@pytest.mark.parametrize(
    "header, ok",
    [
        (marshal.dumps((1, 0, 0)), True),
        (marshal.dumps(()), False),
        (marshal.dumps([1, 2]), False),
        (b"\x00garbage", False),
        (b"", False),
    ],
    ids=["tuple", "empty-tuple", "list", "garbage", "empty"],
)
def test_decode_header_accepts_non_empty_tuples_only(header: bytes, ok: bool) -> None:
    if ok:
        assert W.decode_header("p", header) == (1, 0, 0)
    else:
        with pytest.raises(ProtocolError, match="peer p sent a malformed message header"):
            W.decode_header("p", header)


# ---------------------------------------------------------------- marshal bombs
#
# ``marshal.loads`` of a 5-byte body ``(`` + u32 n allocates an n-tuple before
# noticing the data is missing.  The handshake body and the message header are
# decoded with marshal, so a peer can make the receiver allocate up to 16 GiB
# with a 19-byte handshake.  These run in a child with RLIMIT_AS so the test
# machine is safe; the child reports what was raised.

_BOMB_CHILD = textwrap.dedent(
    r"""
    import json, marshal, resource, struct, sys
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    import trio
    from monarch_core._kernel import _wire as W
    from monarch_core.errors import ProtocolError, ConnectionClosed
    from monarch_core.streams import SocketStream

    which, code = sys.argv[1], bytes.fromhex(sys.argv[2])
    body = code + struct.pack("<I", (1 << 31) - 1)

    async def main():
        a, b = trio.socket.socketpair()
        w, r = SocketStream(a, "w"), SocketStream(b, "r")
        if which == "handshake":
            await w.send_all(struct.pack("<8sHI", W.MAGIC, W.VERSION, len(body)) + body)
            with trio.fail_after(20):
                await W.read_handshake(W.FrameReader(r))
        else:
            W.decode_header("peer", body)

    try:
        trio.run(main)
        print(json.dumps(["returned", ""]))
    except BaseException as e:
        print(json.dumps([type(e).__name__, str(e)[:200]]))
    """
)


@pytest.mark.parametrize("code", [b"(", b"[", b"\xa8", b"\xdb"], ids=["tuple", "list", "tuple-ref", "list-ref"])
@pytest.mark.parametrize("where", ["handshake", "header"])
def test_marshal_bomb_in_handshake_or_header_is_a_protocol_error_not_a_huge_allocation(where: str, code: bytes) -> None:
    res = subprocess.run(
        [sys.executable, "-c", _BOMB_CHILD, where, code.hex()], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    name, msg = json.loads(res.stdout.strip().splitlines()[-1])
    assert name == "ProtocolError", f"{where} body {code!r}+0x7fffffff raised {name}: {msg}"


# ---------------------------------------------------------------- fuzz
#
# The fuzz driver runs in a child interpreter (see module docstring): a fixed
# seed, >= 2000 byte strings (random garbage, valid streams truncated at every
# kind of boundary, valid streams with bytes flipped, valid prefixes followed
# by garbage), each fed through a real socket pair to a FrameReader.  The
# property: reading ends with ProtocolError or ConnectionClosed, within a
# deadline, and nothing else is ever raised.  Violations are collected (not
# just the first) and reported with their input.

_FUZZ_CHILD = textwrap.dedent(
    r"""
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    sys.path.insert(0, sys.argv[1])
    import test_wire
    print(json.dumps(test_wire._fuzz_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    """
)


def _valid_stream(rng: random.Random, with_handshake: bool) -> bytes:
    out = bytearray()
    if with_handshake:
        out += W.encode_handshake({"proc": "p" * rng.randrange(1, 30), "session": "s", "last": rng.randrange(100)})
    for seq in range(1, rng.randrange(2, 7)):
        nb = rng.choice([0, 0, 1, 3])
        bufs = [rng.randbytes(rng.choice([0, 4, 300, W._BIG + 3])) for _ in range(nb)]
        header = marshal.dumps((rng.randrange(1000), "ep", None, seq))
        payload = rng.randbytes(rng.choice([0, 10, 2000]))
        for p in W.encode_message(rng.randint(1, W.K_BYE), 0, seq, header, payload, bufs):
            out += bytes(p)
    return bytes(out)


def _fuzz_case(rng: random.Random, i: int) -> tuple[bytes, bool]:
    """(bytes, read a handshake first?)"""
    family = i % 6
    hs = rng.random() < 0.5
    if family == 0:  # pure garbage
        return rng.randbytes(rng.randrange(0, 400)), hs
    if family == 1:  # a valid stream truncated anywhere
        s = _valid_stream(rng, hs)
        return s[: rng.randrange(0, len(s) + 1)], hs
    if family == 2:  # a valid stream with a few bytes changed
        s = bytearray(_valid_stream(rng, hs))
        for _ in range(rng.randrange(1, 6)):
            s[rng.randrange(len(s))] = rng.randrange(256)
        return bytes(s), hs
    if family == 3:  # valid handshake header, then garbage body / frames
        body = rng.randbytes(rng.randrange(0, 64))
        return struct.pack("<8sHI", W.MAGIC, W.VERSION, len(body)) + body + rng.randbytes(rng.randrange(0, 200)), True
    if family == 4:  # a fixed frame header with a valid kind and random lengths, then garbage
        fixed = W.FIXED.pack(
            rng.randint(1, W.K_BYE),
            rng.randrange(256),
            rng.choice([0, 1, 2, rng.randrange(1 << 16)]),
            rng.choice([0, 5, rng.randrange(1 << 32)]),
            rng.choice([0, 5, rng.randrange(1 << 32)]),
            rng.randrange(1 << 64),
        )
        return fixed + rng.randbytes(rng.randrange(0, 300)), False
    # family 5: a valid stream followed by garbage
    return _valid_stream(rng, hs) + rng.randbytes(rng.randrange(1, 100)), hs


def _fuzz_main(what: str, seed: int, n: int) -> dict:
    """Run the fuzz (in the child); return counts and violations."""
    rng = random.Random(seed)
    cases = [_fuzz_case(rng, i) for i in range(n)]
    outcomes: dict[str, int] = {}
    violations: list[list[str]] = []

    async def one(data: bytes, hs: bool) -> str:
        a, b = trio.socket.socketpair()
        w, r = SocketStream(a, "fuzz-r"), SocketStream(b, "fuzz-w")
        result = "no-end"
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_send_then_close, w, data)
                reader = W.FrameReader(r, trusted=False if what == "unproven" else None)
                try:
                    with trio.fail_after(5):
                        if hs:
                            await W.read_handshake(reader)
                        for _ in range(10_000):
                            _k, _f, _s, header, _p, _b = await reader.read_message()
                            if what == "header":
                                try:
                                    W.decode_header("fuzz", header)
                                except ProtocolError:
                                    pass
                except (ProtocolError, ConnectionClosed) as e:
                    result = type(e).__name__
                nursery.cancel_scope.cancel()
        finally:
            await w.aclose()
            await r.aclose()
        return result

    async def main() -> None:
        for data, hs in cases:
            try:
                res = await one(data, hs)
            except BaseException as e:  # noqa: BLE001 - the property under test
                leaf = leaf_exceptions(e)[0]  # unwrap the nursery's exception group
                res = f"VIOLATION {type(leaf).__name__}"
                violations.append([type(leaf).__name__, str(leaf)[:160], data[:80].hex(), str(hs)])
            outcomes[res] = outcomes.get(res, 0) + 1

    trio.run(main)
    return {"outcomes": outcomes, "violations": violations, "stats": W.receive_stats()}


def _run_fuzz(what: str, seed: int, n: int) -> dict:
    env = dict(os.environ, MONARCH_MAX_MESSAGE_BYTES=str(1 << 22))  # bound what one frame may claim
    res = subprocess.run(
        [sys.executable, "-c", _FUZZ_CHILD, HERE, what, str(seed), str(n)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_fuzz_frame_reader_only_raises_protocol_error_or_connection_closed() -> None:
    out = _run_fuzz("frames", seed=20240601, n=2400)
    total = sum(out["outcomes"].values())
    assert total == 2400
    # every family must have reached both kinds of ending, or the fuzz is not exercising anything
    assert out["outcomes"].get("ProtocolError", 0) > 100, out["outcomes"]
    assert out["outcomes"].get("ConnectionClosed", 0) > 100, out["outcomes"]
    kinds = sorted({v[0] for v in out["violations"]})
    assert out["violations"] == [], (
        f"{len(out['violations'])} of {total} inputs raised something else ({kinds}); first: {out['violations'][:3]}"
    )


def test_fuzz_frame_reader_of_an_unproven_peer_only_raises_protocol_error_or_connection_closed() -> None:
    """The same inputs, read as from a peer not yet proven (buffers that grow
    as bytes arrive, the limits): the same endings, and nothing left charged."""
    out = _run_fuzz("unproven", seed=20240601, n=2400)
    assert sum(out["outcomes"].values()) == 2400
    assert out["outcomes"].get("ProtocolError", 0) > 100, out["outcomes"]
    assert out["outcomes"].get("ConnectionClosed", 0) > 100, out["outcomes"]
    assert out["violations"] == [], out["violations"][:3]
    assert out["stats"]["unproven"] == 0 and out["stats"]["maps"] == 0, out["stats"]


def test_fuzz_frame_reader_plus_header_decoding_only_raises_protocol_error_or_connection_closed() -> None:
    out = _run_fuzz("header", seed=777, n=2400)
    kinds = sorted({v[0] for v in out["violations"]})
    assert out["violations"] == [], (
        f"{len(out['violations'])} inputs raised something else ({kinds}); first: {out['violations'][:3]}"
    )


@pytest.mark.parametrize(
    ("kind", "header", "match"),
    [
        (W.K_PORT, b"\x00" * 16, "malformed port message header"),
        (W.K_PORT, b"\x00" * 18, "malformed port message header"),
        (W.K_ACTOR, b"\x00" * 10, "malformed packed header"),
        (W.K_CONTROL, W.port_header(1, 0, 0), "malformed packed header"),
        (W.K_ACTOR, W._ACTOR_P.pack(1, 0, -1, 0) + b"\xff\xfe", "malformed message header"),
        (W.K_ACTOR, W._ACTOR_P.pack(1, 0, -1, 0) + marshal.dumps(("k", "ep")), "malformed actor message header"),
        (W.K_ACTOR, W._ACTOR_P.pack(1, 0, -1, 0) + marshal.dumps((1, "ep", None, None, (), (), "s", None, None, 0)),
         "malformed actor message header"),
        (W.K_ACTOR, W._ACTOR_P.pack(1, 0, -1, 0) + b"(\xff\xff\xff\x7f", "malformed message header"),
    ],
)
def test_malformed_packed_headers_are_protocol_errors(kind: int, header: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        W.decode_packed("peer-x", kind, header)


def test_packed_headers_round_trip() -> None:
    assert W.decode_packed("p", W.K_PORT, W.port_header(7, -1, W.S_ERROR)) == (7, -1, W.S_ERROR)
    h = W.actor_header("key", "ep", ("client", "ipc://x", 9), 3, ("gpus",), (4,), "client", None, True)
    assert W.decode_packed("p", W.K_ACTOR, h) == (
        "key", "ep", ("client", "ipc://x", 9), 3, ("gpus",), (4,), "client", None, True
    )
    h = W.actor_header("key", "ep", None, 0, (), (), "a", ("p", None, 5), False)
    assert W.decode_packed("p", W.K_ACTOR, h) == ("key", "ep", None, 0, (), (), "a", ("p", None, 5), False)


def test_a_packed_actor_header_carries_its_extension_as_a_tenth_field() -> None:
    """The extension (a traced call's trace context) is opaque: the decoder
    hands it over whole, whatever its bytes, and the fields around it are intact."""
    ctx = bytes(range(24))
    h = W.actor_header("key", "ep", ("client", "ipc://x", 9), 3, ("gpus",), (4,), "client", None, True, ctx)
    assert W.decode_packed("p", W.K_ACTOR, h) == (
        "key", "ep", ("client", "ipc://x", 9), 3, ("gpus",), (4,), "client", None, True, ctx
    )
    # the same call untraced shares the marshal part (decoded once, cached)
    plain = W.actor_header("key", "ep", ("client", "ipc://x", 9), 4, ("gpus",), (4,), "client", None, True)
    assert h.endswith(plain[W._ACTOR_P.size:])
    # an extension longer than what follows it leaves no valid rest
    with pytest.raises(ProtocolError):
        W.decode_packed("p", W.K_ACTOR, W._ACTOR_P.pack(1, 0, -1, 200) + ctx)
