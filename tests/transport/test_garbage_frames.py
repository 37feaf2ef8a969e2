"""Garbage on a worker loop's port must cost the sender its connection, never
the worker: thousands of malformed, truncated and oversized frames arrive on
many connections while a live client keeps using the worker.

Plain ``tcp`` on 127.0.0.1 (no namespaces needed): ``tcp`` authenticates no
one, so this is exactly what an untrusted peer can send.
"""

from __future__ import annotations

import marshal
import random
import socket
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest

from _helpers.transport import free_port
from monarch_core._kernel import _wire as W

MIN_FRAMES = 10_000
SEED = 20261130


# ---------------------------------------------------------------- frame builders


def hello(rng: random.Random) -> bytes:
    n = rng.randrange(1 << 30)
    return W.encode_handshake({"proc": f"garbage-{n}", "session": f"gs-{n}", "address": ""})


def frame(kind: int, seq: int, header: bytes, payload: bytes = b"", bufs: tuple = (), flags: int = 0) -> bytes:
    return b"".join(bytes(p) for p in W.encode_message(kind, flags, seq, header, payload, list(bufs)))


def raw_fixed(kind: int, nbufs: int, hlen: int, plen: int, seq: int) -> bytes:
    return W.FIXED.pack(kind, 0, nbufs, hlen, plen, seq)


def junk(rng: random.Random, lo: int = 0, hi: int = 200) -> bytes:
    return rng.randbytes(rng.randint(lo, hi))


def harmless_frames(rng: random.Random, start_seq: int, n: int) -> list[bytes]:
    """Well-formed frames with nonsense content that a worker must shrug off:
    port messages to ports it does not have, unknown control ops, control ops
    of the wrong arity, actor messages for actors it does not have (no reply
    port).  No frame names a reply address (see test_bogus_reply_addresses)."""
    out = []
    for k in range(n):
        seq = start_seq + k
        c = rng.randrange(5)
        if c == 0:
            out.append(frame(W.K_PORT, seq, marshal.dumps((rng.randrange(10_000, 1 << 30), -1, 0)), junk(rng)))
        elif c == 1:
            out.append(frame(W.K_CONTROL, seq, marshal.dumps((f"no_such_op_{rng.randrange(100)}",)), junk(rng)))
        elif c == 2:
            op = rng.choice(["host_hello", "ping", "host_kill", "proc_died", "stop_actor", "spawn", "host_spawn"])
            out.append(frame(W.K_CONTROL, seq, marshal.dumps((op,)), junk(rng)))
        elif c == 3:
            key = f"no-such-actor-{rng.randrange(1 << 20)}"
            out.append(frame(W.K_ACTOR, seq, marshal.dumps((key, "ep", None, 0, (), (), None, None, None)), junk(rng)))
        else:
            out.append(frame(W.K_PORT, seq, marshal.dumps((rng.randrange(10_000, 1 << 30), 0, 2))))
    return out


def bad_tail(rng: random.Random, seq: int) -> bytes:
    """One frame the worker must reject (it then drops the connection)."""
    c = rng.randrange(14)
    if c == 0:  # unknown kind
        return raw_fixed(rng.choice([0, *range(6, 256)]), 0, 0, 0, seq)
    if c == 1:  # header over the limit
        return raw_fixed(W.K_ACTOR, 0, W.MAX_HEADER + 1 + rng.randrange(1 << 20), 0, seq)
    if c == 2:  # too many buffers
        return raw_fixed(W.K_PORT, W.MAX_BUFS + 1 + rng.randrange(1000), 10, 0, seq)
    if c == 3:  # one buffer over the limit
        return raw_fixed(W.K_PORT, 1, 0, 0, seq) + struct.pack("<Q", W.MAX_MESSAGE + 1 + rng.randrange(1 << 40))
    if c == 4:  # buffers that add up over the limit
        n = rng.randint(1, 8)
        return raw_fixed(W.K_PORT, n, 0, 0, seq) + struct.pack(f"<{n}Q", *([W.MAX_MESSAGE] * n))
    if c == 5:  # header bytes that are not marshal data
        return frame(rng.choice([W.K_ACTOR, W.K_PORT, W.K_CONTROL]), seq, b"\xff" + junk(rng, 1, 60))
    if c == 6:  # marshal of the wrong shape
        h = rng.choice([(), [1, 2], 7, "text", (1, 2, 3, 4), ("a",) * 9, (None,), ((),), (1.5, 2, 3)])
        return frame(rng.choice([W.K_ACTOR, W.K_PORT, W.K_CONTROL]), seq, marshal.dumps(h))
    if c == 7:  # marshal that announces more than it holds
        h = rng.choice([b")\xff", b"(\xff\xff\xff\x7f", b"z\xff", b"u\xff\xff\x00\x00ab", b"r\x05\x00\x00\x00",
                        b"{" + b"z\x01a" * 3, b"l\xff\xff\xff\x7f", b"g\x00"])
        return frame(rng.choice([W.K_ACTOR, W.K_PORT, W.K_CONTROL]), seq, h)
    if c == 8:  # marshal types monarch never sends (code objects, floats, ...)
        h = marshal.dumps(rng.choice([compile("1", "x", "eval"), 1.25, 3 + 4j, frozenset({1}), b"bytes", 1 << 80]))
        return frame(rng.choice([W.K_ACTOR, W.K_PORT, W.K_CONTROL]), seq, h)
    if c == 9:  # an acknowledgement on an inbound session
        return raw_fixed(W.K_ACK, 0, 0, 0, seq)
    if c == 10:  # a sequence gap
        return frame(W.K_PORT, seq + rng.randint(2, 1000), marshal.dumps((123456789, -1, 0)))
    if c == 11:  # a frame cut short (the connection then ends)
        full = frame(W.K_PORT, seq, marshal.dumps((123456789, -1, 0)), junk(rng, 10, 300))
        return full[: rng.randrange(1, len(full))]
    if c == 12:  # control op that is not a str
        return frame(W.K_CONTROL, seq, marshal.dumps((rng.randrange(100), "x")))
    # a payload announced large that never comes
    return raw_fixed(W.K_PORT, 0, 0, rng.choice([1 << 17, 1 << 20, 1 << 24]), seq) + junk(rng, 0, 100)


def bad_handshake(rng: random.Random) -> bytes:
    c = rng.randrange(8)
    if c == 0:  # random bytes
        return junk(rng, 1, 300)
    if c == 1:  # wrong magic
        return struct.pack("<8sHI", b"NOTMONAR", W.VERSION, 4) + b"abcd"
    if c == 2:  # another wire version
        body = marshal.dumps({"proc": "x", "session": "y"})
        return struct.pack("<8sHI", W.MAGIC, rng.choice([0, 2, 999, 65535]), len(body)) + body
    if c == 3:  # oversized handshake
        return struct.pack("<8sHI", W.MAGIC, W.VERSION, W.MAX_HANDSHAKE + 1 + rng.randrange(1 << 30))
    if c == 4:  # body that is not marshal data
        body = b"\xff" + junk(rng, 1, 100)
        return struct.pack("<8sHI", W.MAGIC, W.VERSION, len(body)) + body
    if c == 5:  # not a mapping, or a mapping without session/proc strings
        body = marshal.dumps(rng.choice([[1, 2], 5, "s", {}, {"proc": 1, "session": 2}, {"proc": "p"}, {"session": "s"}]))
        return struct.pack("<8sHI", W.MAGIC, W.VERSION, len(body)) + body
    if c == 6:  # a handshake cut short
        h = hello(rng)
        return h[: rng.randrange(1, len(h))]
    # the announced body length exceeds what is sent
    return struct.pack("<8sHI", W.MAGIC, W.VERSION, 5000) + junk(rng, 0, 100)


def connection_plan(rng: random.Random) -> tuple[bytes, int]:
    """The bytes of one garbage connection and how many frames it carries
    (a handshake counts as one)."""
    c = rng.randrange(10)
    if c < 2:
        return bad_handshake(rng), 1
    n = rng.randint(0, 12)
    frames = harmless_frames(rng, 1, n)
    if c < 9:
        frames.append(bad_tail(rng, n + 1))
    else:  # harmless frames only, then an orderly goodbye
        frames.append(raw_fixed(W.K_BYE, 0, 0, 0, n + 1))
    return hello(rng) + b"".join(frames), 1 + len(frames)


def throw(port: int, plans: list[bytes]) -> list[str]:
    """Send each plan on its own connection, then read until the worker closes
    it; what did not go as expected."""
    problems = []
    for data in plans:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            try:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
            except (BrokenPipeError, ConnectionResetError):
                continue  # the worker already dropped us
            try:
                while s.recv(65536):
                    pass
            except ConnectionResetError:
                pass
            except socket.timeout:
                problems.append(f"the worker kept a garbage connection open for 30s: {data[:80]!r}")
    return problems


# ---------------------------------------------------------------- the test

LIVE_CLIENT = """
import json, os, sys, threading
from monarch_core.actor import enable_transport
from monarch_core.worker import attach_to_workers
from transport_actors import Where
enable_transport("tcp://127.0.0.1:0")
W = {address!r}
hosts = attach_to_workers([W], timeout=30)
pm = hosts.spawn_procs(per_host={{"gpus": 1}})
w = pm.spawn("w", Where)
w.echo.call_one(-1).get(timeout=60)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
print(json.dumps({{"ready": True}}), flush=True)
calls = hellos = 0
errors = []
while not stop.is_set():
    try:
        if calls % 25 == 0:  # a round trip to the worker loop itself
            attach_to_workers([W], timeout=30)
            hellos += 1
        got = w.echo.call_one(calls).get(timeout=30)
        if got != calls:
            errors.append(f"echo({{calls}}) returned {{got!r}}")
            break
        calls += 1
    except Exception as e:
        errors.append(f"{{type(e).__name__}}: {{e}}")
        break
pm.stop().get(timeout=60)
print(json.dumps({{"result": {{"calls": calls, "hellos": hellos, "errors": errors}}}}), flush=True)
os._exit(0)  # keep the worker loop running (a clean exit would shut the attached hosts down)
"""

GOOD_CLIENT = """
import json, os
from monarch_core.actor import enable_transport
from monarch_core.worker import attach_to_workers
from transport_actors import Where
enable_transport("tcp://127.0.0.1:0")
hosts = attach_to_workers([{address!r}], timeout=30)
pm = hosts.spawn_procs(per_host={{"gpus": 2}})
print(json.dumps(pm.spawn("w", Where).echo.call("after").get(timeout=60).values()), flush=True)
pm.stop().get(timeout=60)
os._exit(0)
"""


@pytest.fixture
def tcp_worker(workers):  # type: ignore[no-untyped-def]
    return workers(f"tcp://127.0.0.1:{free_port()}")


def test_worker_survives_garbage_frames_while_a_client_keeps_working(tcp_worker, clients, run_client) -> None:  # type: ignore[no-untyped-def]
    w = tcp_worker
    port = int(w.address.rsplit(":", 1)[1])
    rng = random.Random(SEED)
    plans, nframes = [], 0
    while nframes < MIN_FRAMES:
        data, n = connection_plan(rng)
        plans.append(data)
        nframes += n
    assert nframes >= MIN_FRAMES and len(plans) >= 1000

    live = clients(LIVE_CLIENT.format(address=w.address))
    assert live.expect("ready") is True
    nthreads = 8  # many connections at once, bounded
    with ThreadPoolExecutor(nthreads) as pool:
        problems = [p for ps in pool.map(lambda k: throw(port, plans[k::nthreads]), range(nthreads)) for p in ps]
    live.send("stop")
    out = live.expect("result", timeout=60)
    live.finish()

    assert problems == []
    assert out["errors"] == [], out
    assert out["calls"] > 0 and out["hellos"] > 0
    assert w.popen.poll() is None, f"the worker loop died:\n{w.output()[-5000:]}"
    # afterwards the worker serves a new client normally
    assert run_client(GOOD_CLIENT.format(address=w.address)) == ["after", "after"]
    assert w.popen.poll() is None


# ---------------------------------------------------------------- well-formed frames, bogus reply addresses


@pytest.mark.parametrize(
    "reply",
    [
        ("garbage-proc", "bogus://nowhere", 1),  # a scheme no plugin provides
        ("garbage-proc", "tcp://no-port-here", 1),  # a malformed tcp address
        ("garbage-proc", 12345, 1),  # not a str
    ],
    ids=["unknown-scheme", "malformed-tcp", "not-a-str"],
)
def test_bogus_reply_address_in_a_control_message_costs_nothing(tcp_worker, run_client, reply) -> None:  # type: ignore[no-untyped-def]
    """A ping (the liveness probe a parent sends its procs) whose reply port
    names an address this host cannot use: the reply is undeliverable, the
    worker lives on."""
    w = tcp_worker
    port = int(w.address.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(hello(random.Random(1)) + frame(W.K_CONTROL, 1, marshal.dumps(("ping", reply))))
        data = b""
        # the worker's handshake, then its acknowledgement of frame 1: the ping was routed
        while len(data) < 14 or len(data) < 14 + struct.unpack_from("<I", data, 10)[0] + W.FIXED_SIZE:
            chunk = s.recv(65536)
            if not chunk:
                try:
                    rc = w.popen.wait(10)
                except Exception:  # noqa: BLE001 - still running: report the closed connection only
                    rc = None
                pytest.fail(f"the worker closed the connection before acknowledging the ping; worker rc={rc}, "
                            f"output:\n{w.output()[-3000:]}")
            data += chunk
        body_end = 14 + struct.unpack_from("<I", data, 10)[0]
        assert W.FIXED.unpack_from(data, body_end)[0] == W.K_ACK
        assert W.FIXED.unpack_from(data, body_end)[5] == 1
    assert run_client(GOOD_CLIENT.format(address=w.address)) == ["after", "after"], w.output()[-3000:]
    assert w.popen.poll() is None, f"the worker loop died:\n{w.output()[-5000:]}"
