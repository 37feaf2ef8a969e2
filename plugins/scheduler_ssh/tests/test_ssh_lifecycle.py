"""Lifecycle over real SSH: a SIGKILLed client leaves no process on any
host; a host whose sshd is killed, or whose link is cut for longer than the
keepalive allows, fails that host's procs only (a ``MeshFailure`` naming it)
while the other host keeps working; the conformance kit
(``check_scheduler``); ProxyJump through a jump host; the progress bar only
on a terminal.  Destructive steps use h4, the testbed's spare host, and put
it back in ``finally``."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import termios
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ssh_helpers as H
from _helpers.testbed import SshTestbed
from _helpers.testbed import Testbed as _Testbed  # (a Test* name would be collected)

PRELUDE = r'''
import os, socket, threading, time
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint, hosts_from_config

failures = []
seen = threading.Event()
def hook(failure):
    failures.append(failure)
    seen.set()
api.unhandled_fault_hook = hook

class Where(Actor):
    @endpoint
    def where(self):
        return [socket.gethostname(), os.getpid()]

def up(name, per_host=1):
    global hm, pm, where
    hm = hosts_from_config(name, timeout=90)
    pm = hm.spawn_procs(per_host={"gpus": per_host})
    where = pm.spawn("where", Where)
    return where.where.call().get(timeout=120).values()

def wait_failure(timeout):
    if not seen.wait(timeout):
        return None
    time.sleep(0.5)  # a wrong extra report would come now
    return [[f.events[0]["proc"], f.report()] for f in failures]
'''


def _client(d: Path, entries: dict[str, dict[str, Any]], env: dict[str, str] | None = None, **kw: Any) -> H.Client:
    H.write_config(d, entries)
    return H.Client(PRELUDE, cwd=d, env={"MONARCH_CONFIG": str(d / "monarch.toml"), **(env or {})}, **kw)


def test_sigkilled_client_leaves_no_worker_or_proc_on_any_host(sshd: SshTestbed, tmp_path: Path) -> None:
    tag = H.new_tag()
    c = _client(tmp_path, {"lab": H.entry(tag, tmp_path, hosts=["h1", "h2", "h3"])})
    try:
        got = c.run("result = up('lab', per_host=2)")
        assert sorted(h for h, _ in got) == ["h1", "h1", "h2", "h2", "h3", "h3"]
        before = H.tagged(tag, (1, 2, 3))
        assert set(before) == {1, 2, 3} and sum(map(len, before.values())) >= 9  # 3 workers + 6 procs
        t0 = time.monotonic()
        os.kill(c.popen.pid, signal.SIGKILL)
        H.wait_tagged_gone(tag, (1, 2, 3), timeout=30)
        print(f"\nSIGKILL -> every remote worker and proc gone in {time.monotonic() - t0:.3f}s")
        c.popen.wait(30)
    finally:
        c.kill()


def _kill_sshd(i: int) -> list[int]:
    """SIGKILL every sshd of host ``i``: its listener and the sessions it forked."""
    pids = H.sshd_sessions(i, None)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return pids


def _lost_host_checks(c: H.Client, what: str) -> None:
    failures = c.run("result = wait_failure(30)")
    assert failures, f"no MeshFailure within 30s after {what}\n{c.describe()}"
    for proc, report in failures:
        assert proc.endswith("on host h4"), f"a MeshFailure names {proc!r}, not a proc of h4:\n{report}"
    table = c.run("result = hm.to_table()")
    assert "LOST" in table.split("h4", 1)[1].splitlines()[0], table
    # the other host keeps working
    assert [h for h, _ in c.run("result = where.slice(hosts=0).where.call().get(timeout=60).values()")] == ["h1"]


def test_killed_sshd_fails_only_that_hosts_procs(sshd: SshTestbed, tmp_path: Path) -> None:
    tag = H.new_tag()
    c = _client(tmp_path, {"pair": H.entry(tag, tmp_path, hosts=["h1", "h4"])})
    try:
        assert [h for h, _ in c.run("result = up('pair')")] == ["h1", "h4"]
        assert _kill_sshd(4), "no sshd running in h4"
        _lost_host_checks(c, "h4's sshd was killed")
        failures = c.run("result = [f.report() for f in failures]")
        assert any("SSH connection" in r for r in failures), failures
        H.wait_tagged_gone(tag, (4,), timeout=15)  # its worker and procs ended with the session
        c.run("hm.shutdown().get(timeout=60)")
        H.wait_tagged_gone(tag, (1, 4), timeout=15)
    finally:
        c.kill()
        sshd.restart("h4")


def test_link_cut_longer_than_the_keepalives_fails_only_that_hosts_procs(
    sshd: SshTestbed, links_up: _Testbed, tmp_path: Path
) -> None:
    tag = H.new_tag()
    c = _client(tmp_path, {"pair": H.entry(tag, tmp_path, hosts=["h1", "h4"], keepalive_interval=0.5,
                                           keepalive_count=4)},
                env={"MONARCH_DELIVERY_TIMEOUT": "3"})
    try:
        assert [h for h, _ in c.run("result = up('pair')")] == ["h1", "h4"]
        links_up.link(4, "down")
        stop = threading.Event()

        def hold_down() -> None:
            # another suite's fixture on this shared machine may put every link back up at its
            # teardown: keep h4 (ours) cut until the failure is seen
            while not stop.wait(0.2):
                if H.link_state(4) == "up":
                    links_up.link(4, "down")

        holder = threading.Thread(target=hold_down, daemon=True)
        holder.start()
        try:
            _lost_host_checks(c, "h4's link was cut")
            reports = c.run("result = [f.report() for f in failures]")
            assert any("did not answer keepalives" in r for r in reports), reports
            err = c.err.text() if c.err is not None else ""
            assert "Exception in thread" not in err and "Traceback" not in err, (
                f"a host lost by keepalives printed a traceback on the client's stderr:\n{err[-4000:]}")
            assert H.tagged(tag, (4,)), "h4's worker should still run while it is cut off"
        finally:
            stop.set()
            holder.join(10)
            links_up.link(4, "up")
        # shutdown releases: the plugin reaches h4 again and ends the worker left there
        c.run("hm.shutdown().get(timeout=90)", timeout=150)
        H.wait_tagged_gone(tag, (1, 4), timeout=30)
    finally:
        c.kill()


CONFORMANCE = r'''
import os, signal
from monarch_core._launch import _alloc
from monarch_core.hookspecs import AllocationRequest
from monarch_core.testing import check_scheduler
from monarch_scheduler_ssh._scheduler import SSHScheduler

sched = SSHScheduler()
_alloc.prepare_transport(sched, AllocationRequest("conformance", params, "<check_scheduler conformance>"))
check_scheduler(sched, params, bad_params={"hosts": []}, timeout=120, idle=idle,
                lose_host=lambda host: os.kill(int(host.labels["pid"]), signal.SIGKILL))
result = "conforms"
'''

#: the long-idle check: every timeout silence could trip, shortened (io_timeout 1 s, keepalives 1 s x 4,
#: heartbeats and delivery 4 s, here and in the workers), and QUIET s of silence: several times the largest
IDLE_SETTINGS = {"MONARCH_HEARTBEAT_INTERVAL": "1", "MONARCH_HEARTBEAT_TIMEOUT": "4", "MONARCH_DELIVERY_TIMEOUT": "4"}
QUIET = 12.0


def test_the_ssh_scheduler_passes_the_conformance_kit(sshd: SshTestbed, tmp_path: Path) -> None:
    tag = H.new_tag()
    c = H.Client("", cwd=tmp_path, env=IDLE_SETTINGS)
    try:
        params = H.entry(tag, tmp_path, hosts=["h1", "h2"], io_timeout=1, keepalive_interval=1, keepalive_count=4)
        params["env"] = {**params["env"], **IDLE_SETTINGS}
        assert c.run(f"params = {params!r}\nidle = {QUIET}\n" + CONFORMANCE, timeout=400) == "conforms"
        c.close()
        H.wait_tagged_gone(tag, (1, 2), timeout=15)
    finally:
        c.kill()


def test_proxy_jump_through_a_jump_host(sshd: SshTestbed, tmp_path: Path) -> None:
    tag = H.new_tag()
    cfg = H.ssh_config(tmp_path, tag, "Host h2-via-h1\n  HostName 10.250.0.12\n  ProxyJump h1\n")
    c = _client(tmp_path, {"jumped": H.entry(tag, tmp_path, hosts=["h2-via-h1"], ssh_config=str(cfg))})
    try:
        assert [h for h, _ in c.run("result = up('jumped')")] == ["h2"]
        host = c.run("result = [hm.hosts[0].name, dict(hm.hosts[0].labels), hm.hosts[0].address]")
        assert host[0] == "h2-via-h1" and host[1]["address"] == "10.250.0.12", host
        env = Path(f"/proc/{host[1]['pid']}/environ").read_bytes().split(b"\0")
        ssh_conn = next(v for v in env if v.startswith(b"SSH_CONNECTION="))
        assert ssh_conn.split(b"=", 1)[1].startswith(b"10.250.0.11 "), ssh_conn  # h2's sshd saw the jump host
        # not a terminal: no progress bar
        assert "starting worker loops" not in (c.err.text() if c.err else "")
        c.run("hm.shutdown().get(timeout=60)")
        H.wait_tagged_gone(tag, (1, 2), timeout=15)
    finally:
        c.kill()


def test_the_progress_bar_shows_on_a_terminal(sshd: SshTestbed, tmp_path: Path) -> None:
    pytest.importorskip("tqdm")
    tag = H.new_tag()
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal has a size
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    c = _client(tmp_path, {"tty": H.entry(tag, tmp_path, hosts=["h1", "h2"])}, stderr=slave)
    try:
        os.close(slave)
        assert sorted(h for h, _ in c.run("result = up('tty')")) == ["h1", "h2"]
        c.run("hm.shutdown().get(timeout=60)")
        c.close()
        reader.join(10)
        text = b"".join(chunks).decode(errors="replace")
        assert "ssh tty: starting worker loops" in text and "host" in text, text[-2000:]
        assert "0/2 [" in text, text[-2000:]  # tqdm's bar over the two hosts
        H.wait_tagged_gone(tag, (1, 2), timeout=15)
    finally:
        c.kill()
        os.close(master)


def test_a_users_own_ca_is_handed_to_the_workers_instead_of_session_credentials(
    sshd: SshTestbed, tmp_path: Path
) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA(organization_name="my lab CA")
    # one certificate for the client and the workers: valid for every address they listen on
    leaf = ca.issue_cert("rtctl", "10.250.0.1", "h1", "10.250.0.11", "h2", "10.250.0.12")
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem.bytes())
    (tmp_path / "me.pem").write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    (tmp_path / "me.key").write_bytes(leaf.private_key_pem.bytes())
    (tmp_path / "me.key").chmod(0o600)
    tag = H.new_tag()
    c = _client(tmp_path, {"own": H.entry(tag, tmp_path, hosts=["h1", "h2"])},
                env={"MONARCH_TLS_CA": str(tmp_path / "ca.pem"), "MONARCH_TLS_CERT": str(tmp_path / "me.pem"),
                     "MONARCH_TLS_KEY": str(tmp_path / "me.key")})
    try:
        assert [h for h, _ in c.run("result = up('own')")] == ["h1", "h2"]
        # what the procs on the hosts authenticate with (their worker loop's credentials)
        got = c.run("class Tls(Actor):\n"
                    "    @endpoint\n"
                    "    def creds(self):\n"
                    "        return [os.environ['MONARCH_TLS_CA'], os.environ['MONARCH_TLS_CERT']]\n"
                    "result = pm.spawn('tls', Tls).creds.call().get(timeout=60).values()")
        assert len(got) == 2
        for ca_pem, cert_pem in got:
            assert ca_pem.strip() == ca.cert_pem.bytes().decode().strip()  # the user's CA, inline
            assert cert_pem.strip() == (tmp_path / "me.pem").read_text().strip()
        c.run("hm.shutdown().get(timeout=60)")
        H.wait_tagged_gone(tag, (1, 2), timeout=15)
    finally:
        c.kill()
