"""Exactly once, in order, under connections broken from outside.

Two real kernels, each on its own thread (the way a client and a proc run
theirs), over ``ipc`` and ``tcp``, with inbound sessions read by the poller
thread and by the trio loop (``THREADED_INBOUND``).  A foreign thread
pipelines numbered messages while a breaker thread, on a seeded random
schedule, shuts down the live connection's socket from the sending end, the
receiving end, or both (``shutdown(2)`` in either direction, as a cut link or
a peer's crash would), and on tcp resets it from outside (``ss -K``, where
the test runs as root).  The receiving port records every number it
is handed: the record must be exactly ``0 .. N-1``, no duplicate, no
inversion, nothing lost.

The duplicates this pins came from a reconnect computing its resume point
(the session's last delivered sequence number) while the previous connection
of the same session was still delivering buffered frames: both delivered.
"""

from __future__ import annotations

import marshal
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from monarch_core._kernel import _outbound, _runtime
from monarch_core._kernel import _wire as W
from monarch_core._kernel._runtime import Kernel
from monarch_core._plugins import registry

from test_kernel_sessions import Recorder, _wait_threaded

N = int(os.environ.get("BREAK_N", "20000"))
PAD = bytes(200)  # frames of ~250 bytes: a socket buffer holds thousands
SEEDS = [int(s) for s in os.environ.get("BREAK_SEEDS", "1,2,3").split(",")]


class _SlowRecorder(Recorder):
    """Records like :class:`Recorder`, pausing now and then (a busy actor), so
    that frames pile up in the receiving socket: a broken connection then
    still has messages to deliver when its successor shakes hands."""

    def deliver(self, rank, status, payload, buffers):  # type: ignore[no-untyped-def]
        super().deliver(rank, status, payload[:4], buffers)
        if len(self.values) % 400 == 0:
            time.sleep(0.002)


class _Sockets:
    """Records the raw sockets of the sessions between the test's kernels
    (:attr:`kernels`), by end.  The hook is process-wide: this process's other
    kernels -- the xdist worker's client, whose session-scoped procs other
    tests share -- must not have their sockets recorded, and broken."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.outbound: list[socket.socket] = []
        self.inbound: list[socket.socket] = []
        self.kernels: list[Kernel] = []
        self.lock = threading.Lock()
        real = _runtime._raw_socket

        def recording(stream):  # type: ignore[no-untyped-def]
            sock = real(stream)
            frame = sys._getframe(1)
            caller, owner = frame.f_code.co_name, frame.f_locals.get("self")
            kernel = owner.kernel if caller == "_session" else owner  # an _Outbound's, or a Kernel
            if sock is not None and any(kernel is k for k in self.kernels):
                with self.lock:
                    (self.outbound if caller == "_session" else self.inbound).append(sock)
            return sock

        monkeypatch.setattr(_runtime, "_raw_socket", recording)  # inbound sessions (Kernel._serve_inbound)
        monkeypatch.setattr(_outbound, "_raw_socket", recording)  # outbound ones (_Outbound._session)

    def inbound_of(self, b: Kernel) -> list[socket.socket]:
        """Inbound sockets, the trio-read ones included (their ackers hold them)."""
        with self.lock:
            socks = list(self.inbound)
        for acker in list(b._ackers):
            s = getattr(getattr(acker.stream, "_sock", None), "_sock", None)
            if s is not None:
                socks.append(s)
        return socks


def _break(sock: socket.socket, how: int) -> bool:
    try:
        sock.shutdown(how)
        return True
    except OSError:  # already closed
        return False


def _rst(b: Kernel) -> bool:
    """Reset every TCP connection to ``b`` from outside the process (``ss -K``,
    as an operator or a middlebox would): both ends see ECONNRESET."""
    port = b.address.rsplit(":", 1)[1]  # type: ignore[union-attr]
    try:
        r = subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{port}"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "ESTAB" in r.stdout


def _can_rst() -> bool:
    return os.geteuid() == 0 and shutil.which("ss") is not None


def _breaker(socks: _Sockets, b: Kernel, seed: int, stop: threading.Event, counts: dict, rst: bool) -> None:
    rnd = random.Random(seed)
    hows = [socket.SHUT_RDWR, socket.SHUT_RD, socket.SHUT_WR]
    ends = ["client", "proc", "both"] + (["rst"] if rst else [])
    while not stop.wait(rnd.uniform(0.005, 0.05)):
        end = rnd.choice(ends)
        if end == "rst":
            if _rst(b):
                counts[end] = counts.get(end, 0) + 1
            continue
        how = rnd.choice(hows)
        targets: list[socket.socket] = []
        if end in ("client", "both"):
            with socks.lock:
                targets += socks.outbound[-1:]
        if end in ("proc", "both"):
            targets += socks.inbound_of(b)[-1:]
        for s in targets:
            if _break(s, how):
                counts[end] = counts.get(end, 0) + 1


@pytest.mark.parametrize("threaded_inbound", [True, False], ids=["poller", "trio-loop"])
@pytest.mark.parametrize("transport", ["ipc", "tcp"])
@pytest.mark.parametrize("seed", SEEDS)
def test_messages_arrive_exactly_once_in_order_while_connections_break(
    monkeypatch: pytest.MonkeyPatch, transport: str, threaded_inbound: bool, seed: int
) -> None:
    monkeypatch.setattr(_runtime, "THREADED_INBOUND", threaded_inbound)
    socks = _Sockets(monkeypatch)
    t = registry().transport(transport)
    bind = "tcp://127.0.0.1:0" if transport == "tcp" else None
    a = Kernel(proc_id=f"a-{uuid.uuid4().hex[:8]}", name="a", transport=t, bind_spec=bind)
    b = Kernel(proc_id=f"b-{uuid.uuid4().hex[:8]}", name="b", transport=t, bind_spec=bind)
    socks.kernels += [a, b]
    a.start_thread(name="test-kernel-a")
    b.start_thread(name="test-kernel-b")
    stop = threading.Event()
    counts: dict[str, int] = {}
    breaker = threading.Thread(target=_breaker, args=(socks, b, seed, stop, counts, transport == "tcp" and _can_rst()), daemon=True)
    try:
        rec = _SlowRecorder(expect=N)
        port = b.add_port(rec)
        header = marshal.dumps((port, 0, W.S_VALUE))
        # a first message, so that a session exists before the breaks start
        a.send(b.proc_id, b.address, W.K_PORT, 0, header, (0).to_bytes(4, "little"), [])
        breaker.start()
        rnd = random.Random(seed)
        for i in range(1, N):
            a.send(b.proc_id, b.address, W.K_PORT, 0, header, i.to_bytes(4, "little") + PAD, [])
            if rnd.random() < 0.002:
                time.sleep(rnd.uniform(0.001, 0.02))  # gaps: some breaks hit an idle session
        _wait_threaded(rec.got_all, a, b, timeout=120)
        stop.set()
        breaker.join(10)
        # one more round trip: anything still duplicated arrives before it
        rec.expect = N + 1
        rec.got_all.clear()
        a.send(b.proc_id, b.address, W.K_PORT, 0, header, N.to_bytes(4, "little"), [])
        _wait_threaded(rec.got_all, a, b, timeout=60)
        got = [int.from_bytes(v[2], "little") for v in rec.values]
    finally:
        stop.set()
        a.stop_loop()
        b.stop_loop()
        a.join(10)
        b.join(10)
    print("breaks", counts, "N", N)
    assert sum(counts.values()) > 0, "the breaker never broke a connection: the test tested nothing"
    dups = len(got) - len(set(got))
    inversions = sum(1 for x, y in zip(got, got[1:]) if y < x)
    lost = sorted(set(range(N + 1)) - set(got))
    assert (dups, inversions, lost[:10]) == (0, 0, []), (
        f"{dups} duplicates, {inversions} inversions, {len(lost)} lost over {counts} breaks"
    )
    assert got == list(range(N + 1))
    assert rec.failures == []
