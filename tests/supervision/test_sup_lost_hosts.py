"""Lost and frozen hosts, over real SSH in the testbed's namespace hosts.

* A host cut off for longer than its worker loop's delivery timeout: the
  worker loop (no heartbeat from its client) ends itself and its procs while
  the link is still down, and the client, which declared the host lost, never
  starts a proc there again (the spawn fails naming the host and why).
* A frozen host (worker loop and procs SIGSTOPped; sshd still answers the
  keepalives): the client's heartbeat of the worker loop declares it lost
  within ``MONARCH_HOST_HEARTBEAT_TIMEOUT``, and the report of an idle proc
  there says "host lost", not that its process died.
* A worker loop stopped and continued for longer than its procs' heartbeat
  timeout blames none of them: no proc is killed as hung.

Every destructive step uses h4, the testbed's spare host, and is undone in
``finally``.  Durations are shortened through settings (in the client's
environment, and in the worker's through the entry's ``env``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "plugins" / "scheduler_ssh" / "tests"))
import ssh_helpers as H  # noqa: E402 - the SSH suite's helpers (tagged processes, the client)

from _helpers.procs import pid_running, wait_pids_gone  # noqa: E402
from _helpers.testbed import SshTestbed, links_up, netns, sshd  # noqa: E402,F401 - fixtures
from _helpers.testbed import Testbed as _Testbed  # noqa: E402 - (a Test* name would be collected)

pytest.importorskip("paramiko", reason="the ssh scheduler needs paramiko (pip install ./plugins/scheduler_ssh)")

PRELUDE = r'''
import os, socket, threading, time
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint, hosts_from_config

failures = []
def hook(failure):
    failures.append(failure)
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

def wait_failures(n, timeout):
    deadline = time.monotonic() + timeout
    while len(failures) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a wrong extra report would come now
    return [[f.events[0]["proc"], f.events[0]["cause"], f.report()] for f in failures]
'''


def _installed() -> bool:
    from importlib import metadata

    return any(ep.name == "scheduler_ssh" for ep in metadata.entry_points(group="monarch"))


@pytest.fixture(autouse=True)
def _ssh_plugin_installed() -> None:
    if not _installed():
        pytest.skip("monarch-scheduler-ssh is not installed (pip install -e plugins/scheduler_ssh)")


def _client(d: Path, tag: str, worker_env: dict[str, str], client_env: dict[str, str], **params: Any) -> H.Client:
    entry = H.entry(tag, d, hosts=["h4"], **params)
    entry["env"] = {**entry["env"], **worker_env}
    H.write_config(d, {"spare": entry})
    return H.Client(PRELUDE, cwd=d, env={"MONARCH_CONFIG": str(d / "monarch.toml"), **client_env})


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


@pytest.fixture
def h4_cut(links_up: _Testbed) -> Iterator[Any]:
    """Cut h4's link (kept cut: another suite's teardown on this shared
    machine may put every link back up) until the test says ``restore()``."""
    stop = threading.Event()
    holder: list[threading.Thread] = []

    def cut() -> None:
        links_up.link(4, "down")

        def hold_down() -> None:
            while not stop.wait(0.2):
                if H.link_state(4) == "up":
                    links_up.link(4, "down")

        t = threading.Thread(target=hold_down, daemon=True)
        t.start()
        holder.append(t)

    def restore() -> None:
        stop.set()
        for t in holder:
            t.join(10)
        links_up.link(4, "up")

    cut.restore = restore  # type: ignore[attr-defined]
    try:
        yield cut
    finally:
        restore()


def test_partitioned_host_ends_its_worker_and_procs_and_is_never_reused(
    sshd: SshTestbed, h4_cut: Any, tmp_path: Path
) -> None:
    tag = H.new_tag()
    c = _client(
        tmp_path, tag,
        worker_env={"MONARCH_DELIVERY_TIMEOUT": "4", "MONARCH_HEARTBEAT_INTERVAL": "0.5"},
        client_env={"MONARCH_HEARTBEAT_INTERVAL": "0.5"},
        keepalive_interval=0.5, keepalive_count=4,
    )
    try:
        got = c.run("result = up('spare', per_host=2)")
        assert [h for h, _ in got] == ["h4", "h4"], got
        worker = int(c.run("result = hm.hosts[0].labels['pid']"))
        pids = [worker] + [p for _, p in got]
        assert all(pid_running(p) for p in pids)
        h4_cut()
        failures = c.run("result = wait_failures(2, 40)", timeout=90)
        assert len(failures) == 2, f"the procs of the cut host were not failed\n{c.describe()}"
        # still cut off: the worker loop (no heartbeat from its client for more than its
        # MONARCH_DELIVERY_TIMEOUT of 4 s) ends itself and its procs, on its own
        left = wait_pids_gone(pids, 40)
        assert not left, f"still running on h4 while it is cut off: {left} (worker pid {worker})"
        for proc, cause, report in failures:
            assert proc.endswith("on host h4"), report
            assert cause.startswith("host lost: h4: "), report
            assert "its process died" not in report, report
        h4_cut.restore()
        # the client does not reuse the host it declared lost
        res = c.request("pm2 = hm.spawn_procs(per_host={'gpus': 1}); pm2.initialized.get(timeout=30)", timeout=60)
        assert "error" in res, f"a spawn on the lost host h4 succeeded: {res}"
        assert "h4" in res["message"] and "lost" in res["message"], res["message"]
        assert "did not answer keepalives" in res["message"], res["message"]  # why it was lost
        c.run("hm.shutdown().get(timeout=60)", timeout=120)
        H.wait_tagged_gone(tag, (4,), timeout=30)
    finally:
        c.kill()


def test_frozen_host_is_reported_lost_and_its_idle_procs_say_so(sshd: SshTestbed, tmp_path: Path) -> None:
    tag = H.new_tag()
    c = _client(
        tmp_path, tag,
        worker_env={"MONARCH_DELIVERY_TIMEOUT": "4", "MONARCH_HEARTBEAT_INTERVAL": "0.5"},
        client_env={"MONARCH_HEARTBEAT_INTERVAL": "0.5", "MONARCH_HOST_HEARTBEAT_TIMEOUT": "3"},
    )
    stopped: list[int] = []
    try:
        got = c.run("result = up('spare', per_host=2)")
        assert [h for h, _ in got] == ["h4", "h4"], got
        worker = int(c.run("result = hm.hosts[0].labels['pid']"))
        stopped = [worker] + [p for _, p in got]
        _signal(stopped, signal.SIGSTOP)  # sshd keeps answering the keepalives
        failures = c.run("result = wait_failures(2, 30)", timeout=90)
        assert len(failures) == 2, f"the frozen host's idle procs were not failed\n{c.describe()}"
        for proc, cause, report in failures:
            assert proc.endswith("on host h4"), report
            assert cause.startswith("host lost: h4: its worker loop at "), report
            assert "answered no heartbeat" in cause and "MONARCH_HOST_HEARTBEAT_TIMEOUT" in cause, report
            assert "its process died" not in report, report
        table = c.run("result = hm.to_table()")
        assert "LOST (its worker loop" in table.split("h4", 1)[1].splitlines()[0], table
        _signal(stopped, signal.SIGCONT)
        # the continued worker loop hears no more heartbeats from the client that gave it
        # up: it ends itself and its procs
        left = wait_pids_gone(stopped, 40)
        assert not left, f"still running on h4 after the client gave it up: {left} (worker pid {worker})"
        c.run("hm.shutdown().get(timeout=60)", timeout=120)
        H.wait_tagged_gone(tag, (4,), timeout=30)
    finally:
        _signal(stopped, signal.SIGCONT)
        c.kill()


def test_worker_stopped_longer_than_the_heartbeat_timeout_kills_no_proc_as_hung(
    sshd: SshTestbed, tmp_path: Path
) -> None:
    tag = H.new_tag()
    c = _client(
        tmp_path, tag,
        worker_env={"MONARCH_HEARTBEAT_INTERVAL": "0.5", "MONARCH_HEARTBEAT_TIMEOUT": "2"},
        client_env={"MONARCH_HEARTBEAT_INTERVAL": "0.5", "MONARCH_HOST_HEARTBEAT_TIMEOUT": "120"},
    )
    worker = 0
    try:
        got = c.run("result = up('spare', per_host=2)")
        procs = sorted(p for _, p in got)
        worker = int(c.run("result = hm.hosts[0].labels['pid']"))
        os.kill(worker, signal.SIGSTOP)  # the worker loop alone: its procs keep answering
        time.sleep(6)  # three times its procs' heartbeat timeout
        os.kill(worker, signal.SIGCONT)
        time.sleep(5)  # the heartbeats after it: a proc blamed for the stop would be killed now
        assert all(pid_running(p) for p in procs), f"a proc was killed after its worker loop was stopped\n{c.describe()}"
        again = c.run("result = where.where.call().get(timeout=60).values()")
        assert sorted(p for _, p in again) == procs, again
        assert c.run("result = [f.report() for f in failures]") == []
        c.run("hm.shutdown().get(timeout=60)", timeout=120)
        H.wait_tagged_gone(tag, (4,), timeout=30)
    finally:
        if worker:
            _signal([worker], signal.SIGCONT)
        c.kill()


def test_a_client_stopped_longer_than_the_host_heartbeat_timeout_loses_no_host(
    sshd: SshTestbed, tmp_path: Path
) -> None:
    tag = H.new_tag()
    c = _client(
        tmp_path, tag,
        worker_env={"MONARCH_HEARTBEAT_INTERVAL": "0.5"},
        client_env={"MONARCH_HEARTBEAT_INTERVAL": "0.5", "MONARCH_HOST_HEARTBEAT_TIMEOUT": "2"},
    )
    try:
        got = c.run("result = up('spare')")
        os.kill(c.popen.pid, signal.SIGSTOP)  # the client: the silence it sees on resuming is its own
        try:
            time.sleep(6)
        finally:
            os.kill(c.popen.pid, signal.SIGCONT)
        time.sleep(4)  # two host heartbeat timeouts after resuming: the host answers again
        assert c.run("result = [f.report() for f in failures]") == []
        assert "LOST" not in c.run("result = hm.to_table()")
        assert c.run("result = where.where.call().get(timeout=60).values()") == got
        c.run("hm.shutdown().get(timeout=60)", timeout=120)
        H.wait_tagged_gone(tag, (4,), timeout=30)
    finally:
        c.kill()
