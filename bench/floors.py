"""Bare-Python floors of the single-host rows, measured on this machine.

What a Python program that does *only* the transport of a call costs here:
no actors, no futures, no sessions, no supervision, no telemetry.  Each
floor uses the mechanisms every Python actor framework on one host needs
at the least, and monarch-core uses: a Unix stream socket between two
processes, ``pickle`` for the message and its reply, and a process that
blocks in ``epoll`` until a message comes.  A target whose absolute value
(the target ratio times Monarch's figure of the same run) is below its
floor cannot be met by monarch-core, or by any Python implementation of
that path, on this machine: the framework's own work comes on top.

* ``pingpong``: sequential request/reply between two processes (the
  ``call_one`` p50/p99 rows), where the scheduler puts them, on one CPU and
  on two; the floor is the lowest p50 of the three (on a VM a wake-up on
  the other, idle, vCPU costs tens of µs; on the same CPU none at all, so
  the placement decides the figure: 8-90 µs here);
* ``pipelined``: requests written in batches of 64 by one thread while
  another reads the replies (the pipelined ``call_one`` row);
* ``fanout_16``: one request to each of 16 processes, then all 16 replies
  (the ``call()`` on 16 actors row);
* ``cold_4``: start 4 Python processes (``subprocess`` exec, as Monarch
  starts its procs) and wait until each has connected and answered; the
  interpreter's own start is included, this process's imports are not (the
  cold spawn row);
* ``cold_4_trio``: exec one interpreter that imports ``trio`` and forks 4
  children that connect and answer: the least a proc runtime on a trio
  kernel (monarch-core's) pays before a cold spawn's first reply, however
  its procs are started (a fork server that imports trio once, as here, is
  the cheapest way); left out when ``trio`` is not installed;
* ``spawn_actors``: 8 forked processes, each of which starts a thread per
  actor when told to (``threading.Thread``, its own queue: a thread per
  actor is what torchmonarch 0.7.0 gives each actor, and what an actor's
  thread-local state, torch's grad mode and current device among it, needs),
  then hands each actor one request that its thread answers: actors per
  second from the first spawn request until every reply is in (the
  ``bench/scale.py`` actors axis's spawn rate; no spawn reply, no mesh, no
  supervision: only the threads and the messages);
* ``memcpy_64mib``: a plain ``memcpy`` of 64 MiB (the 64 MiB rows: the
  receiver's fresh ``bytes`` needs at least that one copy).

    python bench/floors.py [--quick] [--json out.json]

Standard library only (and ``bench/_table.py``: percentiles as the anchors
define them); ``bench/run.py`` runs it once per run and prints the targets
against these floors.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import queue
import select
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _table as T  # noqa: E402 - bench's shared statistics (the anchors' percentile)

_LEN = struct.Struct("<I")
_REQUEST = ("call", 0, "noop", (), {})
#: Seconds any one wait may take before the measurement gives up (a child
#: that died, a machine far too loaded): nothing here waits forever.
WAIT_S = 30.0


def _wait(ep: select.epoll) -> list[tuple[int, int]]:
    events = ep.poll(WAIT_S)
    if not events:
        raise TimeoutError(f"no reply within {WAIT_S:.0f} s (a floor's child process died or hangs)")
    return events


def _recv(sock: socket.socket, n: int) -> bytes:
    data = sock.recv(n)
    if not data:
        raise ConnectionError("a floor's child process closed its socket (it died)")
    return data


def _frame(obj: object) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(body)) + body


def _unframe(buf: bytes) -> tuple[list, bytes]:
    """The complete framed messages at the start of ``buf``, unpickled, and
    what is left of it (a partial frame)."""
    msgs = []
    while len(buf) >= 4:
        (n,) = _LEN.unpack_from(buf)
        if len(buf) < 4 + n:
            break
        msgs.append(pickle.loads(buf[4:4 + n]))
        buf = buf[4 + n:]
    return msgs, buf


def _requests(sock: socket.socket) -> Iterator[list]:
    """A child's loop: block in epoll, yield the framed requests of each
    read (a list); exit at end of stream."""
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    buf = b""
    while True:
        ep.poll()
        data = sock.recv(1 << 20)
        if not data:
            os._exit(0)
        msgs, buf = _unframe(buf + data)
        yield msgs


def _echo_server(sock: socket.socket) -> None:
    """A child's loop: answer every framed request with a framed reply."""
    for msgs in _requests(sock):
        if msgs:
            sock.sendall(b"".join(_frame(("reply", m[1], None)) for m in msgs))


def _fork_echo(cpu: int | None = None) -> tuple[socket.socket, int]:
    """A child echo server (on CPU ``cpu`` only, when given)."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        parent.close()
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        try:
            _echo_server(child)
        finally:
            os._exit(0)
    child.close()
    return parent, pid


def _reap(socks: list[socket.socket], pids: list[int]) -> None:
    for s in socks:
        s.close()
    for pid in pids:
        os.waitpid(pid, 0)


def _read_replies(sock: socket.socket, ep: select.epoll, buf: bytes, want: int) -> tuple[bytes, int]:
    got = 0
    while got < want:
        _wait(ep)
        msgs, buf = _unframe(buf + _recv(sock, 1 << 20))
        got += len(msgs)
    return buf, got


def _placements() -> dict[str, tuple[int, int] | None]:
    """Where the two processes of a round trip run: the scheduler's choice,
    one CPU for both (no cross-CPU wake-up: the cheapest), or two CPUs."""
    cpus = sorted(os.sched_getaffinity(0))
    out: dict[str, tuple[int, int] | None] = {"free": None, "same_cpu": (cpus[0], cpus[0])}
    if len(cpus) > 1:
        out["two_cpus"] = (cpus[0], cpus[1])
    return out


def pingpong(calls: int, reps: int) -> dict[str, float]:
    """Sequential round trips, with the two processes where the scheduler
    puts them, on one CPU and on two CPUs: p50 and p99 in µs of each (median
    over ``reps``), and the floor: the lowest p50 (and its p99)."""
    out: dict[str, float] = {}
    mine = os.sched_getaffinity(0)
    try:
        for name, cpus in _placements().items():
            os.sched_setaffinity(0, mine if cpus is None else {cpus[0]})
            r = _pingpong(calls, reps, None if cpus is None else cpus[1])
            out[f"{name}_p50_us"], out[f"{name}_p99_us"] = r["p50_us"], r["p99_us"]
    finally:
        os.sched_setaffinity(0, mine)
    best = min((k[:-len("_p50_us")] for k in out if k.endswith("_p50_us")), key=lambda k: out[f"{k}_p50_us"])
    out["p50_us"], out["p99_us"] = out[f"{best}_p50_us"], out[f"{best}_p99_us"]
    return out


def _pingpong(calls: int, reps: int, cpu: int | None) -> dict[str, float]:
    sock, pid = _fork_echo(cpu)
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    p50s, p99s = [], []
    try:
        buf = b""
        for _ in range(200):  # warm up
            sock.sendall(_frame(_REQUEST))
            buf, _ = _read_replies(sock, ep, buf, 1)
        for _ in range(reps):
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                sock.sendall(_frame(_REQUEST))
                buf, _ = _read_replies(sock, ep, buf, 1)
                times.append(time.perf_counter() - t0)
            p50s.append(T.percentile(times, 50) * 1e6)
            p99s.append(T.percentile(times, 99) * 1e6)
    finally:
        _reap([sock], [pid])
    return {"p50_us": statistics.median(p50s), "p99_us": statistics.median(p99s)}


def pipelined(calls: int, reps: int) -> dict[str, float]:
    """``calls`` requests written in batches of 64 by a sender thread while
    this thread reads the replies: calls/s (median over ``reps``)."""
    sock, pid = _fork_echo()
    ep = select.epoll()
    ep.register(sock.fileno(), select.EPOLLIN)
    rates = []

    def send(n: int) -> None:
        batch = []
        for i in range(n):
            batch.append(_frame(("call", i, "noop", (), {})))
            if len(batch) == 64:
                sock.sendall(b"".join(batch))
                batch = []
        if batch:
            sock.sendall(b"".join(batch))

    try:
        for n in [min(calls, 2000)] + [calls] * reps:  # the first is a warm-up
            t0 = time.perf_counter()
            sender = threading.Thread(target=send, args=(n,))
            sender.start()
            _read_replies(sock, ep, b"", n)
            sender.join()
            rates.append(n / (time.perf_counter() - t0))
    finally:
        _reap([sock], [pid])
    return {"calls_per_s": statistics.median(rates[1:])}


def fanout(size: int, iters: int) -> dict[str, float]:
    """One request to each of ``size`` processes, then every reply: p50 and
    p99 in ms."""
    pairs = [_fork_echo() for _ in range(size)]
    socks = [s for s, _ in pairs]
    ep = select.epoll()
    by_fd = {}
    for s in socks:
        ep.register(s.fileno(), select.EPOLLIN)
        by_fd[s.fileno()] = s
    times = []
    frame = _frame(_REQUEST)
    try:
        for i in range(iters + 20):
            t0 = time.perf_counter()
            for s in socks:
                s.sendall(frame)
            left = size
            while left:
                for fd, _ev in _wait(ep):
                    data = _recv(by_fd[fd], 1 << 16)
                    pickle.loads(data[4:])  # one small reply per request: one frame
                    left -= 1
            if i >= 20:
                times.append(time.perf_counter() - t0)
    finally:
        _reap(socks, [p for _, p in pairs])
    return {"p50_ms": T.percentile(times, 50) * 1e3, "p99_ms": T.percentile(times, 99) * 1e3}


_CHILD = ("import os, socket, sys\n"
          "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
          "s.connect(sys.argv[1])\n"
          "s.sendall(str(os.getpid()).encode())\n"
          "s.recv(1)\n")


_FORKER = ("import os, socket, sys\n"
           "import trio  # noqa: F401 - what a proc on a trio kernel imports before it answers\n"
           "n = int(sys.argv[2])\n"
           "for _ in range(n):\n"
           "    if os.fork() == 0:\n"
           "        try:\n"
           "            exec(CHILD)\n"
           "        finally:\n"
           "            os._exit(0)\n"
           "for _ in range(n):\n"
           "    os.wait()\n")


def cold(procs: int, reps: int, trio: bool = False) -> dict[str, float]:
    """Start ``procs`` Python processes (exec) that connect back over a Unix
    socket and answer: seconds until every one has (median over ``reps``).
    ``trio``: exec one interpreter that imports trio and forks the ``procs``
    that answer instead."""
    out = []
    with tempfile.TemporaryDirectory(prefix="floor-") as d:
        path = os.path.join(d, "s")
        for _ in range(reps + 1):  # the first warms the page cache
            lsn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            lsn.settimeout(WAIT_S)  # accept and recv below: a child that fails to start is an error, not a hang
            lsn.bind(path)
            lsn.listen(procs)
            t0 = time.perf_counter()
            if trio:
                children = [subprocess.Popen([sys.executable, "-c", f"CHILD = {_CHILD!r}\n" + _FORKER, path,
                                              str(procs)])]
            else:
                children = [subprocess.Popen([sys.executable, "-c", _CHILD, path]) for _ in range(procs)]
            conns = []
            try:
                for _ in range(procs):
                    c, _addr = lsn.accept()
                    conns.append(c)
                    c.settimeout(WAIT_S)
                    _recv(c, 16)
                out.append(time.perf_counter() - t0)
            finally:
                for c in conns:
                    c.close()  # each child then ends
                for p in children:
                    try:
                        p.wait(timeout=WAIT_S)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
                lsn.close()
                os.unlink(path)
    return {"s": statistics.median(out[1:])}


def _actor_server(sock: socket.socket) -> None:
    """A child's loop for ``spawn_actors``: a ``("spawn", i)`` request starts
    actor ``i``'s thread; a ``("call", i, ...)`` request is handed to it and
    its thread answers; exit at end of stream."""
    lock = threading.Lock()
    actors: dict[int, queue.SimpleQueue] = {}

    def actor(q: queue.SimpleQueue) -> None:
        while True:
            m = q.get()
            data = _frame(("reply", m[1], None))
            with lock:
                sock.sendall(data)

    for msgs in _requests(sock):
        for m in msgs:
            if m[0] == "spawn":
                q: queue.SimpleQueue = queue.SimpleQueue()
                threading.Thread(target=actor, args=(q,), daemon=True).start()
                actors[m[1]] = q
            else:
                actors[m[1]].put(m)


def spawn_actors(actors: int, procs: int, reps: int) -> dict[str, float]:
    """``actors`` actors over ``procs`` forked processes, a thread each, and
    one call to each: actors per second from the first spawn request until
    every call is answered (median over ``reps``, each in fresh processes)."""
    rates = []
    per = max(1, actors // procs)
    for _ in range(reps):
        socks: list[socket.socket] = []
        pids: list[int] = []
        try:
            for _ in range(procs):
                parent, child = socket.socketpair()
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the child
                    parent.close()
                    try:
                        _actor_server(child)
                    finally:
                        os._exit(0)
                child.close()
                socks.append(parent)
                pids.append(pid)
            ep = select.epoll()
            by_fd = {s.fileno(): s for s in socks}
            bufs = {fd: b"" for fd in by_fd}
            for fd in by_fd:
                ep.register(fd, select.EPOLLIN)
            t0 = time.perf_counter()
            for s in socks:
                s.sendall(b"".join(_frame(("spawn", i)) for i in range(per)))
            for s in socks:
                s.sendall(b"".join(_frame(("call", i, "noop", (), {})) for i in range(per)))
            got = 0
            while got < per * procs:
                for fd, _ in _wait(ep):
                    msgs, bufs[fd] = _unframe(bufs[fd] + _recv(by_fd[fd], 1 << 20))
                    got += len(msgs)
            rates.append(got / (time.perf_counter() - t0))
            ep.close()
        finally:
            _reap(socks, pids)
    return {"actors_per_s": statistics.median(rates)}


def _has_trio() -> bool:
    """Whether the interpreter the floors start can import trio (without importing it here)."""
    import importlib.util

    return importlib.util.find_spec("trio") is not None


def memcpy_64mib(reps: int, size: int = 64 << 20) -> dict[str, float]:
    """A plain ``memcpy`` of 64 MiB between two buffers this process has
    touched already: MiB/s (median over ``reps``).  Sending 64 MiB into a
    fresh ``bytes`` in another process needs at least this one copy."""
    src = bytearray(os.urandom(1 << 20)) * (size >> 20)
    dst = bytearray(size)
    dst[:] = src  # touch every page first
    copies = []
    for _ in range(reps):
        t0 = time.perf_counter()
        memoryview(dst)[:] = memoryview(src)
        copies.append(size / (1 << 20) / (time.perf_counter() - t0))
    return {"mib_s": statistics.median(copies)}


def measure(quick: bool = False) -> dict[str, float]:
    """Every floor once; a flat dict of figures."""
    q = quick
    pp = pingpong(200 if q else 1000, 2 if q else 3)
    fo = fanout(16, 50 if q else 300)
    return {
        "pingpong_p50_us": pp["p50_us"],
        "pingpong_p99_us": pp["p99_us"],
        **{f"pingpong_{k}": v for k, v in pp.items() if k not in ("p50_us", "p99_us")},
        "pipelined_calls_s": pipelined(5000 if q else 20000, 2 if q else 5)["calls_per_s"],
        "fanout16_p50_ms": fo["p50_ms"],
        "cold4_s": cold(4, 3 if q else 7)["s"],
        **({"cold4_trio_s": cold(4, 3 if q else 7, trio=True)["s"]} if _has_trio() else {}),
        "spawn1000_actors_s": spawn_actors(1000, 8, 2 if q else 7)["actors_per_s"],
        "memcpy_64mib_mib_s": memcpy_64mib(3 if q else 9)["mib_s"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke test)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    out = measure(args.quick)
    for k, v in out.items():
        print(f"{k:24s} {v:14,.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
