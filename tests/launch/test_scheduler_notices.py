"""Two parts of the scheduler seam: ``WorkerLaunch.report_notice`` (a
notice reaches the host mesh's owner -- ``unhandled_fault_hook`` on the
client, ``__supervise__`` in an actor -- as a ``MeshFailure`` with
``notice`` set, and fails nothing) and ``Allocation.detach`` (called instead
of ``release`` when the client ends with its host mesh stopped).

Real worker loops on this machine, started by a small scheduler through the
public contract; each client runs in its own interpreter.
"""

from __future__ import annotations

import json
from pathlib import Path

SCHEDULER = r'''
import json, os, subprocess, sys, threading
from monarch_core.hookspecs import Allocation, HostHandle, Scheduler, wait_worker_address

LOG = os.environ["NOTICE_TEST_LOG"]


def log(what):
    with open(LOG, "a") as f:
        f.write(what + "\n")


class Alloc(Allocation):
    def __init__(self, procs, hosts):
        self.procs, self.hosts, self.extent = procs, hosts, {"hosts": len(hosts)}

    def _end(self):
        for p in self.procs:
            p.kill()
            p.wait()

    def release(self):
        log("release")
        self._end()

    def detach(self):
        log("detach")
        self._end()


class Noticing(Scheduler):
    """Two worker loops here; a notice while allocating, more on request."""
    name = "noticing"

    def allocate(self, request, launch):
        self.launch = launch
        procs, hosts = [], []
        for i in range(2):
            p = subprocess.Popen(launch.command("127.0.0.1"), env=launch.environment(host="127.0.0.1"),
                                 stdout=subprocess.PIPE)
            procs.append(p)
            hosts.append(HostHandle(f"w{i}", wait_worker_address(p.stdout, 60, host=f"w{i}", forward=2)))
        launch.report_notice(None, "early notice, before the host mesh existed")
        return Alloc(procs, hosts)


def host_mesh(sched):
    from monarch_core._actor import _mesh
    from monarch_core._launch import _start
    from monarch_core._proc import _state
    from monarch_core._launch import _alloc
    from monarch_core.hookspecs import AllocationRequest
    request = AllocationRequest(name="n", params={}, source="<test>")
    _start.ensure_runtime()
    record = _alloc.allocate(sched, request, _state.current(), 90)
    return _mesh.host_mesh_of(record, "n")
'''

AT_ROOT = SCHEDULER + r'''
import time
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint

seen, got = [], threading.Event()


def hook(failure):
    seen.append({"notice": failure.notice, "report": failure.report(), "name": failure.mesh_name,
                 "ranks": failure.ranks, "mesh": type(failure.mesh).__name__})
    if len(seen) == 2:
        got.set()


class Echo(Actor):
    @endpoint
    def ping(self):
        return os.getpid()


if sys.argv[1] == "hook":
    api.unhandled_fault_hook = hook
sched = Noticing()
hm = host_mesh(sched)
pm = hm.spawn_procs()
echo = pm.spawn("echo", Echo)
echo.ping.call().get(timeout=60)
sched.launch.report_notice("w1", "w1 goes away in 60 s")
if sys.argv[1] == "hook":
    assert got.wait(30), seen
time.sleep(0.5)  # a default hook would end the client now, if a notice could
out = {"seen": seen, "after": len(echo.ping.call().get(timeout=60).values())}
hm.shutdown().get(timeout=60)
print(json.dumps(out))
'''


def _log(tmp_path: Path) -> dict[str, str]:
    return {"NOTICE_TEST_LOG": str(tmp_path / "log.txt")}


def test_a_notice_reaches_the_clients_hook_as_a_meshfailure_and_fails_nothing(client_script, tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = client_script(AT_ROOT, "hook", env=_log(tmp_path), timeout=180)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["after"] == 2
    early, late = out["seen"]
    assert early == {"notice": True, "name": "n", "ranks": ["{}"], "mesh": "HostMesh",
                     "report": "notice for host mesh 'n': early notice, before the host mesh existed"}
    assert late["notice"] and late["ranks"] == ["{'hosts': 1/2}"]
    assert late["report"] == "notice for host mesh 'n' (host w1): w1 goes away in 60 s"


def test_a_notice_nobody_handles_is_logged_and_the_client_goes_on(client_script, tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = client_script(AT_ROOT, "default", env=_log(tmp_path), timeout=180)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["after"] == 2
    assert "notice for host mesh 'n' (host w1): w1 goes away in 60 s (nobody handles it" in res.stderr


IN_ACTOR = SCHEDULER + r'''
from monarch_core.actor import Actor, endpoint, this_host


class Owner(Actor):
    """Allocates a host mesh itself: it is the mesh's owner."""

    def __init__(self):
        self.notices, self.handle = [], True

    def __supervise__(self, failure):
        self.notices.append([failure.notice, failure.report()])
        return self.handle

    @endpoint
    def allocate(self):
        self.sched = Noticing()
        self.hm = host_mesh(self.sched)
        return len(self.hm.hosts)

    @endpoint
    def notify(self, handle):
        self.handle = handle
        self.sched.launch.report_notice(None, f"notice handled={handle}")

    @endpoint
    def notices_seen(self):
        return self.notices

    @endpoint
    def done(self):
        self.hm.shutdown().get(timeout=60)
        return True


owner = this_host().spawn_procs().spawn("owner", Owner)
assert owner.allocate.call_one().get(timeout=120) == 2
import time
for handle in (True, False):
    owner.notify.call_one(handle).get(timeout=30)
deadline = time.monotonic() + 30
while len(owner.notices_seen.call_one().get(timeout=30)) < 3 and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"notices": owner.notices_seen.call_one().get(timeout=30),
                  "alive": owner.done.call_one().get(timeout=90)}))
'''


def test_a_notice_reaches_the_owning_actors_supervise_and_unhandled_it_kills_nothing(client_script, tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = client_script(IN_ACTOR, env=_log(tmp_path), timeout=180)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["notices"] == [
        [True, "notice for host mesh 'n': early notice, before the host mesh existed"],
        [True, "notice for host mesh 'n': notice handled=True"],
        [True, "notice for host mesh 'n': notice handled=False"],
    ]
    assert out["alive"] is True  # __supervise__ returned False for a notice: the owner lives on


ENDS = SCHEDULER + r'''
hm = host_mesh(Noticing())
how = sys.argv[1]
if how in ("stop", "stop-then-spawn"):
    hm.stop().get(timeout=60)
if how == "stop-then-spawn":
    hm.spawn_procs()
if how == "shutdown-after-stop":
    hm.stop().get(timeout=60)
    hm.shutdown().get(timeout=60)
print("exiting")
'''


def test_ending_with_the_host_mesh_stopped_detaches_instead_of_releasing(client_script, tmp_path) -> None:  # type: ignore[no-untyped-def]
    got = {}
    for how in ("stop", "stop-then-spawn", "shutdown-after-stop", "nothing"):
        log = tmp_path / "log.txt"
        log.unlink(missing_ok=True)
        res = client_script(ENDS, how, env=_log(tmp_path), timeout=180)
        assert res.returncode == 0, res.stderr[-4000:]
        got[how] = log.read_text().split()
    assert got == {"stop": ["detach"], "stop-then-spawn": ["release"], "shutdown-after-stop": ["release"],
                   "nothing": ["release"]}
