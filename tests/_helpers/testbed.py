"""The multi-host testbed: network-namespace hosts, and the real services in
them (an OpenSSH server per host, a Slurm cluster), shared by every suite.

Made by the scripts in ``scripts/testbed/`` (plain bash, idempotent):

* ``netns-up.sh N``: host ``hI`` is namespace ``rt-hI`` at ``10.250.0.(10+I)``;
  the root namespace (this process, the clients) is ``10.250.0.1`` (``rtctl``).
* ``ssh-up.sh N``: an sshd in every host (port 22, own host key, key-only
  root login) plus one on ``127.0.0.1:2222`` (``lo``); client key,
  ``known_hosts`` and ``ssh_config`` under ``$RT_RUN/ssh``.
* ``RT_SLURM_FIRST=5 slurm-up.sh netns 3 4``: munged + slurmctld (root
  namespace) + one slurmd per host ``h5..h7`` (4 declared CPUs each);
  ``SLURM_CONF`` names its config.

The fixtures are **non-destructive**: what is already up (a developer's
testbed, another suite's) is reused and left running; what a fixture brings up
itself it takes down at the end of the session.  Tests that break things on
purpose (a cut link, a killed sshd or slurmd) put them back before they end.

Host layout: :data:`NAMESPACES` namespaces in two disjoint sets, so that the
two sets' tests run side by side (two xdist groups, see the root
``conftest.py``): ``h1..h4`` (:data:`HOSTS`) for the transport, SSH and
supervision suites — sshd on each, ``h4`` the spare a test may cut off — and
``h5..h7`` (:data:`SLURM_HOSTS`) for Slurm's nodes, which no test of the
first set cuts, freezes or scans.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from _helpers.procs import pid_running

REPO = Path(__file__).resolve().parents[2]
TESTBED = REPO / "scripts" / "testbed"
RT_RUN = Path(os.environ.get("RT_RUN", "/tmp/rt"))
NET = "10.250.0"
ROOT_ADDR = f"{NET}.1"
#: namespace hosts of the SSH/transport half of the testbed (h1..h4)
HOSTS = 4
#: Slurm nodes (h5..h7: the first is host SLURM_FIRST) and CPUs declared per node
SLURM_FIRST = 5
SLURM_NODES = 3
SLURM_CPUS = 4
#: Slurm's node names, in order
SLURM_HOSTS = tuple(f"h{i}" for i in range(SLURM_FIRST, SLURM_FIRST + SLURM_NODES))
#: every namespace host (h1..h7)
NAMESPACES = SLURM_FIRST + SLURM_NODES - 1


def host_addr(i: int) -> str:
    return f"{NET}.{10 + i}"


def _run(argv: list[str], timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def _script(name: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return _run([str(TESTBED / name), *args], timeout=timeout, env=env)


def pid_alive(name: str) -> bool:
    """Is the service ``name`` (``sshd-h2``, ``slurmd-h1``, ``slurmctld``) the
    live process a testbed script started?  (PID and start time, as lib.sh.)"""
    f = RT_RUN / "pids" / f"{name}.pid"
    try:
        pid = int(f.read_text())
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return False
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return False
    start = RT_RUN / "pids" / f"{name}.pid.start"
    return not start.exists() or start.read_text().strip() == fields[19]


def service_pids() -> set[int]:
    """PIDs of every live service the testbed scripts started."""
    out = set()
    for f in (RT_RUN / "pids").glob("*.pid"):
        if pid_alive(f.stem):
            try:
                out.add(int(f.read_text()))
            except (OSError, ValueError):
                pass
    return out


@dataclass
class Testbed:
    """The namespace hosts: cut or restore a link, list a host's processes."""

    n: int

    def link(self, i: int, state: str) -> None:
        res = _script("netns-link.sh", str(i), state, timeout=30)
        assert res.returncode == 0, f"netns-link.sh {i} {state} failed: {res.stderr}"

    def ns_pids(self, i: int) -> list[int]:
        res = _run(["ip", "netns", "pids", f"rt-h{i}"], timeout=30)
        return [int(p) for p in res.stdout.split()]

    def test_pids(self, i: int) -> list[int]:
        """Processes in host ``i`` other than the testbed's services (and their children)."""
        services = service_pids()
        keep = []
        for pid in self.ns_pids(i):
            if pid in services or _ancestor_in(pid, services):
                continue
            keep.append(pid)
        return keep


def _ancestor_in(pid: int, pids: set[int]) -> bool:
    seen = 0
    while pid > 1 and seen < 64:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid in pids:
            return True
        seen += 1
    return False


def netns_skip_reason() -> str | None:
    if sys.platform != "linux":
        return "network-namespace hosts need Linux"
    if os.geteuid() != 0:
        return "network-namespace hosts need root (ip netns, /etc/hosts); run the suite as root"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"network-namespace hosts need `{tool}` (apt-get install iproute2 util-linux)"
    return None


def _netns_up() -> bool:
    return all(Path(f"/run/netns/rt-h{i}").exists() for i in range(1, NAMESPACES + 1))


@contextlib.contextmanager
def _shared_state() -> Iterator[dict]:
    """The namespace hosts' users (pytest processes: with ``-n``, one per
    xdist worker that runs testbed tests) and whether one of them made the
    hosts, read and written under a lock: the first user sets the hosts up,
    the last one takes down what a user made."""
    RT_RUN.mkdir(parents=True, exist_ok=True)
    path = RT_RUN / "netns-users.json"
    with open(RT_RUN / "netns-users.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            state = {}
        state["users"] = [p for p in state.get("users", []) if pid_running(p)]
        yield state
        path.write_text(json.dumps(state))


@pytest.fixture(scope="session")
def netns() -> Iterator[Testbed]:
    """Hosts h1..h7 as network namespaces (reused when up, else made here and
    removed at the end of the session: when the last pytest process using
    them ends); ``Testbed.n`` is the SSH/transport half's count (h1..h4)."""
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    tb = Testbed(HOSTS)
    with _shared_state() as state:
        first = not state["users"]
        if first:
            state["made"] = not _netns_up()
            res = _script("netns-up.sh", str(NAMESPACES), timeout=60)
            if res.returncode != 0:
                pytest.fail(f"netns-up.sh {NAMESPACES} failed (rc {res.returncode}):\n{res.stdout}\n{res.stderr}")
            assert res.stdout.split() == [x for i in range(1, NAMESPACES + 1) for x in (f"rt-h{i}", host_addr(i))]
            for i in range(1, HOSTS + 1):  # a link an interrupted run left down
                tb.link(i, "up")
        state["users"].append(os.getpid())
    try:
        yield tb
    finally:
        with _shared_state() as state:
            state["users"] = [p for p in state["users"] if p != os.getpid()]
            if not state["users"] and _netns_up():  # (someone may have taken them down already)
                for i in range(1, HOSTS + 1):
                    tb.link(i, "up")
                if state.pop("made", False):
                    leftovers = {f"rt-h{i}": tb.test_pids(i) for i in range(1, NAMESPACES + 1)}
                    leftovers = {k: v for k, v in leftovers.items() if v}
                    if leftovers:  # every test kills what it started: a bug of the suite or of the library
                        warnings.warn(f"processes left in the namespace hosts (killed now): {leftovers}", stacklevel=1)
                    down = _script("netns-down.sh", "--kill", timeout=60)
                    assert down.returncode == 0, f"netns-down.sh failed: {down.stderr}"


@pytest.fixture
def links_up(netns: Testbed) -> Iterator[Testbed]:
    """The testbed, with every link put back up after the test."""
    yield netns
    for i in range(1, netns.n + 1):
        netns.link(i, "up")


# ---------------------------------------------------------------- sshd


@dataclass(frozen=True)
class SshTestbed:
    """An sshd in every namespace host (``h1..h4``, port 22) and one on
    ``127.0.0.1:2222`` (``lo``); ``key`` is authorized for root on all of them,
    ``known_hosts`` holds every host key, ``config`` is an ``ssh_config`` with
    ``Host h1`` ... aliases."""

    dir: Path
    key: Path
    known_hosts: Path
    config: Path
    hosts: int

    def restart(self, name: str) -> None:
        """Start the sshd of host ``name`` again (after a test killed it)."""
        res = _script("ssh-up.sh", str(self.hosts), timeout=120)
        assert res.returncode == 0, f"ssh-up.sh failed: {res.stderr[-2000:]}"


def _ssh_names(n: int) -> list[str]:
    return ["lo", *(f"h{i}" for i in range(1, n + 1))]


@pytest.fixture(scope="session")
def sshd(netns: Testbed) -> Iterator[SshTestbed]:
    """Real OpenSSH servers in the namespace hosts (reused when running)."""
    if shutil.which("sshd") is None and not Path("/usr/sbin/sshd").exists() and os.geteuid() != 0:
        pytest.skip("no OpenSSH server (apt-get install openssh-server), and not root to install it")
    mine = not all(pid_alive(f"sshd-{n}") for n in _ssh_names(HOSTS))
    res = _script("ssh-up.sh", str(HOSTS), timeout=300)
    if res.returncode != 0:
        pytest.fail(f"ssh-up.sh {HOSTS} failed (rc {res.returncode}):\n{res.stderr[-3000:]}")
    d = RT_RUN / "ssh"
    try:
        yield SshTestbed(d, d / "id_ed25519", d / "known_hosts", d / "ssh_config", HOSTS)
    finally:
        if mine:
            _script("ssh-down.sh", timeout=60)


# ---------------------------------------------------------------- slurm


@dataclass(frozen=True)
class SlurmTestbed:
    """A real Slurm 22.05 cluster: slurmctld in the root namespace, one slurmd
    in each of :data:`SLURM_HOSTS` (partition ``debug``, ``cpus`` each).  Its
    config is ``conf`` (also in ``SLURM_CONF`` for the session)."""

    conf: Path
    nodes: int
    cpus: int

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def restart(self) -> None:
        """Start any daemon a test killed (slurmd of a node) again and wait for idle nodes."""
        res = _slurm_up(timeout=120)
        assert res.returncode == 0, f"slurm-up.sh failed: {res.stderr[-2000:]}"


def _slurm_up(timeout: float) -> subprocess.CompletedProcess:
    return _script("slurm-up.sh", "netns", str(SLURM_NODES), str(SLURM_CPUS), timeout=timeout,
                   env={**os.environ, "RT_SLURM_FIRST": str(SLURM_FIRST)})


@pytest.fixture(scope="session")
def slurm(netns: Testbed) -> Iterator[SlurmTestbed]:
    """The Slurm cluster on h5..h7 (reused when running, else started here)."""
    if shutil.which("slurmctld") is None and os.geteuid() != 0:
        pytest.skip("no Slurm (apt-get install slurm-wlm munge), and not root to install it")
    names = ["munged", "slurmctld", *(f"slurmd-{h}" for h in SLURM_HOSTS)]
    mine = not all(pid_alive(n) for n in names)
    res = _slurm_up(timeout=300)
    if res.returncode != 0:
        pytest.fail(f"slurm-up.sh failed (rc {res.returncode}):\n{res.stderr[-3000:]}")
    conf = RT_RUN / "slurm" / "slurm.conf"
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        yield SlurmTestbed(conf, SLURM_NODES, SLURM_CPUS)
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old
        if mine:
            _script("slurm-down.sh", timeout=120)
