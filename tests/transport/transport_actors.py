"""Actors used by the transport tests' client processes.

This module is importable in every process of a test (the clients, the worker
loops and the procs they start get this directory on ``PYTHONPATH``), so actor
classes travel by reference, as installed code does on real hosts.
"""

from __future__ import annotations

import os
import socket
import time

from monarch_core.actor import Actor, endpoint


def _my_address() -> str:
    from monarch_core._launch import _start
    from monarch_core._proc import _state

    _start.ensure_runtime()
    return _state.current().kernel.address


def _listen_port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _hex_ip(text: str) -> str:
    """An address of /proc/net/tcp{,6} (hex, host byte order words) as text."""
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    v6 = socket.inet_ntop(socket.AF_INET6, words)
    return v6[len("::ffff:") :] if v6.startswith("::ffff:") and "." in v6 else v6


def _sockets(port: int, state: str) -> list[tuple[str, str]]:
    """(local IP, remote IP) of the TCP sockets on local ``port`` in ``state``
    (hex, as in /proc/net/tcp) in this process's network namespace."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/self/net/{name}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, remote = fields[1].split(":"), fields[2].split(":")
            if fields[3] == state and int(local[1], 16) == port:
                out.append((_hex_ip(local[0]), _hex_ip(remote[0])))
    return out


def inbound_peers(port: int) -> list[str]:
    """Remote IPs of the established TCP connections to local ``port``."""
    return sorted({remote for _local, remote in _sockets(port, "01")})


def listening_on(port: int) -> list[str]:
    """Local IPs of the listening sockets on ``port``."""
    return sorted({local for local, _remote in _sockets(port, "0A")})


def my_listening() -> list[str]:
    """Where this process's kernel listens (its bind address, not the advertised one)."""
    return listening_on(_listen_port(_my_address()))


class Where(Actor):
    """Reports where it runs; calls peers; streams to a port."""

    @endpoint
    def where(self) -> dict:
        address = _my_address()
        return {
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "address": address,
            "netns": os.readlink("/proc/self/ns/net"),
            "tls_cert": os.environ.get("MONARCH_TLS_CERT"),
        }

    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    def inbound(self) -> list[str]:
        """Remote IPs connected to this proc's listening port."""
        return inbound_peers(_listen_port(_my_address()))

    @endpoint
    def listening(self) -> list[str]:
        return my_listening()

    @endpoint
    def call_peers(self, peers: object) -> dict:
        """Call ``where`` on every actor of the mesh ``peers`` from here."""
        got = peers.where.call().get(timeout=60).values()  # type: ignore[attr-defined]
        return {"me": _my_address(), "peers": [g["address"] for g in got]}

    @endpoint
    def stream(self, port: object, n: int, pace_every: int = 0, pace_s: float = 0.0) -> int:
        """Send ``0..n-1`` then ``"end"`` to ``port``; every ``pace_every``
        messages pause ``pace_s`` seconds (spreads the stream over time so that
        a fault can hit it midway; not synchronisation)."""
        send = port.send  # type: ignore[attr-defined]
        for i in range(n):
            send(i)
            if pace_every and i % pace_every == pace_every - 1:
                time.sleep(pace_s)
        send("end")
        return n


def _session_sockets(kernel) -> list:  # type: ignore[no-untyped-def]
    """The raw sockets of ``kernel``'s live sessions, both directions."""
    socks = [s.sock for s in list(getattr(kernel._poller, "_sessions", {}).values())]
    socks += [o.sock for o in list(kernel._outbound.values()) if o.sock is not None]
    return socks


def break_sessions_forever(kernel, seed: int, stop) -> None:  # type: ignore[no-untyped-def]
    """Shut down a random live session socket of ``kernel`` every 5-50 ms
    until ``stop`` is set (a thread body; the exactly-once tests)."""
    import random

    rnd = random.Random(seed)
    hows = [socket.SHUT_RDWR, socket.SHUT_RD, socket.SHUT_WR]
    while not stop.wait(rnd.uniform(0.005, 0.05)):
        socks = _session_sockets(kernel)
        if socks:
            try:
                rnd.choice(socks).shutdown(rnd.choice(hows))
            except OSError:
                pass


class SeqRecorder(Actor):
    """Records the numbers it is called with, in the order it runs them."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @endpoint
    def record(self, i: int) -> int:
        self.seen.append(i)
        return i * 2

    @endpoint
    def report(self) -> list[int]:
        return self.seen


class ProcBreaker(Actor):
    """Breaks its proc's session sockets from a thread of its own while the
    proc's other actors work."""

    def __init__(self) -> None:
        import threading

        self._stop = threading.Event()
        self._thread = None

    @endpoint
    def begin(self, seed: int) -> None:
        import threading

        from monarch_core._proc import _state

        self._thread = threading.Thread(
            target=break_sessions_forever, args=(_state.current().kernel, seed, self._stop), daemon=True
        )
        self._thread.start()

    @endpoint
    def end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


class Hanger(Actor):
    """Answers, or stops its whole process (SIGSTOP: hung, not dead)."""

    @endpoint
    def where(self) -> dict:
        import monarch_core

        return {"pid": os.getpid(), "address": _my_address(), "monarch_core": monarch_core.__file__}

    @endpoint
    def echo(self, x: object) -> object:
        return x

    @endpoint
    def sleep(self, s: float) -> float:
        time.sleep(s)
        return s

    @endpoint
    def hang(self) -> str:
        import signal
        import threading

        os.kill(os.getpid(), signal.SIGSTOP)  # the whole proc, trio loop included, stops
        # The signal stops this thread at its next return to user space, which
        # may come a moment after kill() returns: never reply in that window.
        threading.Event().wait()
        return "resumed?!"


def reset_connections_forever(ports: list[int], seed: int, stop, resets: list) -> None:  # type: ignore[no-untyped-def]
    """Reset (``ss -K``, from outside the sockets' owners: both ends get
    ECONNRESET) every TCP connection to one of ``ports``, picked at random,
    every 5-50 ms until ``stop`` is set (needs root; the tls exactly-once
    test).  Appends to ``resets`` the number of connections each reset hit."""
    import random
    import subprocess

    rnd = random.Random(seed)
    while not stop.wait(rnd.uniform(0.005, 0.05)):
        port = rnd.choice(ports)
        r = subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{port}"],
                           capture_output=True, text=True, timeout=10)
        resets.append(r.stdout.count("ESTAB"))
