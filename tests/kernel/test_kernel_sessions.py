"""Two real ``Kernel`` objects talking over real transports.

Each test runs both kernels either on one trio loop (``serve`` started in one
nursery) or each on its own thread (``start_thread``, the way the client runs
its kernel), over ``inproc`` (built-in: socket pairs inside one process) and
``ipc`` (monarch-transport-tcp: Unix-domain sockets).  Port handlers are plain
objects with ``deliver``/``fail``; every wait is on an event the handler sets,
bounded by ``trio.fail_after`` / ``Event.wait(timeout)``.
"""

from __future__ import annotations

import contextlib
import functools
import marshal
import os
import signal
import struct
import sys
import threading
import time
import uuid
from typing import Any

import pytest
import trio

from monarch_core._builtins._inproc import InprocTransport
from monarch_core._kernel import _wire as W
from monarch_core._kernel._runtime import Kernel
from monarch_core._launch._children import start_child
from monarch_core._plugins import registry
from monarch_core.errors import ConnectionClosed, SupervisionError
from monarch_core._builtins._ipc import IpcTransport

from _helpers import run_async

N_FIFO = 10_000
TRANSPORTS = ["inproc", "ipc"]


# ---------------------------------------------------------------- helpers


class Recorder:
    """A port handler that records deliveries and failures (any thread) and
    signals when ``expect`` deliveries have arrived."""

    def __init__(self, expect: int = 0) -> None:
        self.values: list[tuple[int, int, bytes, list]] = []
        self.failures: list[tuple[BaseException, str | None]] = []
        self.expect = expect
        self.lock = threading.Lock()
        self.got_all = threading.Event()
        self.failed = threading.Event()
        self.trio_got_all: trio.Event | None = None
        self.trio_failed: trio.Event | None = None
        self.delivering_threads: set[int] = set()
        self._changed: trio.Event | None = None

    def arm_trio(self) -> None:
        """Use trio events too, set on the test's loop whichever thread delivers
        (the kernel reads plain-socket sessions on threads of their own)."""
        self.trio_got_all = trio.Event()
        self.trio_failed = trio.Event()
        self._changed = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._loop_thread = threading.get_ident()

    def _set(self, ev: trio.Event) -> None:
        if threading.get_ident() == self._loop_thread:
            ev.set()
        else:
            try:
                self._token.run_sync_soon(ev.set)
            except trio.RunFinishedError:
                pass

    async def wait_count(self, n: int) -> None:
        while len(self.values) < n:
            self._changed = trio.Event()
            await self._changed.wait()

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        with self.lock:
            self.values.append((rank, status, bytes(payload), [bytes(b) for b in buffers]))
            self.delivering_threads.add(threading.get_ident())
            done = len(self.values) >= self.expect
        if self._changed is not None:
            self._set(self._changed)
        if done:
            self.got_all.set()
            if self.trio_got_all is not None:
                self._set(self.trio_got_all)

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        with self.lock:
            self.failures.append((exc, proc_id))
        self.failed.set()
        if self.trio_failed is not None:
            self._set(self.trio_failed)


def _transport(name: str):  # type: ignore[no-untyped-def]
    t = registry().transport(name)
    assert isinstance(t, InprocTransport if name == "inproc" else IpcTransport)
    return t


def _kernel(name: str, transport: str) -> Kernel:
    return Kernel(proc_id=f"{name}-{uuid.uuid4().hex[:8]}", name=name, transport=_transport(transport))


def _port_msg(port_id: int, rank: int, body: bytes, status: int = W.S_VALUE) -> tuple:
    return (W.K_PORT, 0, marshal.dumps((port_id, rank, status)), body, [])


@contextlib.asynccontextmanager
async def two_kernels(transport: str):  # type: ignore[no-untyped-def]
    """Two kernels serving on the current trio loop."""
    a, b = _kernel("a", transport), _kernel("b", transport)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.serve)
        await nursery.start(b.serve)
        try:
            yield a, b
        finally:
            a.stop_loop()
            b.stop_loop()


@contextlib.contextmanager
def two_threaded_kernels(transport: str):  # type: ignore[no-untyped-def]
    a, b = _kernel("a", transport), _kernel("b", transport)
    a.start_thread(name="test-kernel-a")
    b.start_thread(name="test-kernel-b")
    try:
        yield a, b
    finally:
        a.stop_loop()
        b.stop_loop()
        a.join(10)
        b.join(10)


def _wait_threaded(ev: threading.Event, *kernels: Kernel, timeout: float) -> None:
    """Wait for ``ev``; fail at once (naming it) if a kernel loop died meanwhile."""
    deadline = time.monotonic() + timeout
    while not ev.wait(0.05):
        dead = [k.name for k in kernels if k.join(0)]
        assert not dead, f"kernel loop(s) {dead} died (see the 'monarch kernel loop crashed' log)"
        assert time.monotonic() < deadline, f"not done within {timeout}s"


_run = functools.partial(run_async, timeout=60.0)  # afn() in a fresh trio run


# ---------------------------------------------------------------- FIFO, exactly once


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ten_thousand_messages_arrive_in_order_exactly_once_same_loop(transport: str) -> None:
    async def go() -> Recorder:
        async with two_kernels(transport) as (a, b):
            rec = Recorder(expect=N_FIFO)
            rec.arm_trio()
            port = b.add_port(rec)
            for i in range(N_FIFO):
                kind, flags, header, payload, bufs = _port_msg(port, i % 7, i.to_bytes(4, "little"))
                a.send(b.proc_id, b.address, kind, flags, header, payload, bufs)
            await rec.trio_got_all.wait()
            # one more round trip: anything duplicated would have arrived before it
            rec.expect = N_FIFO + 1
            rec.got_all.clear()
            rec.trio_got_all = trio.Event()
            kind, flags, header, payload, bufs = _port_msg(port, 0, b"end")
            a.send(b.proc_id, b.address, kind, flags, header, payload, bufs)
            await rec.trio_got_all.wait()
            return rec

    rec = _run(go)
    assert [int.from_bytes(v[2], "little") for v in rec.values[:N_FIFO]] == list(range(N_FIFO))
    assert [v[0] for v in rec.values[:N_FIFO]] == [i % 7 for i in range(N_FIFO)]
    assert rec.values[N_FIFO:] == [(0, W.S_VALUE, b"end", [])]
    assert rec.failures == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_ten_thousand_messages_from_a_foreign_thread_arrive_in_order_exactly_once(transport: str) -> None:
    with two_threaded_kernels(transport) as (a, b):
        rec = Recorder(expect=N_FIFO + 1)
        port = b.add_port(rec)
        big = bytes(range(256)) * 400  # 100 kB out-of-band buffer on some messages
        try:
            for i in range(N_FIFO):
                bufs = [big] if i % 1000 == 0 else []
                a.send(b.proc_id, b.address, W.K_PORT, 0, marshal.dumps((port, 0, W.S_VALUE)), str(i).encode(), bufs)
            a.send(b.proc_id, b.address, W.K_PORT, 0, marshal.dumps((port, 1, W.S_VALUE)), b"end", [])
        except RuntimeError as e:
            dead = [k.name for k in (a, b) if k.join(0)]
            raise AssertionError(f"kernel loop(s) {dead} died while sending ({e}); see 'monarch kernel loop crashed'")
        _wait_threaded(rec.got_all, a, b, timeout=60)
        values = list(rec.values)
    assert [v[2] for v in values] == [str(i).encode() for i in range(N_FIFO)] + [b"end"]
    assert [len(v[3]) for v in values[:N_FIFO]] == [1 if i % 1000 == 0 else 0 for i in range(N_FIFO)]
    assert all(v[3] == [big] for v in values[:N_FIFO:1000])
    # delivered by b (its loop, its poller, or the thread that reads a large
    # message), one at a time and in order (checked above), never by the
    # sender's thread or a's loop
    assert not rec.delivering_threads & {threading.get_ident(), a.thread_ident}
    assert rec.failures == []


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_messages_in_both_directions_interleave_without_loss(transport: str) -> None:
    async def go() -> tuple[Recorder, Recorder]:
        async with two_kernels(transport) as (a, b):
            ra, rb = Recorder(expect=2000), Recorder(expect=2000)
            ra.arm_trio()
            rb.arm_trio()
            pa, pb = a.add_port(ra), b.add_port(rb)
            for i in range(2000):
                a.send(b.proc_id, b.address, *_port_msg(pb, 0, b"a%d" % i))
                b.send(a.proc_id, a.address, *_port_msg(pa, 0, b"b%d" % i))
                if i % 100 == 0:
                    await trio.lowlevel.checkpoint()
            await ra.trio_got_all.wait()
            await rb.trio_got_all.wait()
            return ra, rb

    ra, rb = _run(go)
    assert [v[2] for v in rb.values] == [b"a%d" % i for i in range(2000)]
    assert [v[2] for v in ra.values] == [b"b%d" % i for i in range(2000)]


# ---------------------------------------------------------------- garbage connections


def _hs(**info: Any) -> bytes:
    return W.encode_handshake(info)


def _frame(kind: int, seq: int, header: bytes, payload: bytes = b"") -> bytes:
    return b"".join(bytes(p) for p in W.encode_message(kind, 0, seq, header, payload, []))


GOOD_HS = {"proc": "intruder", "session": "s-intruder", "address": ""}

GARBAGE: dict[str, Any] = {
    "http-request": lambda port: b"GET / HTTP/1.1\r\nHost: monarch\r\n\r\n",
    "tls-client-hello": lambda port: bytes.fromhex("160301020001000200000303") + b"\x00" * 64,
    "other-wire-version": lambda port: struct.pack("<8sHI", W.MAGIC, 99, 2) + marshal.dumps({}),
    "handshake-not-a-mapping": lambda port: struct.pack("<8sHI", W.MAGIC, W.VERSION, 5) + marshal.dumps(5)[:5],
    "handshake-without-session": lambda port: _hs(proc="intruder"),
    "oversized-handshake": lambda port: struct.pack("<8sHI", W.MAGIC, W.VERSION, W.MAX_HANDSHAKE + 1),
    "unknown-frame-kind": lambda port: _hs(**GOOD_HS) + W.FIXED.pack(9, 0, 0, 0, 0, 1),
    "oversized-frame-header": lambda port: _hs(**GOOD_HS) + W.FIXED.pack(W.K_PORT, 0, 0, W.MAX_HEADER + 1, 0, 1),
    "seq-gap": lambda port: _hs(**GOOD_HS) + _frame(W.K_PORT, 5, marshal.dumps((port, 0, 0)), b"x"),
    "header-not-marshal": lambda port: _hs(**GOOD_HS) + _frame(W.K_PORT, 1, b"\xff\xfe\xfd"),
    "header-not-a-tuple": lambda port: _hs(**GOOD_HS) + _frame(W.K_PORT, 1, marshal.dumps([port, 0, 0])),
    "ack-on-inbound-session": lambda port: _hs(**GOOD_HS) + _frame(W.K_ACK, 1, marshal.dumps((1,))),
    # well-formed frames whose routing header has the wrong shape
    "port-header-too-short": lambda port: _hs(**GOOD_HS) + _frame(W.K_PORT, 1, marshal.dumps((port,)), b"x"),
    "port-key-unhashable": lambda port: _hs(**GOOD_HS) + _frame(W.K_PORT, 1, marshal.dumps(([port], 0, 0)), b"x"),
    "actor-key-unhashable": lambda port: _hs(**GOOD_HS) + _frame(W.K_ACTOR, 1, marshal.dumps(([1], "ep")), b"x"),
}


@pytest.mark.parametrize("garbage", list(GARBAGE), ids=list(GARBAGE))
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_garbage_connection_is_dropped_while_a_good_session_keeps_working(transport: str, garbage: str) -> None:
    async def go() -> tuple[Recorder, bytes]:
        async with two_kernels(transport) as (a, b):
            rec = Recorder(expect=100)
            rec.arm_trio()
            port = b.add_port(rec)
            for i in range(50):  # a good session is up before the garbage arrives
                a.send(b.proc_id, b.address, *_port_msg(port, 0, b"%d" % i))
            await rec.wait_count(50)
            bad = await registry().transport(transport).connect(b.address)
            try:
                await bad.send_all(GARBAGE[garbage](port))
                # the kernel answers (at most) its handshake, then hangs up
                got = bytearray()
                while True:
                    try:
                        chunk = await bad.receive_some(65536)
                    except ConnectionClosed:
                        break
                    if not chunk:
                        break
                    got += chunk
            finally:
                await bad.aclose()
            for i in range(50, 100):
                a.send(b.proc_id, b.address, *_port_msg(port, 0, b"%d" % i))
            await rec.trio_got_all.wait()
            return rec, bytes(got)

    rec, reply = _run(go, timeout=30)
    assert [v[2] for v in rec.values] == [b"%d" % i for i in range(100)]
    # nothing the intruder sent was delivered, and it got no acknowledgement
    assert all(v[2] != b"x" for v in rec.values)
    assert W.FIXED.pack(W.K_ACK, 0, 0, 0, 0, 1) not in reply
    assert reply == b"" or reply.startswith(W.MAGIC)


# ---------------------------------------------------------------- failures


REASON = "proc b (pid 4242) was killed by SIGKILL"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_proc_failed_fails_pending_reply_ports_with_supervision_error_naming_the_reason(transport: str) -> None:
    async def go() -> tuple[list[Recorder], Recorder, list, str]:
        async with two_kernels(transport) as (a, b):
            target = Recorder(expect=3)
            target.arm_trio()
            tport = b.add_port(target)
            replies = [Recorder() for _ in range(3)]
            for i, r in enumerate(replies):
                r.arm_trio()
                rp = a.add_port(r)
                a.send(b.proc_id, b.address, *_port_msg(tport, i, b"call"), reply_port=rp)
            await target.trio_got_all.wait()  # delivered; b never replies
            bystander = Recorder()
            a.add_port(bystander)  # not waiting on b: must not be failed
            seen: list = []
            a.events.subscribe("proc_failed", lambda pid, why, stopped: seen.append((pid, why)))
            a.proc_failed(b.proc_id, REASON)
            for r in replies:
                await r.trio_failed.wait()
            return replies, bystander, seen, b.proc_id

    replies, bystander, seen, b_id = _run(go)
    for r in replies:
        assert {(type(e), str(e), pid) for e, pid in r.failures} == {(SupervisionError, REASON, b_id)}
        assert r.values == []
    assert bystander.failures == []
    assert seen == [(b_id, REASON)]


def test_pending_reply_port_is_failed_exactly_once_per_proc_failure() -> None:
    """One death, one ``fail`` call per waiting port.  (The kernel's own reply
    handlers remove their port in ``fail``, which hides a second call; this
    handler does not, as the ``PortHandler`` contract does not require it.)"""

    async def go() -> tuple[Recorder, str]:
        a = _kernel("a", "ipc")
        async with trio.open_nursery() as nursery:
            await nursery.start(a.serve)
            ghost = "ghost-" + uuid.uuid4().hex[:6]
            a.expect_proc(ghost)
            r = Recorder()
            r.arm_trio()
            a.send(ghost, None, *_port_msg(1, 0, b"call"), reply_port=a.add_port(r))
            a.proc_failed(ghost, REASON)
            a.proc_failed(ghost, "a second report of the same death")
            await r.trio_failed.wait()
            a.stop_loop()
        return r, ghost

    r, ghost = _run(go, timeout=20)
    assert [(type(e), str(e), p) for e, p in r.failures] == [(SupervisionError, REASON, ghost)]


def test_messages_queued_for_a_proc_that_never_listened_fail_when_it_dies() -> None:
    async def go() -> tuple[list[Recorder], str]:
        a = _kernel("a", "ipc")
        async with trio.open_nursery() as nursery:
            await nursery.start(a.serve)
            ghost = "ghost-" + uuid.uuid4().hex[:6]
            a.expect_proc(ghost)
            recs = [Recorder() for _ in range(4)]
            for r in recs:
                r.arm_trio()
                a.send(ghost, None, *_port_msg(1, 0, b"hello"), reply_port=a.add_port(r))
            await trio.lowlevel.checkpoint()
            assert all(r.failures == [] for r in recs)  # still waiting for an address
            a.proc_failed(ghost, "proc ghost exited with code 3 before it listened")
            for r in recs:
                await r.trio_failed.wait()
            a.stop_loop()
        return recs, ghost

    recs, ghost = _run(go, timeout=20)
    for r in recs:
        assert {(type(e), str(e), p) for e, p in r.failures} == {
            (SupervisionError, "proc ghost exited with code 3 before it listened", ghost)
        }


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sending_to_a_dead_proc_fails_the_reply_port_at_once(transport: str) -> None:
    async def go() -> tuple[Recorder, Recorder, int]:
        async with two_kernels(transport) as (a, b):
            target = Recorder(expect=1)
            target.arm_trio()
            tport = b.add_port(target)
            a.send(b.proc_id, b.address, *_port_msg(tport, 0, b"before"))
            await target.trio_got_all.wait()
            a.proc_failed(b.proc_id, REASON)
            r = Recorder()
            a.send(b.proc_id, b.address, *_port_msg(tport, 0, b"after"), reply_port=a.add_port(r))
            # no checkpoint in between: the failure is synchronous on the loop thread
            failed_at_once = list(r.failures)
            # a message sent after the death is not delivered, even though b still runs:
            # b's own traffic to a still works, proving the loop is alive
            echo = Recorder(expect=1)
            echo.arm_trio()
            b.send(a.proc_id, a.address, *_port_msg(a.add_port(echo), 0, b"b is alive"))
            await echo.trio_got_all.wait()
            return r, target, len(failed_at_once)

    r, target, n_at_once = _run(go)
    assert n_at_once == 1
    assert [(type(e), str(e)) for e, _ in r.failures] == [(SupervisionError, REASON)]
    assert [v[2] for v in target.values] == [b"before"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sending_to_a_dead_proc_from_a_foreign_thread_fails_without_waiting_for_delivery_timeout(
    transport: str,
) -> None:
    with two_threaded_kernels(transport) as (a, b):
        a.delivery_timeout = 3600.0
        a.call_soon(a.proc_failed, b.proc_id, REASON)
        r = Recorder()
        a.send(b.proc_id, b.address, *_port_msg(1, 0, b"x"), reply_port=a.add_port(r))
        _wait_threaded(r.failed, a, b, timeout=10)
    assert [(type(e), str(e), p) for e, p in r.failures] == [(SupervisionError, REASON, b.proc_id)]


# ---------------------------------------------------------------- real child processes


def _spawn_and_fail(argv: list[str], kill: bool) -> tuple[Recorder, int, str]:
    async def go() -> tuple[Recorder, int, str]:
        a = _kernel("a", "ipc")
        async with trio.open_nursery() as nursery:
            await nursery.start(a.serve)
            child_id = "child-" + uuid.uuid4().hex[:6]
            proc = start_child(argv, {"PATH": "/usr/bin:/bin"})  # the launch layer starts it, the kernel watches it
            a.adopt_child(child_id, proc, describe=f"proc {child_id}")
            r = Recorder()
            r.arm_trio()
            # the child never says where it listens: the message waits for its address
            a.send(child_id, None, *_port_msg(1, 0, b"call"), reply_port=a.add_port(r))
            if kill:
                os.kill(proc.pid, signal.SIGKILL)
            await r.trio_failed.wait()
            a.stop_loop()
        return r, proc.pid, child_id

    return _run(go, timeout=30)


def test_child_process_exit_fails_waiting_reply_ports_with_its_exit_status() -> None:
    r, pid, child_id = _spawn_and_fail([sys.executable, "-c", "raise SystemExit(3)"], kill=False)
    assert {(type(e), str(e), p) for e, p in r.failures} == {
        (SupervisionError, f"proc {child_id} (pid {pid}) exited with code 3", child_id)
    }


def test_child_process_killed_by_signal_fails_waiting_reply_ports_naming_the_signal() -> None:
    r, pid, child_id = _spawn_and_fail(["/bin/sleep", "600"], kill=True)
    assert {(type(e), str(e), p) for e, p in r.failures} == {
        (SupervisionError, f"proc {child_id} (pid {pid}) was killed by SIGKILL", child_id)
    }
