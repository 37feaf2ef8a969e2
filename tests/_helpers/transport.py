"""Helpers and fixtures of the multi-host transport suite (``tests/transport``,
whose ``conftest.py`` imports the fixtures from here).

Hosts are network namespaces made by ``scripts/testbed/netns-up.sh``: the
test process and the clients live in the root namespace (``10.250.0.1``,
name ``rtctl``), host ``hI`` is namespace ``rt-hI`` at ``10.250.0.(10+I)``.
Worker loops run inside the namespaces (``ip netns exec rt-hI``, with their own
UTS namespace so ``socket.gethostname()`` is ``hI``) from this interpreter.

A process can enable only one transport, so every client runs in its own
subprocess: :func:`run_client` runs a snippet and returns the JSON object its
last stdout line holds; :class:`ClientProcess` is the interactive variant
(JSON lines out, commands on stdin).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from _helpers import clients as _clients
from _helpers.clients import LineReader
from _helpers.procs import descendants, kill_tree, parent_of, pid_running, wait_pids_gone
from _helpers.testbed import TESTBED, Testbed, links_up, netns  # noqa: F401 - fixtures, re-exported

__all__ = ["LineReader", "Testbed", "descendants", "kill_tree", "links_up", "netns", "pid_running", "wait_pids_gone"]  # re-exported

#: the transport suite's folder (``transport_actors`` is imported from there, also by children)
HERE = Path(__file__).resolve().parents[1] / "transport"
REPO = HERE.parents[1]

PY = sys.executable
NHOSTS = 3
NET = "10.250.0"
ROOT_ADDR = f"{NET}.1"
TCP_PORT = 29500
TLS_PORT = 29501
LISTENING = re.compile(r"^monarch worker loop listening on (\S+)$")


def host_addr(i: int) -> str:
    return f"{NET}.{10 + i}"


# ---------------------------------------------------------------- environment of child processes


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
            s.listen(1)
            with socket.create_connection(("::1", s.getsockname()[1]), timeout=5):
                return True
    except OSError:
        return False


#: mark for a test case that needs a working IPv6 loopback (``::1``)
NEEDS_V6 = pytest.mark.skipif(not _ipv6_loopback(), reason="this machine has no working IPv6 loopback (::1)")


def child_env(extra: dict[str, str | None] | None = None) -> dict[str, str]:
    """This environment without MONARCH_* settings, with the suite's folder
    on PYTHONPATH (so ``transport_actors`` imports everywhere) ahead of this
    checkout and what the test run had there (so the children import the same
    ``monarch_core``), plus ``extra`` (a None value removes the variable)."""
    return _clients.child_env(extra, path=[HERE], drop=("MONARCH_",))


# ---------------------------------------------------------------- worker loops


@dataclass
class Worker:
    """A running ``python -m monarch_core.worker`` (maybe inside a namespace)."""

    popen: subprocess.Popen
    address: str
    host: int | None
    out: LineReader

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.out.text()

    def wait_exit(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def children(self) -> list[int]:
        """The worker loop's procs: every live process under it but its fork
        server (its child that its procs are forked from; they keep its
        command line)."""
        return [p for p in descendants(self.pid) if not (parent_of(p) == self.pid and _is_fork_server(p))]


def _is_fork_server(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip() == b"monarch-zygote"
    except OSError:
        return False


def worker_argv(address: str, host: int | None, tls: "Creds | None", ca: str | None = None,
                args: list[str] | None = None) -> list[str]:
    argv = [PY, "-m", "monarch_core.worker", "--address", address, *(args or [])]
    if tls is not None:
        argv += ["--ca", ca or tls.ca, "--cert", tls.cert, "--key", tls.key]
    if host is not None:
        # own network namespace (the host's address) and own UTS namespace (its name);
        # every step execs, so the PID we get is the worker loop's.
        argv = ["ip", "netns", "exec", f"rt-h{host}", "unshare", "--uts", "sh", "-c",
                f'hostname h{host} && exec "$@"', "sh", *argv]
    return argv


class WorkerSet:
    """Worker loops started by a test (or a module); :meth:`close` kills them
    all, with their children."""

    def __init__(self) -> None:
        self.started: list[Worker] = []

    def start(self, address: str, host: int | None = None, tls: "Creds | None" = None, ca: str | None = None,
              env: dict[str, str | None] | None = None, timeout: float = 30,
              args: list[str] | None = None) -> Worker:
        """Start a worker loop (``args``: more command-line arguments) and
        wait for its "listening" line."""
        popen = subprocess.Popen(
            worker_argv(address, host, tls, ca, args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=child_env(env),
            cwd="/",
        )
        w = Worker(popen, address, host, LineReader(popen.stdout, f"worker-{address}"))
        self.started.append(w)
        try:
            _, m = w.out.wait_for(LISTENING.match, timeout)
        except (EOFError, TimeoutError) as e:
            kill_tree(popen)
            raise AssertionError(f"worker loop {address} did not start ({e}); rc={popen.poll()}, output:\n"
                                 f"{w.output()}") from None
        assert m.group(1) == address, f"worker announced {m.group(1)}, expected {address}"
        return w

    def close(self) -> None:
        for w in self.started:
            kill_tree(w.popen)
            w.out.join(5)
        self.started.clear()


@pytest.fixture
def workers() -> Iterator[Callable[..., Worker]]:
    """``start(address, host=None, tls=None, ca=None, env=None, args=None)``: start a
    worker loop (in namespace ``rt-h<host>`` if ``host``), wait until it
    listens, return a :class:`Worker`; all are killed at teardown."""
    ws = WorkerSet()
    yield ws.start
    ws.close()


# ---------------------------------------------------------------- clients


PRELUDE = "import sys; sys.path.insert(0, {here!r})\n"


def run_client_full(code: str, env: dict[str, str | None] | None = None, timeout: float = 90) -> tuple[Any, str]:
    """Run ``code`` in a fresh interpreter (in the root namespace); return the
    JSON value of its last stdout line and its stderr.  Fails the test when
    the client fails or hangs."""
    try:
        res = subprocess.run(
            [PY, "-c", PRELUDE.format(here=str(HERE)) + textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env(env),
            cwd="/",
        )
    except subprocess.TimeoutExpired as e:
        def _s(b: Any) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        raise AssertionError(
            f"client did not finish within {timeout}s (hung?)\nstdout:\n{_s(e.stdout)[-3000:]}\n"
            f"stderr:\n{_s(e.stderr)[-6000:]}"
        ) from None
    lines = res.stdout.strip().splitlines()
    assert res.returncode == 0 and lines, (
        f"client failed (rc {res.returncode})\nstdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-6000:]}"
    )
    return json.loads(lines[-1]), res.stderr


def run_client(code: str, env: dict[str, str | None] | None = None, timeout: float = 90) -> Any:
    """:func:`run_client_full` without the stderr."""
    return run_client_full(code, env, timeout)[0]


@pytest.fixture(name="run_client")
def run_client_fixture() -> Callable[..., Any]:
    """:func:`run_client` as a fixture."""
    return run_client


class ClientProcess:
    """An interactive client: a snippet that prints JSON lines and may read
    commands from stdin."""

    def __init__(self, code: str, env: dict[str, str | None] | None = None) -> None:
        self.popen = subprocess.Popen(
            [PY, "-c", PRELUDE.format(here=str(HERE)) + textwrap.dedent(code)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env(env),
            cwd="/",
        )
        self.out = LineReader(self.popen.stdout, "client-out")
        self.err = LineReader(self.popen.stderr, "client-err")
        self._next = 0

    def _describe(self) -> str:
        return f"rc={self.popen.poll()}\nstdout:\n{self.out.text()[-3000:]}\nstderr:\n{self.err.text()[-6000:]}"

    def expect(self, key: str, timeout: float = 60) -> Any:
        """The next JSON line that is an object holding ``key``: its value."""

        def match(line: str) -> Any:
            try:
                obj = json.loads(line)
            except ValueError:
                return None
            return obj if isinstance(obj, dict) and key in obj else None

        try:
            i, obj = self.out.wait_for(match, timeout, self._next)
        except (EOFError, TimeoutError) as e:
            raise AssertionError(f"client: no {key!r} line ({e})\n{self._describe()}") from None
        self._next = i + 1
        return obj[key]

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def finish(self, timeout: float = 60) -> int:
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.popen)
            raise AssertionError(f"client did not exit within {timeout}s\n{self._describe()}") from None
        self.out.join(5)
        self.err.join(5)
        assert rc == 0, f"client failed\n{self._describe()}"
        return rc

    def kill(self) -> None:
        kill_tree(self.popen)


@pytest.fixture
def clients() -> Iterator[Callable[..., ClientProcess]]:
    started: list[ClientProcess] = []

    def start(code: str, env: dict[str, str | None] | None = None) -> ClientProcess:
        c = ClientProcess(code, env)
        started.append(c)
        return c

    yield start
    for c in started:
        if c.popen.poll() is None:
            c.kill()


# ---------------------------------------------------------------- TLS material


@dataclass
class Creds:
    """One identity: file paths and inline PEM text."""

    ca: str  # CA certificate file this side trusts
    cert: str  # certificate chain file
    key: str  # private key file
    combined: str  # private key + certificate chain in one file
    ca_pem: str
    cert_pem: str
    key_pem: str


@dataclass
class Pki:
    ca: str  # the CA every worker and good client trusts
    hosts: dict[int, Creds]  # worker certificates for h1..h3
    client: Creds  # the root namespace's client (also 127.0.0.1 / this host's name)
    other_ca: str  # an unrelated CA
    other_client: Creds  # client certificate signed by other_ca (trusting the good CA)
    other_host: dict[int, Creds]  # worker certificates signed by other_ca (trusting the good CA)
    expired_client: Creds  # signed by the good CA, expired yesterday


def _write_creds(d: Path, name: str, leaf: Any, ca_pem: bytes) -> Creds:
    ca_file = d / f"{name}-ca.pem"
    ca_file.write_bytes(ca_pem)
    cert_pem = b"".join(b.bytes() for b in leaf.cert_chain_pems)
    key_pem = leaf.private_key_pem.bytes()
    (d / f"{name}.crt").write_bytes(cert_pem)
    (d / f"{name}.key").write_bytes(key_pem)
    (d / f"{name}.pem").write_bytes(key_pem + cert_pem)
    for p in (d / f"{name}.key", d / f"{name}.pem"):
        p.chmod(0o600)
    return Creds(str(ca_file), str(d / f"{name}.crt"), str(d / f"{name}.key"), str(d / f"{name}.pem"),
                 ca_pem.decode(), cert_pem.decode(), key_pem.decode())


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A trustme CA with certificates for h1..h3 (DNS hI, IP 10.250.0.(10+I)
    and 127.0.0.1), the client (rtctl, 10.250.0.1, 127.0.0.1, ::1, localhost,
    this host's name), plus a second CA and an expired client certificate."""
    trustme = pytest.importorskip("trustme")
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA(organization_name="monarch test CA")
    other = trustme.CA(organization_name="some other CA")
    ca_pem = ca.cert_pem.bytes()
    other_pem = other.cert_pem.bytes()
    (d / "ca.pem").write_bytes(ca_pem)
    (d / "other-ca.pem").write_bytes(other_pem)
    hosts = {i: _write_creds(d, f"h{i}", ca.issue_cert(f"h{i}", host_addr(i), "127.0.0.1"), ca_pem)
             for i in range(1, NHOSTS + 1)}
    client_ids = ["rtctl", ROOT_ADDR, "127.0.0.1", "::1", "localhost", socket.gethostname()]
    client = _write_creds(d, "client", ca.issue_cert(*client_ids), ca_pem)
    other_client = _write_creds(d, "other-client", other.issue_cert(*client_ids), ca_pem)
    other_host = {i: _write_creds(d, f"other-h{i}", other.issue_cert(f"h{i}", host_addr(i), "127.0.0.1"), ca_pem)
                  for i in range(1, NHOSTS + 1)}
    now = datetime.datetime.now(datetime.timezone.utc)
    expired = ca.issue_cert(*client_ids, not_before=now - datetime.timedelta(days=10),
                            not_after=now - datetime.timedelta(days=1))
    expired_client = _write_creds(d, "expired-client", expired, ca_pem)
    return Pki(str(d / "ca.pem"), hosts, client, str(d / "other-ca.pem"), other_client, other_host,
               expired_client)


def tls_env(c: Creds, inline: bool = False) -> dict[str, str | None]:
    """MONARCH_TLS_* for identity ``c`` (file paths, or inline PEM)."""
    if inline:
        return {"MONARCH_TLS_CA": c.ca_pem, "MONARCH_TLS_CERT": c.cert_pem, "MONARCH_TLS_KEY": c.key_pem}
    return {"MONARCH_TLS_CA": c.ca, "MONARCH_TLS_CERT": c.cert, "MONARCH_TLS_KEY": c.key}


# ---------------------------------------------------------------- namespace hosts


# ---------------------------------------------------------------- (the namespace hosts: _helpers.testbed)


def free_port(host: str = "127.0.0.1") -> int:
    s = socket.socket()
    s.bind((host, 0))
    port = s.getsockname()[1]
    s.close()
    return port
