"""Channel benchmark: trio stream channels, the monarch kernel and pyzmq.

Run from the repository root (the project and its transport plugin installed)::

    python bench/channels.py                        # full run, 3 repetitions
    python bench/channels.py --out /tmp/channels.json   # + every figure as JSON
    python bench/channels.py --pin split            # each process on its own CPU
    python bench/channels.py --quick                # smoke test, small counts
    python bench/channels.py --channels raw-unix,zmq-ipc --tests lat

Every measurement runs between two fresh processes on this machine (a
*server* that echoes or counts, a *client* that times), spawned by this
script with ``subprocess``; the parent only orchestrates.  Repetitions are
interleaved (rep 1 of every test and channel, then rep 2, ...; within a
repetition one test at a time across all channels, in an order rotated
each repetition), so slow phases of a noisy machine hit every channel
alike; the table shows the median of the repetitions.

Tests (sizes are payload bytes; framing is each channel's own):

``lat``    64-byte ping-pong: round-trip time p50 / p99 over ``--lat-iters``
           (default 5000) round trips after ``--lat-warmup`` (500).
``tput``   one-way stream of ``--tput-msgs`` (200 000) 64-byte messages, one
           send call per message, then a 1-message acknowledgement back;
           messages/s = count / (first send .. acknowledgement received).
           A warm-up stream of ``--tput-warmup`` (20 000) precedes it.  The
           kernel's ``send`` only queues, so its sending task yields to the
           loop every ``--kernel-yield-every`` (100) sends.
``big1m``  1 MiB payload echoed back, ``--big1m-iters`` (100) times.
``big64m`` 64 MiB payload echoed back, ``--big64m-iters`` (8) times.
           GB/s = 2 x payload / median round-trip time (each direction
           carries the payload once; GB = 1e9 bytes).

Channels:

``raw-unix``      blocking stdlib Unix stream socket, 8-byte length prefix
                  (the floor: no event loop, reusable receive buffer)
``trio-unix``     monarch_core.streams.SocketStream over a Unix socket, made by
                  the ``ipc`` transport (IpcTransport.listen/connect), same
                  length-prefixed frames
``trio-tcp``      the same over TCP loopback (TcpTransport, TCP_NODELAY)
``kernel-ipc``    two monarch ``Kernel`` instances (one per process) over ipc,
                  messages to a registered port handler: wire header, seq
                  numbers, acks, coalescing, routing included
``kernel-tcp``    the same over tcp://127.0.0.1
``zmq-ipc``       pyzmq PAIR over ipc://@abstract, blocking API
``zmq-tcp``       pyzmq PAIR over tcp://127.0.0.1, blocking API
``zmq-trio-ipc``  pyzmq PAIR over ipc:// driven from trio (zmq.FD +
                  trio.lowlevel.wait_readable, EVENTS re-checked: edge-triggered)
``zmq-trio-tcp``  the same over tcp://
``actor``         reference row: a monarch actor endpoint in a worker proc
                  (call_one().get() round trips; broadcast for tput), i.e. the
                  whole framework per call, over the default ipc transport

``--pin same`` puts both processes on CPU 0 (the round trip is then the CPU
time both sides spend: no cross-CPU wake-ups), ``--pin split`` the server
on CPU 0 and the client on CPU 1; without it the scheduler decides, and on
a small machine the trio rows change by 2x with its choice.

Without pyzmq the zmq rows are skipped (a line says so).  Each measurement is
bounded: an alarm in each child, ``--timeout`` seconds in the parent, after
which both processes are killed and the cell reads "timeout".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import select
import shlex
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid

HDR = struct.Struct("<Q")
SMALL = 64
BIG_MIN = 1 << 16

ALL_CHANNELS = [
    "raw-unix",
    "trio-unix",
    "trio-tcp",
    "kernel-ipc",
    "kernel-tcp",
    "zmq-ipc",
    "zmq-tcp",
    "zmq-trio-ipc",
    "zmq-trio-tcp",
    "actor",
]
ALL_TESTS = ["lat", "tput", "big1m", "big64m"]
ZMQ_CHANNELS = {c for c in ALL_CHANNELS if c.startswith("zmq")}
SERVERLESS = {"actor"}  # the client starts its own peer (a monarch worker proc)

LABELS = {
    "raw-unix": "1. raw blocking Unix socket (floor)",
    "trio-unix": "2. trio SocketStream, Unix socket (ipc transport)",
    "trio-tcp": "3. trio SocketStream, TCP loopback (tcp transport)",
    "kernel-ipc": "4. monarch Kernel over ipc (port messages)",
    "kernel-tcp": "4b. monarch Kernel over tcp loopback",
    "zmq-ipc": "5. pyzmq PAIR ipc://, blocking",
    "zmq-tcp": "5b. pyzmq PAIR tcp://, blocking",
    "zmq-trio-ipc": "6. pyzmq PAIR ipc:// from trio (FD + EVENTS)",
    "zmq-trio-tcp": "6b. pyzmq PAIR tcp:// from trio (FD + EVENTS)",
    "actor": "ref. monarch actor endpoint (call_one / broadcast)",
}


def make_params(args: argparse.Namespace) -> dict:
    return {
        "lat": {"warmup": args.lat_warmup, "iters": args.lat_iters, "size": SMALL},
        "tput": {"warmup": args.tput_warmup, "count": args.tput_msgs, "size": SMALL,
                 "kernel_yield_every": args.kernel_yield_every},
        "big1m": {"warmup": args.big1m_warmup, "iters": args.big1m_iters, "size": 1 << 20},
        "big64m": {"warmup": args.big64m_warmup, "iters": args.big64m_iters, "size": 64 << 20},
    }


# =====================================================================================
# child side: helpers
# =====================================================================================


def _child_setup(budget: float, cpus: str | None) -> None:
    """Die with the parent, and by ourselves after ``budget`` seconds; pin to
    ``cpus`` (threads and processes started later inherit it)."""
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux: no death signal, the alarm still ends it
        pass
    signal.alarm(max(1, int(budget)))  # default action of SIGALRM: terminate


def _emit(tag: str, obj: dict) -> None:
    sys.stdout.write(f"{tag} {json.dumps(obj)}\n")
    sys.stdout.flush()


def _pctl(sorted_vals: list, q: float) -> float:
    i = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return sorted_vals[i]


def _lat_result(samples_ns: list) -> dict:
    s = sorted(samples_ns)
    return {
        "p50_us": _pctl(s, 0.50) / 1e3,
        "p99_us": _pctl(s, 0.99) / 1e3,
        "mean_us": sum(s) / len(s) / 1e3,
        "n": len(s),
    }


def _big_result(size: int, rtts_ns: list) -> dict:
    """GB/s from the median round trip (robust to a stall of the shared
    machine); the mean-based figure is kept as ``gbps_mean``."""
    med = statistics.median(rtts_ns) / 1e9
    mean = sum(rtts_ns) / len(rtts_ns) / 1e9
    return {"gbps": 2 * size / med / 1e9, "gbps_mean": 2 * size / mean / 1e9, "rtt_ms": med * 1e3,
            "rtt_ms_all": [round(x / 1e6, 3) for x in rtts_ns], "n": len(rtts_ns)}


def _tput_result(count: int, elapsed: float) -> dict:
    return {"msgs_per_s": count / elapsed, "elapsed_s": elapsed, "n": count}


# =====================================================================================
# sync channels: raw Unix socket (length-prefixed), pyzmq blocking
# =====================================================================================


class SyncFramed:
    """Length-prefixed frames over a blocking stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.pos = 0
        self.bigbuf = bytearray()

    def send(self, data) -> None:
        n = len(data)
        if n < BIG_MIN:
            self.sock.sendall(HDR.pack(n) + data)
        else:
            self.sock.sendall(HDR.pack(n))
            self.sock.sendall(data)

    def _fill(self, need: int) -> None:
        while len(self.buf) - self.pos < need:
            if self.pos:
                del self.buf[: self.pos]
                self.pos = 0
            chunk = self.sock.recv(max(65536, need))
            if not chunk:
                raise EOFError("peer closed")
            self.buf += chunk

    def recv(self):
        self._fill(HDR.size)
        (n,) = HDR.unpack_from(self.buf, self.pos)
        self.pos += HDR.size
        if n < BIG_MIN:
            self._fill(n)
            p = self.pos
            self.pos = p + n
            return bytes(self.buf[p : p + n])
        if len(self.bigbuf) != n:
            self.bigbuf = bytearray(n)  # reused across messages of one size
        out = memoryview(self.bigbuf)
        have = min(n, len(self.buf) - self.pos)
        out[:have] = self.buf[self.pos : self.pos + have]
        self.pos += have
        while have < n:
            got = self.sock.recv_into(out[have:])
            if not got:
                raise EOFError("peer closed mid-message")
            have += got
        return out

    def close(self) -> None:
        self.sock.close()


class SyncZmq:
    def __init__(self, sock) -> None:
        self.sock = sock

    def send(self, data) -> None:
        self.sock.send(data, copy=len(data) < BIG_MIN)

    def recv(self):
        return self.sock.recv(copy=True)

    def recv_big(self):
        return self.sock.recv(copy=False)  # a zmq.Frame; echoed back without a copy

    def close(self) -> None:
        self.sock.close(linger=0)


def _zmq_endpoint(kind: str) -> str:
    return f"ipc://@monarch-bench-{uuid.uuid4().hex[:12]}" if kind == "ipc" else "tcp://127.0.0.1:*"


def sync_server(channel: str, test: str, p: dict, budget: float) -> None:
    if channel == "raw-unix":
        name = f"\0monarch-bench-{uuid.uuid4().hex[:12]}"
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(name)
        lsock.listen(1)
        lsock.settimeout(budget)
        _emit("READY", {"addr": name[1:]})
        conn, _ = lsock.accept()
        conn.settimeout(budget)
        lsock.close()
        ch = SyncFramed(conn)
        recv_big = ch.recv
    else:
        import zmq

        ctx = zmq.Context()
        s = ctx.socket(zmq.PAIR)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, int(budget * 1000))
        s.setsockopt(zmq.SNDTIMEO, int(budget * 1000))
        s.bind(_zmq_endpoint(channel.split("-")[-1]))
        _emit("READY", {"addr": s.getsockopt_string(zmq.LAST_ENDPOINT)})
        ch = SyncZmq(s)
        recv_big = ch.recv_big
    try:
        if test == "lat":
            for _ in range(p["warmup"] + p["iters"]):
                ch.send(ch.recv())
        elif test == "tput":
            for count in (p["warmup"], p["count"]):
                for _ in range(count):
                    ch.recv()
                ch.send(b"k")
        else:
            for _ in range(p["warmup"] + p["iters"]):
                ch.send(recv_big())
        ch.recv()  # the client's "bye": everything it expected has arrived
    finally:
        ch.close()


def sync_client(channel: str, test: str, p: dict, addr: str, budget: float) -> dict:
    if channel == "raw-unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(budget)
        sock.connect("\0" + addr)
        ch = SyncFramed(sock)
        recv_big = ch.recv
    else:
        import zmq

        ctx = zmq.Context()
        s = ctx.socket(zmq.PAIR)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.RCVTIMEO, int(budget * 1000))
        s.setsockopt(zmq.SNDTIMEO, int(budget * 1000))
        s.connect(addr)
        ch = SyncZmq(s)
        recv_big = ch.recv_big
    clock = time.perf_counter_ns
    try:
        if test == "lat":
            msg = os.urandom(p["size"])
            send, recv = ch.send, ch.recv
            for _ in range(p["warmup"]):
                send(msg)
                recv()
            samples = [0] * p["iters"]
            for i in range(p["iters"]):
                t0 = clock()
                send(msg)
                recv()
                samples[i] = clock() - t0
            res = _lat_result(samples)
        elif test == "tput":
            msg = os.urandom(p["size"])
            send = ch.send
            for _ in range(p["warmup"]):
                send(msg)
            ch.recv()
            t0 = time.perf_counter()
            for _ in range(p["count"]):
                send(msg)
            ch.recv()
            res = _tput_result(p["count"], time.perf_counter() - t0)
        else:
            payload = bytearray(os.urandom(1024)) * (p["size"] // 1024)
            for _ in range(p["warmup"]):
                ch.send(payload)
                recv_big()
            rtts = [0] * p["iters"]
            for i in range(p["iters"]):
                t0 = clock()
                ch.send(payload)
                back = recv_big()
                rtts[i] = clock() - t0
            assert len(back) == p["size"]
            res = _big_result(p["size"], rtts)
        ch.send(b"bye")
        return res
    finally:
        ch.close()


# =====================================================================================
# trio channels: monarch SocketStream (ipc / tcp transports), pyzmq from trio
# =====================================================================================


class AsyncFramed:
    """Length-prefixed frames over a monarch ``Stream`` (SocketStream)."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.buf = bytearray()
        self.pos = 0
        self.bigbuf = bytearray()

    async def send(self, data) -> None:
        n = len(data)
        if n < BIG_MIN:
            await self.stream.send_all(HDR.pack(n) + data)
        else:
            await self.stream.send_all(HDR.pack(n))
            await self.stream.send_all(data)

    async def _fill(self, need: int) -> None:
        while len(self.buf) - self.pos < need:
            if self.pos:
                del self.buf[: self.pos]
                self.pos = 0
            chunk = await self.stream.receive_some(max(65536, need))
            if not chunk:
                raise EOFError("peer closed")
            self.buf += chunk

    async def recv(self):
        await self._fill(HDR.size)
        (n,) = HDR.unpack_from(self.buf, self.pos)
        self.pos += HDR.size
        if n < BIG_MIN:
            await self._fill(n)
            p = self.pos
            self.pos = p + n
            return bytes(self.buf[p : p + n])
        if len(self.bigbuf) != n:
            self.bigbuf = bytearray(n)
        out = memoryview(self.bigbuf)
        have = min(n, len(self.buf) - self.pos)
        out[:have] = self.buf[self.pos : self.pos + have]
        self.pos += have
        while have < n:
            got = await self.stream.receive_into(out[have:])
            if not got:
                raise EOFError("peer closed mid-message")
            have += got
        return out

    recv_big = recv

    async def aclose(self) -> None:
        await self.stream.aclose()


class TrioZmq:
    """A pyzmq socket driven from a trio loop.

    ``zmq.FD`` is edge-triggered: it signals that ``zmq.EVENTS`` *may* have
    changed, and reading ``EVENTS`` (or any send/recv) can consume the signal.
    So: try the non-blocking operation; on ``Again`` re-read ``EVENTS`` and
    sleep on the FD only while it says the socket is not ready.  Checkpoints
    follow trio's socket convention (cancel check before, schedule point
    after), as a transport would need.
    """

    def __init__(self, sock) -> None:
        import zmq

        self.zmq = zmq
        self.sock = sock
        self.fd = sock.getsockopt(zmq.FD)

    async def _wait(self, flag: int) -> None:
        import trio

        while not (self.sock.getsockopt(self.zmq.EVENTS) & flag):
            await trio.lowlevel.wait_readable(self.fd)

    async def send(self, data) -> None:
        import trio

        zmq = self.zmq
        copy = len(data) < BIG_MIN
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                self.sock.send(data, zmq.NOBLOCK, copy=copy)
                break
            except zmq.Again:
                await self._wait(zmq.POLLOUT)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def _recv(self, copy: bool):
        import trio

        zmq = self.zmq
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            try:
                m = self.sock.recv(zmq.NOBLOCK, copy=copy)
                break
            except zmq.Again:
                await self._wait(zmq.POLLIN)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return m

    async def recv(self):
        return await self._recv(True)

    async def recv_big(self):
        return await self._recv(False)

    async def aclose(self) -> None:
        self.sock.close(linger=0)


async def _trio_serve_loop(ch, test: str, p: dict) -> None:
    if test == "lat":
        for _ in range(p["warmup"] + p["iters"]):
            await ch.send(await ch.recv())
    elif test == "tput":
        for count in (p["warmup"], p["count"]):
            for _ in range(count):
                await ch.recv()
            await ch.send(b"k")
    else:
        for _ in range(p["warmup"] + p["iters"]):
            await ch.send(await ch.recv_big())
    await ch.recv()  # bye


async def _trio_client_loop(ch, test: str, p: dict) -> dict:
    clock = time.perf_counter_ns
    if test == "lat":
        msg = os.urandom(p["size"])
        send, recv = ch.send, ch.recv
        for _ in range(p["warmup"]):
            await send(msg)
            await recv()
        samples = [0] * p["iters"]
        for i in range(p["iters"]):
            t0 = clock()
            await send(msg)
            await recv()
            samples[i] = clock() - t0
        res = _lat_result(samples)
    elif test == "tput":
        msg = os.urandom(p["size"])
        send = ch.send
        for _ in range(p["warmup"]):
            await send(msg)
        await ch.recv()
        t0 = time.perf_counter()
        for _ in range(p["count"]):
            await send(msg)
        await ch.recv()
        res = _tput_result(p["count"], time.perf_counter() - t0)
    else:
        payload = bytearray(os.urandom(1024)) * (p["size"] // 1024)
        for _ in range(p["warmup"]):
            await ch.send(payload)
            await ch.recv_big()
        rtts = [0] * p["iters"]
        for i in range(p["iters"]):
            t0 = clock()
            await ch.send(payload)
            back = await ch.recv_big()
            rtts[i] = clock() - t0
        assert len(back) == p["size"]
        res = _big_result(p["size"], rtts)
    await ch.send(b"bye")
    return res


def _zmq_trio_socket(channel: str, bind: bool, addr: str | None = None):
    import zmq

    ctx = zmq.Context()
    s = ctx.socket(zmq.PAIR)
    s.setsockopt(zmq.LINGER, 0)
    if bind:
        s.bind(_zmq_endpoint(channel.split("-")[-1]))
    else:
        s.connect(addr)
    return s


def trio_server(channel: str, test: str, p: dict, budget: float) -> None:
    import trio

    async def main() -> None:
        with trio.fail_after(budget):
            if channel.startswith("zmq-trio"):
                import zmq

                s = _zmq_trio_socket(channel, bind=True)
                _emit("READY", {"addr": s.getsockopt_string(zmq.LAST_ENDPOINT)})
                ch = TrioZmq(s)
            else:
                t = _monarch_transport(channel)
                listener = await t.listen("ipc://@monarch-bench-" + uuid.uuid4().hex[:12]
                                          if channel == "trio-unix" else "tcp://127.0.0.1:0")
                _emit("READY", {"addr": listener.address})
                stream = await listener.accept()
                await listener.aclose()
                ch = AsyncFramed(stream)
            try:
                await _trio_serve_loop(ch, test, p)
            finally:
                await ch.aclose()

    trio.run(main)


def trio_client(channel: str, test: str, p: dict, addr: str, budget: float) -> dict:
    import trio

    async def main() -> dict:
        with trio.fail_after(budget):
            if channel.startswith("zmq-trio"):
                ch = TrioZmq(_zmq_trio_socket(channel, bind=False, addr=addr))
            else:
                ch = AsyncFramed(await _monarch_transport(channel).connect(addr))
            try:
                return await _trio_client_loop(ch, test, p)
            finally:
                await ch.aclose()

    return trio.run(main)


def _monarch_transport(channel: str):
    if channel in ("trio-unix", "kernel-ipc"):
        from monarch_core._builtins._ipc import IpcTransport

        return IpcTransport()
    from monarch_transport_tcp._tcp import TcpTransport

    return TcpTransport()


# =====================================================================================
# monarch kernel: two Kernels, port messages
# =====================================================================================

OP_HELLO, OP_ECHO, OP_COUNT, OP_BYE = 0, 1, 2, 3


def _make_kernel(channel: str, role: str):
    from monarch_core._kernel._runtime import Kernel

    t = _monarch_transport(channel)
    bind = None if channel == "kernel-ipc" else "tcp://127.0.0.1:0"
    return Kernel(proc_id=f"bench-{role}-{os.getpid()}", name=f"bench {role}", transport=t, bind_spec=bind)


def kernel_server(channel: str, test: str, p: dict, budget: float) -> None:
    import marshal

    import trio

    from monarch_core._kernel import _wire as W

    k = _make_kernel(channel, "server")

    class Handler:
        def __init__(self) -> None:
            self.peer = None
            self.count = 0
            self.target = p.get("warmup", 0)
            self.phase = 0
            self.bye = trio.Event()

        def deliver(self, rank: int, status: int, payload, buffers) -> None:
            if rank == OP_ECHO:
                pid, paddr, hdr = self.peer
                k.send(pid, paddr, W.K_PORT, 0, hdr, payload, [])
            elif rank == OP_COUNT:
                self.count += 1
                if self.count == self.target:
                    pid, paddr, hdr = self.peer
                    k.send(pid, paddr, W.K_PORT, 0, hdr, b"k", [])
                    self.count = 0
                    self.phase += 1
                    self.target = p.get("count", 0)
            elif rank == OP_HELLO:
                pid, paddr, port = marshal.loads(bytes(payload))
                self.peer = (pid, paddr, marshal.dumps((port, 0, W.S_VALUE)))
            elif rank == OP_BYE:
                self.bye.set()

        def fail(self, exc, proc_id=None) -> None:
            print(f"server port failed: {exc}", file=sys.stderr, flush=True)

    async def main() -> None:
        with trio.fail_after(budget):
            async with trio.open_nursery() as nursery:
                await nursery.start(k.serve)
                h = Handler()
                port = k.add_port(h)
                _emit("READY", {"addr": {"proc": k.proc_id, "address": k.address, "port": port}})
                await h.bye.wait()
                await k.flush(2)
                k.stop_loop()

    trio.run(main)


def kernel_client(channel: str, test: str, p: dict, addr: dict, budget: float) -> dict:
    import marshal

    import trio

    from monarch_core._kernel import _wire as W

    k = _make_kernel(channel, "client")
    sp, saddr, sport = addr["proc"], addr["address"], addr["port"]
    H = {op: marshal.dumps((sport, op, W.S_VALUE)) for op in (OP_HELLO, OP_ECHO, OP_COUNT, OP_BYE)}

    class Handler:
        ev = None
        last = None

        def deliver(self, rank, status, payload, buffers) -> None:
            self.last = payload
            self.ev.set()

        def fail(self, exc, proc_id=None) -> None:
            print(f"client port failed: {exc}", file=sys.stderr, flush=True)

    async def main() -> dict:
        with trio.fail_after(budget):
            async with trio.open_nursery() as nursery:
                await nursery.start(k.serve)
                h = Handler()
                port = k.add_port(h)
                send = k.send
                send(sp, saddr, W.K_PORT, 0, H[OP_HELLO], marshal.dumps((k.proc_id, k.address, port)), [])
                clock = time.perf_counter_ns
                if test == "lat":
                    msg, hdr = os.urandom(p["size"]), H[OP_ECHO]
                    for _ in range(p["warmup"]):
                        h.ev = trio.Event()
                        send(sp, saddr, W.K_PORT, 0, hdr, msg, [])
                        await h.ev.wait()
                    samples = [0] * p["iters"]
                    for i in range(p["iters"]):
                        t0 = clock()
                        h.ev = ev = trio.Event()
                        send(sp, saddr, W.K_PORT, 0, hdr, msg, [])
                        await ev.wait()
                        samples[i] = clock() - t0
                    res = _lat_result(samples)
                elif test == "tput":
                    msg, hdr = os.urandom(p["size"]), H[OP_COUNT]
                    every = max(1, p["kernel_yield_every"])
                    checkpoint = trio.lowlevel.checkpoint
                    res = {}
                    for count in (p["warmup"], p["count"]):
                        h.ev = ev = trio.Event()
                        t0 = time.perf_counter()
                        for i in range(count):
                            send(sp, saddr, W.K_PORT, 0, hdr, msg, [])
                            if i % every == every - 1:
                                await checkpoint()
                        await ev.wait()
                        res = _tput_result(count, time.perf_counter() - t0)
                else:
                    payload = bytearray(os.urandom(1024)) * (p["size"] // 1024)
                    hdr = H[OP_ECHO]
                    for _ in range(p["warmup"]):
                        h.ev = trio.Event()
                        send(sp, saddr, W.K_PORT, 0, hdr, payload, [])
                        await h.ev.wait()
                    rtts = [0] * p["iters"]
                    for i in range(p["iters"]):
                        t0 = clock()
                        h.ev = ev = trio.Event()
                        send(sp, saddr, W.K_PORT, 0, hdr, payload, [])
                        await ev.wait()
                        rtts[i] = clock() - t0
                    assert len(h.last) == p["size"]
                    res = _big_result(p["size"], rtts)
                send(sp, saddr, W.K_PORT, 0, H[OP_BYE], b"", [])
                await k.flush(2)
                k.stop_loop()
        return res

    return trio.run(main)


# =====================================================================================
# reference: a monarch actor endpoint (whole framework per call)
# =====================================================================================


def actor_client(channel: str, test: str, p: dict, addr, budget: float, peer_cpus: str | None = None) -> dict:
    from monarch_core.actor import Actor, endpoint, this_host

    class Echo(Actor):
        def __init__(self, cpus: str | None) -> None:
            self.n = 0
            if cpus:  # every thread of the worker proc (an affinity is per thread)
                for tid in os.listdir("/proc/self/task"):
                    try:
                        os.sched_setaffinity(int(tid), {int(c) for c in cpus.split(",")})
                    except OSError:
                        pass

        @endpoint
        def echo(self, x):
            return x

        @endpoint
        def count(self, x) -> None:
            self.n += 1

        @endpoint
        def total(self) -> int:
            n, self.n = self.n, 0
            return n

    deadline = time.monotonic() + budget

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        a = procs.spawn("bench_echo", Echo, peer_cpus).slice(procs=0)
        clock = time.perf_counter_ns
        if test == "lat":
            msg = os.urandom(p["size"])
            for _ in range(p["warmup"]):
                a.echo.call_one(msg).get(timeout=left())
            samples = [0] * p["iters"]
            for i in range(p["iters"]):
                t0 = clock()
                a.echo.call_one(msg).get(timeout=left())
                samples[i] = clock() - t0
            res = _lat_result(samples)
        elif test == "tput":
            msg = os.urandom(p["size"])
            res = {}
            for count in (p["warmup"], p["count"]):
                t0 = time.perf_counter()
                for _ in range(count):
                    a.count.broadcast(msg)
                got = a.total.call_one().get(timeout=left())
                res = _tput_result(count, time.perf_counter() - t0)
                assert got == count, (got, count)
        else:
            # a bytearray pickles out of band (protocol 5), as a tensor would
            payload = bytearray(os.urandom(1024)) * (p["size"] // 1024)
            for _ in range(p["warmup"]):
                a.echo.call_one(payload).get(timeout=left())
            rtts = [0] * p["iters"]
            for i in range(p["iters"]):
                t0 = clock()
                back = a.echo.call_one(payload).get(timeout=left())
                rtts[i] = clock() - t0
            assert len(back) == p["size"]
            res = _big_result(p["size"], rtts)
        return res
    finally:
        procs.stop().get(timeout=left())


# =====================================================================================
# child entry
# =====================================================================================


def child_main(args: argparse.Namespace) -> int:
    budget = args.budget
    _child_setup(budget + 2, args.cpus)
    p = json.loads(args.params)
    ch, test = args.channel, args.test
    if args.role == "server":
        if ch in ("raw-unix", "zmq-ipc", "zmq-tcp"):
            sync_server(ch, test, p, budget)
        elif ch.startswith("kernel"):
            kernel_server(ch, test, p, budget)
        else:
            trio_server(ch, test, p, budget)
        return 0
    addr = json.loads(args.addr) if args.addr else None
    if ch in ("raw-unix", "zmq-ipc", "zmq-tcp"):
        res = sync_client(ch, test, p, addr, budget)
    elif ch.startswith("kernel"):
        res = kernel_client(ch, test, p, addr, budget)
    elif ch == "actor":
        res = actor_client(ch, test, p, addr, budget, args.peer_cpus)
    else:
        res = trio_client(ch, test, p, addr, budget)
    _emit("RESULT", res)
    return 0


# =====================================================================================
# parent: orchestration, table, JSON
# =====================================================================================


def _pin_for(role: str, pin: str) -> str | None:
    if pin == "same":
        return "0"
    if pin == "split":
        return "0" if role == "server" else "1"
    return None


def _spawn(role: str, channel: str, test: str, params: dict, budget: float, addr=None, log=None, pin="none"):
    argv = [sys.executable, os.path.abspath(__file__), "--role", role, "--channel", channel, "--test", test,
            "--params", json.dumps(params), "--budget", str(budget)]
    cpus = _pin_for(role, pin)
    if cpus is not None:
        argv += ["--cpus", cpus]
        if channel in SERVERLESS:  # the peer is a proc the client spawns: pin it as a server
            argv += ["--peer-cpus", _pin_for("server", pin)]
    if addr is not None:
        argv += ["--addr", json.dumps(addr)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                            start_new_session=True, text=True)


def _kill(proc) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and nothing else of ours
    except ProcessLookupError:
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def _readline(proc, timeout: float) -> str | None:
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return None
        r, _, _ = select.select([proc.stdout], [], [], left)
        if r:
            return proc.stdout.readline()


def _tail(f) -> str:
    f.seek(0)
    return f.read()[-1500:].strip()


def run_one(channel: str, test: str, params: dict, timeout: float, pin: str = "none") -> dict:
    """One measurement between two fresh processes, bounded by ``timeout``."""
    budget = max(5.0, timeout - 5)
    server = client = None
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as slog, tempfile.TemporaryFile("w+") as clog:
        try:
            addr = None
            if channel not in SERVERLESS:
                server = _spawn("server", channel, test, params, budget, log=slog, pin=pin)
                line = _readline(server, min(60.0, timeout))
                if not line or not line.startswith("READY "):
                    return {"error": f"server not ready: {(line or '').strip()} {_tail(slog)}"}
                addr = json.loads(line[6:])["addr"]
            client = _spawn("client", channel, test, params, budget, addr=addr, log=clog, pin=pin)
            try:
                out, _ = client.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                return {"error": f"timeout after {timeout:.0f}s"}
            lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
            if client.returncode == -signal.SIGALRM:
                return {"error": f"timeout: the client's own {budget + 2:.0f}s alarm fired"}
            if client.returncode != 0 or not lines:
                return {"error": f"client exit {client.returncode}: {_tail(clog)}"}
            if server is not None:
                try:
                    server.wait(10)
                except subprocess.TimeoutExpired:
                    pass
                if server.returncode not in (0, None):
                    return {"error": f"server exit {server.returncode}: {_tail(slog)}"}
            return json.loads(lines[-1][7:])
        finally:
            _kill(client)
            _kill(server)
            for proc in (client, server):
                if proc is not None and proc.stdout is not None:
                    proc.stdout.close()


def _median(vals: list):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


METRICS = {"lat": ("p50_us", "p99_us"), "tput": ("msgs_per_s",), "big1m": ("gbps",), "big64m": ("gbps",)}


def summarize(runs: list, channels: list, tests: list) -> dict:
    summary: dict = {}
    for ch in channels:
        row: dict = {}
        for t in tests:
            rs = [r for r in runs if r["channel"] == ch and r["test"] == t]
            ok = [r["result"] for r in rs if "error" not in r["result"]]
            errs = [r["result"]["error"] for r in rs if "error" in r["result"]]
            for m in METRICS[t]:
                vals = [x[m] for x in ok]
                row[f"{t}.{m}"] = {"median": _median(vals), "min": min(vals) if vals else None,
                                   "max": max(vals) if vals else None, "n": len(vals)}
            if t == "big1m" or t == "big64m":
                rtts = [x["rtt_ms"] for x in ok]
                row[f"{t}.rtt_ms"] = {"median": _median(rtts), "n": len(rtts)}
            if errs:
                row[f"{t}.errors"] = errs
        summary[ch] = row
    return summary


def _fmt(v, kind: str) -> str:
    if v is None:
        return "—"
    if kind == "us":
        return f"{v:.1f}"
    if kind == "x":
        return f"{v:.1f}×"
    if kind == "rate":
        return f"{v / 1e3:,.0f} k"
    if kind == "gbps":
        return f"{v:.2f}"
    return str(v)


def table(summary: dict, channels: list, tests: list) -> str:
    floor = summary.get("raw-unix", {}).get("lat.p50_us", {}).get("median")
    cols = []
    if "lat" in tests:
        cols += [("RTT p50 µs", "lat.p50_us", "us"), ("RTT p99 µs", "lat.p99_us", "us")]
        if floor:
            cols += [("p50 ÷ floor", "lat.p50_us", "x")]
    if "tput" in tests:
        cols += [("64 B msgs/s", "tput.msgs_per_s", "rate")]
    if "big1m" in tests:
        cols += [("1 MiB GB/s", "big1m.gbps", "gbps")]
    if "big64m" in tests:
        cols += [("64 MiB GB/s", "big64m.gbps", "gbps")]
    lines = ["| channel | " + " | ".join(c[0] for c in cols) + " |",
             "|---|" + "|".join("---:" for _ in cols) + "|"]
    for ch in channels:
        row = summary[ch]
        cells = []
        for _name, key, kind in cols:
            cell = row.get(key, {})
            v = cell.get("median")
            if kind == "x":
                v = v / floor if v is not None else None
            text = _fmt(v, kind)
            t = key.split(".")[0]
            if v is None and row.get(f"{t}.errors"):
                text = "timeout" if any("timeout" in e for e in row[f"{t}.errors"]) else "error"
            elif row.get(f"{t}.errors"):
                text += f" ({cell.get('n', 0)}/{cell.get('n', 0) + len(row[f'{t}.errors'])})"
            cells.append(text)
        lines.append(f"| {LABELS[ch]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _loadavg() -> str | None:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


def _meta(args: argparse.Namespace, params: dict) -> dict:
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python"] + sys.argv),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": None,
        "reps": args.reps,
        "pin": args.pin,
        "loadavg_start": _loadavg(),
        "params": params,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    meta["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import trio

        meta["trio"] = trio.__version__
    except ImportError:
        pass
    try:
        import zmq

        meta["pyzmq"], meta["libzmq"] = zmq.__version__, zmq.zmq_version()
    except ImportError:
        pass
    return meta


def parent_main(args: argparse.Namespace) -> int:
    channels = [c for c in (args.channels.split(",") if args.channels else ALL_CHANNELS) if c]
    tests = [t for t in (args.tests.split(",") if args.tests else ALL_TESTS) if t]
    bad = [c for c in channels if c not in ALL_CHANNELS] + [t for t in tests if t not in ALL_TESTS]
    if bad:
        print(f"unknown channel/test {bad}; channels {ALL_CHANNELS}, tests {ALL_TESTS}", file=sys.stderr)
        return 2
    try:
        import zmq  # noqa: F401
    except ImportError:
        skipped = [c for c in channels if c in ZMQ_CHANNELS]
        if skipped:
            print(f"pyzmq is not importable: zmq rows skipped ({', '.join(skipped)})", flush=True)
        channels = [c for c in channels if c not in ZMQ_CHANNELS]
    params = make_params(args)
    meta = _meta(args, params)
    print(f"# {meta['date']}  python {meta['python']}  trio {meta.get('trio')}  pyzmq {meta.get('pyzmq', '-')} "
          f"(libzmq {meta.get('libzmq', '-')})  {meta['cpus']} CPUs {meta['cpu_model'] or ''}", flush=True)
    runs = []
    t_start = time.monotonic()
    for rep in range(args.reps):
        # test-major, channel order rotated each repetition: the figures compared
        # with each other are taken minutes apart at most, and no channel always
        # runs first or last
        k = rep % len(channels)
        order = channels[k:] + channels[:k]
        for t in tests:
            for ch in order:
                t0 = time.monotonic()
                res = run_one(ch, t, params[t], args.timeout, args.pin)
                runs.append({"rep": rep, "channel": ch, "test": t, "result": res})
                if args.verbose:
                    brief = res.get("error") or ", ".join(
                        f"{m}={res[m]:.4g}" for m in METRICS[t] + (("rtt_ms",) if t.startswith("big") else ())
                    )
                    print(f"  rep {rep + 1} {ch:13s} {t:6s} {time.monotonic() - t0:5.1f}s  {brief}", flush=True)
        print(f"# repetition {rep + 1}/{args.reps} done ({time.monotonic() - t_start:.0f}s)", flush=True)
    meta["loadavg_end"] = _loadavg()
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    summary = summarize(runs, channels, tests)
    print()
    print(f"Medians of {args.reps} repetitions; latency = 64 B round trip; GB/s = 2 × payload / median round trip.")
    print()
    print(table(summary, channels, tests))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "channels": {c: LABELS[c] for c in channels}, "summary": summary,
                       "runs": runs, "table": table(summary, channels, tests)}, f, indent=1)
        print(f"\nwrote {args.out}")
    return 0


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the results (meta, per-run figures, medians) as JSON here")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--channels", help=f"comma-separated subset of {','.join(ALL_CHANNELS)}")
    ap.add_argument("--tests", help=f"comma-separated subset of {','.join(ALL_TESTS)}")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per measurement (default 120)")
    ap.add_argument("--quick", action="store_true", help="small counts: a smoke test, not figures")
    ap.add_argument("--lat-warmup", type=int, default=500)
    ap.add_argument("--lat-iters", type=int, default=5000)
    ap.add_argument("--tput-warmup", type=int, default=20_000)
    ap.add_argument("--tput-msgs", type=int, default=200_000)
    ap.add_argument("--big1m-warmup", type=int, default=5)
    ap.add_argument("--big1m-iters", type=int, default=100)
    ap.add_argument("--big64m-warmup", type=int, default=1)
    ap.add_argument("--big64m-iters", type=int, default=8)
    ap.add_argument("--kernel-yield-every", type=int, default=100,
                    help="kernel/tput: the sending task yields to the loop after this many sends (default 100)")
    ap.add_argument("--pin", choices=["none", "same", "split"], default="none",
                    help="CPU affinity of the two processes: none (default), same (both on CPU 0: per-message "
                         "CPU cost, no cross-CPU wake-ups), split (server CPU 0, client CPU 1)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every measurement as it ends")
    # internal: child processes
    ap.add_argument("--role", choices=["server", "client"], help=argparse.SUPPRESS)
    ap.add_argument("--channel", help=argparse.SUPPRESS)
    ap.add_argument("--test", help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, default=60.0, help=argparse.SUPPRESS)
    ap.add_argument("--cpus", help=argparse.SUPPRESS)
    ap.add_argument("--peer-cpus", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        return child_main(args)
    if args.quick:
        args.lat_warmup, args.lat_iters = 50, 500
        args.tput_warmup, args.tput_msgs = 1000, 20_000
        args.big1m_warmup, args.big1m_iters = 1, 10
        args.big64m_warmup, args.big64m_iters = 1, 2
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
