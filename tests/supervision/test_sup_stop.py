"""Stop and shutdown: recursive stop, ``__cleanup__``, ProcMesh.stop,
HostMesh.stop vs shutdown, only the owner may stop, shutdown_context
idempotent, a stop is not a failure, undeliverable messages go back to their
sender."""

from __future__ import annotations

import os
import signal

import pytest

from monarch_core.actor import Actor, Channel, endpoint, this_host, this_proc
from monarch_core.errors import SupervisionError

from _helpers import T, fresh
from _helpers.config import configured_host_mesh
from _helpers.faults import join_hook_threads
from _helpers.procs import kill_pids, pid_gone, wait_pids_gone


class Fatal(BaseException):
    pass


class Leaf(Actor):
    def __init__(self, notes=None) -> None:
        self.notes = notes

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def ok(self) -> str:
        return "leaf"

    def __cleanup__(self, exc) -> None:
        if self.notes is not None:
            self.notes.send(("leaf-cleanup", os.getpid(), repr(exc)))


class Spawner(Actor):
    """Spawns procs (grandchildren of the client) and actors on them, and an
    actor on its own proc."""

    def __init__(self, notes) -> None:
        self.notes = notes
        self.owned = []

    @endpoint
    async def build(self, tag: str) -> list:
        pm = this_host().spawn_procs(per_host={"g": 2})
        leaves = pm.spawn(f"leaves_{tag}", Leaf, self.notes)
        local = this_proc().spawn(f"local_{tag}", Leaf, self.notes)
        self.owned = [pm, leaves, local]
        pids = (await leaves.pid.call()).values()
        assert await local.ok.call_one() == "leaf"
        return list(pids)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def crash(self) -> None:
        raise Fatal("spawner crashed")

    def __cleanup__(self, exc) -> None:
        self.notes.send(("spawner-cleanup", os.getpid(), repr(exc)))


class Cleaner(Actor):
    def __init__(self, path: str) -> None:
        self.path = path

    @endpoint
    def ok(self) -> int:
        return 1

    @endpoint
    def crash(self, msg: str) -> None:
        raise Fatal(msg)

    def __cleanup__(self, exc) -> None:
        from monarch_core.actor import current_rank

        with open(f"{self.path}.{current_rank().rank}", "w") as f:
            f.write(repr(exc))


class Echo(Actor):
    @endpoint
    def echo(self, obj):
        return obj


# ====================================================================== recursive stop + __cleanup__


def _drain(notes, n: int) -> list:
    return [notes.recv().get(timeout=T) for _ in range(n)]


def test_stopping_an_actor_mesh_stops_everything_it_owns(procs, faults) -> None:
    notes_port, notes = Channel.open()
    name = fresh("spawner")
    spawner = procs.slice(gpus=0).spawn(name, Spawner, notes_port)
    grandchildren = spawner.build.call_one("stop").get(timeout=60)
    assert len(grandchildren) == 2 and all(not pid_gone(p) for p in grandchildren)

    spawner.stop().get(timeout=60)
    try:
        # stop is deterministic: once it completed, the whole subtree is gone
        still = [p for p in grandchildren if not pid_gone(p)]
        assert still == [], f"grandchildren still running after stop() completed: {still}"
    finally:
        kill_pids(wait_pids_gone(grandchildren, 5.0))
    got = _drain(notes, 4)  # 2 remote leaves, 1 local leaf, the spawner
    kinds = sorted(k for k, _pid, _exc in got)
    assert kinds == ["leaf-cleanup", "leaf-cleanup", "leaf-cleanup", "spawner-cleanup"]
    assert all(exc == "None" for _k, _p, exc in got)
    # stopped is not failed: nothing reached the client's hook
    join_hook_threads()
    assert faults.for_mesh(name) == []
    exc = spawner.pid.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"


def test_a_failed_actor_stops_what_it_owns(procs, faults) -> None:
    notes_port, notes = Channel.open()
    name = fresh("spawner_fails")
    spawner = procs.spawn(name, Spawner, notes_port).slice(gpus=1)
    grandchildren = spawner.build.call_one("fail").get(timeout=60)
    spawner.crash.broadcast()
    faults.wait_mesh(name)
    try:
        assert wait_pids_gone(grandchildren, 5.0) == []
    finally:
        kill_pids(grandchildren)
    got = _drain(notes, 4)
    spawner_note = [n for n in got if n[0] == "spawner-cleanup"]
    assert len(spawner_note) == 1
    assert "spawner crashed" in spawner_note[0][2]  # __cleanup__(exc) got the cause


def test_stopping_an_actor_right_after_it_failed_still_cleans_up(procs, faults) -> None:
    """The owner stops a mesh whose actor has just failed (while the actor is
    still stopping what it owns): once stop() completes, the subtree is gone
    and the actor's __cleanup__(exc) has run."""
    notes_port, notes = Channel.open()
    name = fresh("spawner_fail_stop")
    spawner = procs.slice(gpus=1).spawn(name, Spawner, notes_port)
    grandchildren = spawner.build.call_one("failstop").get(timeout=60)
    spawner.crash.broadcast()
    faults.wait_mesh(name)
    spawner.stop().get(timeout=60)
    try:
        still = [p for p in grandchildren if not pid_gone(p)]
        assert still == [], f"grandchildren still running after stop() completed: {still}"
    finally:
        kill_pids(wait_pids_gone(grandchildren, 5.0))
    got = _drain(notes, 4)
    spawner_note = [n for n in got if n[0] == "spawner-cleanup"]
    assert len(spawner_note) == 1, got
    assert "spawner crashed" in spawner_note[0][2]


def test_an_actor_whose_proc_is_killed_leaves_no_grandchildren(faults) -> None:
    notes_port, _notes = Channel.open()
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        name = fresh("spawner_killed")
        spawner = pm.spawn(name, Spawner, notes_port)
        grandchildren = spawner.build.call_one("killed").get(timeout=60)
        os.kill(spawner.pid.call_one().get(timeout=T), signal.SIGKILL)
        f = faults.wait_mesh(name)[0]
        assert "SIGKILL" in str(f)
        try:
            assert wait_pids_gone(grandchildren, 5.0) == []
        finally:
            kill_pids(grandchildren)
    finally:
        pm.stop().get(timeout=30)


def test_cleanup_runs_on_stop_with_none(procs, tmp_path, faults) -> None:
    name = fresh("cleaner")
    path = tmp_path / "cleanup"
    mesh = procs.spawn(name, Cleaner, str(path))
    assert mesh.ok.call().get(timeout=T).values() == [1, 1]
    mesh.stop().get(timeout=T)
    assert (tmp_path / "cleanup.0").read_text() == "None"
    assert (tmp_path / "cleanup.1").read_text() == "None"
    # calls to a stopped mesh fail; the stop is not a failure
    exc = mesh.ok.call().exception(timeout=T)
    assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
    assert "stopped" in str(exc)
    join_hook_threads()
    assert faults.for_mesh(name) == []


def test_stop_is_idempotent(procs, faults) -> None:
    name = fresh("twice")
    mesh = procs.spawn(name, PidActor)
    assert len(mesh.pid.call().get(timeout=T).values()) == 2
    first = mesh.stop().get(timeout=T)
    second = mesh.stop().get(timeout=T)  # resolves too, to the same, and raises nothing
    assert second == first
    # the mesh is stopped (calls fail saying so), the procs it ran on are not
    exc = mesh.pid.call().exception(timeout=T)
    assert type(exc) is SupervisionError and "stopped" in str(exc), f"got {type(exc).__name__}: {exc}"
    assert len(procs.spawn(fresh("after_twice"), PidActor).pid.call().get(timeout=T).values()) == 2
    # neither stop is a failure
    join_hook_threads()
    assert faults.for_mesh(name) == []


# ====================================================================== ProcMesh / HostMesh


class PidActor(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_proc_mesh_stop_ends_the_procs_without_a_failure(faults, tmp_path) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    name = fresh("on_stopped_procs")
    mesh = pm.spawn(name, PidActor)
    cleaners = pm.spawn(fresh("cleaners_on_stopped_procs"), Cleaner, str(tmp_path / "pmstop"))
    assert cleaners.ok.call().get(timeout=30).values() == [1, 1]
    pids = mesh.pid.call().get(timeout=30).values()
    pm.stop().get(timeout=30)
    # __cleanup__ ran on every actor of the stopped procs
    assert (tmp_path / "pmstop.0").read_text() == "None"
    assert (tmp_path / "pmstop.1").read_text() == "None"
    try:
        assert wait_pids_gone(pids, 5.0) == []
    finally:
        kill_pids(pids)
    exc = mesh.pid.call().exception(timeout=T)
    assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
    with pytest.raises(RuntimeError):
        pm.spawn(fresh("after_stop"), PidActor)
    pm.stop().get(timeout=T)  # again: no-op
    join_hook_threads()
    assert faults.for_mesh(name) == []


def test_host_mesh_stop_keeps_the_hosts_usable(faults) -> None:
    hm = this_host()
    pm = hm.spawn_procs(per_host={"gpus": 1})
    pids = pm.spawn(fresh("hm_stop"), PidActor).pid.call().get(timeout=30).values()
    hm.stop().get(timeout=30)
    try:
        assert wait_pids_gone(pids, 5.0) == []
    finally:
        kill_pids(pids)
    pm2 = hm.spawn_procs(per_host={"gpus": 1})
    pids2 = pm2.spawn(fresh("hm_again"), PidActor).pid.call().get(timeout=30).values()
    assert pids2 != pids
    hm.shutdown().get(timeout=30)
    try:
        assert wait_pids_gone(pids2, 5.0) == []
    finally:
        kill_pids(pids2)
    with pytest.raises(RuntimeError):
        hm.spawn_procs(per_host={"gpus": 1})


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    hm = configured_host_mesh(tmp_path_factory.mktemp("sup_cfg"), "two", hosts=2)
    yield hm
    hm.shutdown().get(timeout=60)


def test_configured_host_mesh_shutdown_then_spawn_raises(configured_hosts) -> None:
    hm = configured_hosts("two", hosts=2)
    pm = hm.spawn_procs()
    pids = pm.spawn(fresh("cfg_hm"), PidActor).pid.call().get(timeout=30).values()
    assert len(pids) == 2
    hm.shutdown().get(timeout=30)
    try:
        assert wait_pids_gone(pids, 5.0) == []
    finally:
        kill_pids(pids)
    with pytest.raises(RuntimeError):
        hm.spawn_procs()
    with pytest.raises(RuntimeError):
        hm.slice(hosts=0).spawn_procs()


# ====================================================================== only the owner


OWNER_MSG = "(?i)only the owner can"


def test_sliced_meshes_cannot_be_stopped(procs, two_hosts) -> None:
    mesh = procs.spawn(fresh("sliced"), PidActor)
    with pytest.raises(RuntimeError, match=OWNER_MSG):
        mesh.slice(gpus=0).stop()
    with pytest.raises(RuntimeError, match=OWNER_MSG):
        mesh.slice(gpus=slice(0, 2)).stop()
    with pytest.raises(RuntimeError, match=OWNER_MSG):
        procs.slice(gpus=1).stop()
    with pytest.raises(RuntimeError, match=OWNER_MSG):
        two_hosts.slice(hosts=0).stop()
    with pytest.raises(RuntimeError, match=OWNER_MSG):
        two_hosts.slice(hosts=1).shutdown()
    # the owner still works, and nothing was stopped
    assert len(mesh.pid.call().get(timeout=T).values()) == 2


def test_received_meshes_cannot_be_stopped(procs, two_hosts) -> None:
    mesh = procs.spawn(fresh("received"), PidActor)
    echo = procs.spawn(fresh("echo"), Echo).slice(gpus=1)
    back_actor = echo.echo.call_one(mesh).get(timeout=T)
    back_procs = echo.echo.call_one(procs).get(timeout=T)
    back_hosts = echo.echo.call_one(two_hosts).get(timeout=T)
    with pytest.raises(RuntimeError, match=OWNER_MSG):
        back_actor.stop()
    with pytest.raises(RuntimeError, match=OWNER_MSG):
        back_procs.stop()
    with pytest.raises(RuntimeError, match=OWNER_MSG):
        back_hosts.stop()
    with pytest.raises(RuntimeError, match=OWNER_MSG):
        back_hosts.shutdown()
    # the received reference still works for calls
    assert back_actor.pid.call().get(timeout=T).values() == mesh.pid.call().get(timeout=T).values()


class Stopper(Actor):
    @endpoint
    def try_stop(self, mesh) -> str:
        try:
            mesh.stop()
        except RuntimeError as e:
            return f"RuntimeError: {e}"
        return "stopped it"


def test_an_actor_cannot_stop_a_mesh_it_was_given(procs) -> None:
    mesh = procs.spawn(fresh("given"), PidActor)
    stopper = procs.spawn(fresh("stopper"), Stopper).slice(gpus=0)
    res = stopper.try_stop.call_one(mesh).get(timeout=T)
    assert res.startswith("RuntimeError") and "only the owner can" in res.lower(), res
    assert len(mesh.pid.call().get(timeout=T).values()) == 2


# ====================================================================== shutdown_context

SHUTDOWN_CLIENT = """
import json, os
from monarch_core.actor import Actor, Future, endpoint, shutdown_context, this_host

class P(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

pm = this_host().spawn_procs(per_host={"gpus": 2})
pids = pm.spawn("p", P).pid.call().get(timeout=30).values()
print("PIDS " + json.dumps(pids), flush=True)
f1 = shutdown_context()
assert isinstance(f1, Future)
f1.get(timeout=30)
gone = [not os.path.exists("/proc/%d" % p) or open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()[0] == "Z"
        for p in pids]
print("GONE_AFTER_FIRST " + json.dumps(gone), flush=True)
shutdown_context().get(timeout=30)
shutdown_context().get(timeout=30)
try:
    this_host().spawn_procs(per_host={"gpus": 1})
    print("SPAWN_AFTER ok", flush=True)
except RuntimeError as e:
    print("SPAWN_AFTER RuntimeError", flush=True)
print("DONE", flush=True)
"""


def test_shutdown_context_is_idempotent(client_script) -> None:
    r = client_script(SHUTDOWN_CLIENT)
    out = dict(ln.split(" ", 1) for ln in r.stdout.splitlines() if " " in ln)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "DONE" in r.stdout
    import json

    pids = json.loads(out["PIDS"])
    try:
        assert json.loads(out["GONE_AFTER_FIRST"]) == [True, True]
        assert out["SPAWN_AFTER"] == "RuntimeError"
    finally:
        kill_pids(wait_pids_gone(pids, 5.0))


# ====================================================================== undeliverable messages


class Target(Actor):
    @endpoint
    def poke(self) -> None:
        pass

    @endpoint
    def ok(self) -> str:
        return "target"


class Broadcaster(Actor):
    @endpoint
    def poke_all(self, target) -> str:
        target.poke.broadcast()
        return "sent"

    @endpoint
    def ok(self) -> str:
        return "broadcaster-alive"


class PoliteBroadcaster(Broadcaster):
    def __init__(self, notes) -> None:
        self.notes = notes

    def _handle_undeliverable_message(self, msg) -> bool:
        self.notes.send(str(msg))
        return True


class RefusingBroadcaster(Broadcaster):
    def __init__(self, notes) -> None:
        self.notes = notes

    def _handle_undeliverable_message(self, msg) -> bool:
        self.notes.send(str(msg))
        return False


def _stopped_target(procs):
    name = fresh("stopped_target")
    target = procs.spawn(name, Target)
    assert target.ok.call().get(timeout=T).values() == ["target", "target"]
    target.stop().get(timeout=T)
    return target, name


def test_broadcast_to_a_stopped_mesh_fails_the_sender(procs, faults) -> None:
    target, tname = _stopped_target(procs)
    bname = fresh("broadcaster")
    b = procs.spawn(bname, Broadcaster).slice(gpus=0)
    assert b.poke_all.call_one(target).get(timeout=T) == "sent"
    failure = faults.wait_mesh(bname)[0]
    text = str(failure)
    assert "deliver" in text  # "could not be delivered"
    assert "system" in text and failure.category == "system"
    assert "Broadcaster" in text
    exc = b.ok.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
    assert faults.for_mesh(tname) == []


def test_undeliverable_handler_returning_true_keeps_the_sender_alive(procs, faults) -> None:
    target, _tname = _stopped_target(procs)
    notes_port, notes = Channel.open()
    bname = fresh("polite")
    b = procs.spawn(bname, PoliteBroadcaster, notes_port).slice(gpus=1)
    assert b.poke_all.call_one(target).get(timeout=T) == "sent"
    first = notes.recv().get(timeout=T)
    assert "poke" in first or "stopped" in first, first
    notes.recv().get(timeout=T)  # one per rank of the target
    assert b.ok.call_one().get(timeout=T) == "broadcaster-alive"
    join_hook_threads()
    assert faults.for_mesh(bname) == []


def test_undeliverable_handler_returning_false_fails_the_sender(procs, faults) -> None:
    target, _tname = _stopped_target(procs)
    notes_port, notes = Channel.open()
    bname = fresh("refusing")
    b = procs.spawn(bname, RefusingBroadcaster, notes_port).slice(gpus=0)
    assert b.poke_all.call_one(target).get(timeout=T) == "sent"
    notes.recv().get(timeout=T)
    failure = faults.wait_mesh(bname)[0]
    assert failure.category == "system"
    exc = b.ok.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError


def test_client_broadcast_to_a_stopped_mesh_comes_back_to_the_client(procs, faults) -> None:
    target, tname = _stopped_target(procs)
    target.poke.broadcast()
    f = faults.wait_for(lambda f: tname in str(f) and "deliver" in str(f), what="the undeliverable broadcast")
    assert f.category == "system"
