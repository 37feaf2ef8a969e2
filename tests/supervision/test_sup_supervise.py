"""MeshFailure delivered to the owner's ``__supervise__``; the root's
``unhandled_fault_hook``; each failed rank reported at most once."""

from __future__ import annotations

import os
import signal

import pytest

import monarch_core.actor as mactor
from monarch_core.actor import Actor, Channel, MeshFailure, endpoint, this_host, this_proc
from monarch_core.errors import SupervisionError

from _helpers import T, fresh
from _helpers.faults import join_hook_threads


class Fatal(BaseException):
    pass


class Child(Actor):
    @endpoint
    def ok(self) -> str:
        return "child-ok"

    @endpoint
    def die(self, msg: str) -> None:
        raise Fatal(msg)


def _describe_failure(failure) -> dict:
    """What a ``__supervise__`` saw, in picklable form."""
    out = {
        "is_mesh_failure": isinstance(failure, MeshFailure),
        "mesh_name": failure.mesh_name,
        "str": str(failure),
        "report": failure.report(),
        "mesh_repr": repr(failure.mesh),
    }
    try:
        failure.mesh.stop()
        out["stop"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["stop"] = f"{type(e).__name__}: {e}"
    return out


class Parent(Actor):
    """Owns a Child mesh; ``mode`` says what ``__supervise__`` does."""

    def __init__(self, mode: str, notes) -> None:
        self.mode = mode
        self.notes = notes
        self.child = None

    @endpoint
    def spawn_child(self, name: str) -> None:
        self.child = this_proc().spawn(name, Child)

    @endpoint
    async def child_ok(self) -> str:
        return await self.child.ok.call_one()

    @endpoint
    def kill_child(self, msg: str) -> None:
        self.child.die.broadcast(msg)

    @endpoint
    async def call_child_after_failure(self) -> str:
        try:
            await self.child.ok.call_one()
        except SupervisionError as e:
            return f"SupervisionError: {e}"
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        return "no error"

    @endpoint
    def ping(self) -> str:
        return "parent-alive"

    def __supervise__(self, failure):
        self.notes.send(_describe_failure(failure))
        if self.mode == "handle":
            return True
        if self.mode == "handle_truthy":
            return "yes, handled"  # any truthy value
        if self.mode == "false":
            return False
        if self.mode == "none":
            return None
        raise ValueError(f"supervise-raised while handling {failure.mesh_name}")


class Grandparent(Actor):
    """Owns a Parent mesh (which owns a Child mesh); handles what reaches it."""

    def __init__(self, notes) -> None:
        self.notes = notes
        self.parent = None

    @endpoint
    async def build(self, parent_name: str, child_name: str, parent_mode: str) -> None:
        self.parent = this_proc().spawn(parent_name, Parent, parent_mode, self.notes)
        await self.parent.spawn_child.call_one(child_name)

    @endpoint
    async def kill_grandchild(self, msg: str) -> None:
        await self.parent.kill_child.call_one(msg)

    @endpoint
    def ping(self) -> str:
        return "grandparent-alive"

    def __supervise__(self, failure):
        self.notes.send({"grandparent_saw": failure.mesh_name, "report": failure.report()})
        return True


def _parent(procs, mode: str):
    notes_port, notes = Channel.open()
    pname, cname = fresh(f"parent_{mode}"), fresh(f"child_{mode}")
    parent = procs.spawn(pname, Parent, mode, notes_port).slice(gpus=0)
    parent.spawn_child.call_one(cname).get(timeout=T)
    assert parent.child_ok.call_one().get(timeout=T) == "child-ok"
    return parent, pname, cname, notes


# ====================================================================== handled


@pytest.mark.parametrize("mode", ["handle", "handle_truthy"])
def test_truthy_supervise_handles_the_failure(procs, faults, mode) -> None:
    parent, pname, cname, notes = _parent(procs, mode)
    parent.kill_child.call_one("child boom (handled)").get(timeout=T)

    seen = notes.recv().get(timeout=T)
    assert seen["is_mesh_failure"]
    assert seen["mesh_name"] == cname
    assert "child boom (handled)" in seen["str"]
    assert "Child" in seen["str"]
    assert "child boom (handled)" in seen["report"] and cname in seen["report"]
    # failure.mesh is a reference: only the owner (via the spawn result) may stop it
    assert seen["stop"].startswith("RuntimeError")
    assert "only the owner can" in seen["stop"].lower()

    # the parent is alive (this call is queued after __supervise__ returned)
    assert parent.ping.call_one().get(timeout=T) == "parent-alive"
    # the child is failed, from the parent's point of view
    res = parent.call_child_after_failure.call_one().get(timeout=T)
    assert res.startswith("SupervisionError"), res
    assert "child boom (handled)" in res
    join_hook_threads()
    assert faults.for_mesh(pname) == []
    assert faults.for_mesh(cname) == []


# ====================================================================== not handled


@pytest.mark.parametrize("mode", ["false", "none"])
def test_falsy_supervise_fails_the_owner_and_propagates(procs, faults, mode) -> None:
    parent, pname, cname, notes = _parent(procs, mode)
    parent.kill_child.call_one("child boom (unhandled)").get(timeout=T)
    seen = notes.recv().get(timeout=T)
    assert seen["mesh_name"] == cname

    failure = faults.wait_mesh(pname)[0]
    text = str(failure)
    assert "child boom (unhandled)" in text
    assert cname in text and pname in text
    assert "Fatal" in text
    assert faults.for_mesh(cname) == []  # the child's failure went to its owner, not to the root

    exc = parent.ping.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
    assert "child boom (unhandled)" in str(exc)


def test_raising_in_supervise_chains_a_new_failure(procs, faults) -> None:
    parent, pname, cname, notes = _parent(procs, "raise")
    parent.kill_child.call_one("child boom (raise)").get(timeout=T)
    assert notes.recv().get(timeout=T)["mesh_name"] == cname

    failure = faults.wait_mesh(pname)[0]
    text = failure.report()
    assert f"supervise-raised while handling {cname}" in text  # the new failure
    assert "ValueError" in text
    assert "child boom (raise)" in text  # chained to the original one
    assert text.index("child boom (raise)") < text.index("supervise-raised")
    exc = parent.ping.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError
    assert "supervise-raised" in str(exc)


def test_failure_stops_at_the_first_owner_that_handles_it(procs, faults) -> None:
    notes_port, notes = Channel.open()
    gname, pname, cname = fresh("gp"), fresh("gp_parent"), fresh("gp_child")
    gp = procs.spawn(gname, Grandparent, notes_port).slice(gpus=1)
    gp.build.call_one(pname, cname, "false").get(timeout=T)
    gp.kill_grandchild.call_one("grandchild boom").get(timeout=T)

    parent_saw = notes.recv().get(timeout=T)
    assert parent_saw["mesh_name"] == cname
    gp_saw = notes.recv().get(timeout=T)
    assert gp_saw["grandparent_saw"] == pname
    report = gp_saw["report"]
    assert "grandchild boom" in report
    assert report.index(cname) < report.index(f"actor {pname}")  # the first failure first

    assert gp.ping.call_one().get(timeout=T) == "grandparent-alive"
    join_hook_threads()
    for n in (gname, pname, cname):
        assert faults.for_mesh(n) == []


class RemoteOwner(Actor):
    """Owns an actor mesh on procs it was given (other processes than its own)."""

    def __init__(self, notes) -> None:
        self.notes = notes

    @endpoint
    async def adopt(self, pm, name: str) -> list:
        self.child = pm.spawn(name, Child)
        await self.child.ok.call()
        return [1]

    @endpoint
    def ping(self) -> str:
        return "owner-alive"

    @endpoint
    async def call_child(self) -> str:
        try:
            await self.child.ok.call()
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"
        return "child answered"

    def __supervise__(self, failure) -> bool:
        self.notes.send(_describe_failure(failure))
        return True


class StrictRemoteOwner(RemoteOwner):
    """Does not handle failures of its child mesh."""

    def __supervise__(self, failure) -> bool:
        self.notes.send(_describe_failure(failure))
        return False


class PidOf(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


def test_owner_on_another_proc_learns_the_signal_that_killed_its_child(procs, faults) -> None:
    """The failure of a child whose process was SIGKILLed reaches an owner
    that lives in another process, with the signal in the message."""
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        notes_port, notes = Channel.open()
        oname, cname = fresh("remote_owner"), fresh("remote_child")
        owner = procs.slice(gpus=0).spawn(oname, RemoteOwner, notes_port)
        owner.adopt.call_one(pm, cname).get(timeout=T)
        pid = pm.spawn(fresh("pidof"), PidOf).pid.call_one().get(timeout=T)
        os.kill(pid, signal.SIGKILL)
        seen = notes.recv().get(timeout=T)
        assert seen["mesh_name"] == cname
        assert "Child" in seen["str"]
        assert "SIGKILL" in seen["str"], seen["str"]
        assert owner.ping.call_one().get(timeout=T) == "owner-alive"
    finally:
        pm.stop().get(timeout=30)


def test_stopping_procs_under_a_remotely_owned_mesh_is_not_a_failure(procs, faults) -> None:
    """The client stops the procs of an actor mesh that an actor (in another
    process) owns: those actors were stopped, which is not a failure -- the
    owner must not fail, and nothing reaches the client's hook."""
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    notes_port, notes = Channel.open()
    oname, cname = fresh("strict_owner"), fresh("stopped_child")
    owner = procs.slice(gpus=1).spawn(oname, StrictRemoteOwner, notes_port)
    owner.adopt.call_one(pm, cname).get(timeout=T)
    pm.stop().get(timeout=30)
    res = owner.call_child.call_one().get(timeout=T)  # the owner has now seen the procs go
    assert res.startswith("SupervisionError"), res
    ping = owner.ping.call_one().exception(timeout=T)
    assert ping is None, f"the owner failed because procs under its mesh were stopped: {ping}"
    join_hook_threads()
    assert faults.for_mesh(oname) == [], [str(f) for f in faults.for_mesh(oname)]


# ====================================================================== MeshFailure at the root


class Crasher(Actor):
    @endpoint
    def crash(self, msg: str) -> None:
        raise Fatal(msg)

    @endpoint
    def ok(self) -> int:
        return 1


def test_mesh_failure_api_at_the_root(procs, faults) -> None:
    name = fresh("rootfail")
    mesh = procs.spawn(name, Crasher)
    mesh.slice(gpus=1).crash.broadcast("root boom")
    failure = faults.wait_mesh(name)[0]

    assert isinstance(failure, MeshFailure)
    assert failure.mesh_name == name
    text = str(failure)
    assert "root boom" in failure.report() and name in failure.report()
    assert name in text
    assert "Crasher" in text  # the actor class
    assert "crash" in text  # the endpoint
    assert "{'gpus': 1/2}" in text  # the crashed rank
    assert "{'gpus': 0/2}" not in text
    assert "root boom" in text and "Fatal" in text  # the cause

    # failure.mesh is the failed mesh: a reference (slicing works; stop does not)
    assert failure.mesh is not None
    assert failure.mesh.slice(gpus=0).ok.call_one().get(timeout=T) == 1
    with pytest.raises(SupervisionError):
        failure.mesh.slice(gpus=1).ok.call_one().get(timeout=T)
    with pytest.raises(RuntimeError, match="(?i)only the owner can"):
        failure.mesh.stop()


def test_hook_is_read_at_failure_time(procs, faults) -> None:
    """The hook is looked up when a failure arrives, so assigning
    ``monarch_core.actor.unhandled_fault_hook`` later still takes effect."""
    import threading

    name = fresh("own_hook")
    got = []
    ev = threading.Event()

    def mine(failure) -> None:
        # (only this mesh's: an earlier test's late report, such as an undeliverable message the
        # client sent to an actor it had stopped, may reach the hook while it is assigned)
        if failure.mesh_name == name:
            got.append(failure)
            ev.set()

    saved = mactor.unhandled_fault_hook
    mactor.unhandled_fault_hook = mine
    try:
        procs.spawn(name, Crasher).slice(gpus=0).crash.broadcast("for my hook")
        assert ev.wait(T), "the assigned hook was not called"
    finally:
        mactor.unhandled_fault_hook = saved
    assert got[0].mesh_name == name
    assert faults.for_mesh(name) == []


# ====================================================================== each rank at most once


class TwoWays(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def crash(self, msg: str) -> None:
        raise Fatal(msg)

    @endpoint
    def explode(self, msg: str) -> None:
        raise ValueError(msg)  # fatal in a broadcast


def _broadcast_maybe_failed(ep, msg: str) -> None:
    """Broadcast to a rank that may already be known to have failed (then
    the broadcast itself raises SupervisionError, which is fine here)."""
    try:
        ep.broadcast(msg)
    except SupervisionError:
        pass


def test_each_failed_rank_is_reported_once(faults) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        name, marker = fresh("once"), fresh("once_marker")
        mesh = pm.spawn(name, TwoWays)
        pids = mesh.pid.call().get(timeout=30).values()
        markers = pm.spawn(marker, TwoWays)
        markers.pid.call().get(timeout=T)
        r0, r1 = mesh.slice(gpus=0), mesh.slice(gpus=1)
        # rank 0 fails, then more fatal messages reach it, then its proc dies
        r0.crash.broadcast("first")
        _broadcast_maybe_failed(r0.explode, "second")
        _broadcast_maybe_failed(r0.crash, "third")
        faults.wait_mesh(name)
        os.kill(pids[0], signal.SIGKILL)
        faults.wait_mesh(marker)  # the death of proc 0 was seen
        # rank 1 fails twice over, then its proc dies
        r1.crash.broadcast("fourth")
        _broadcast_maybe_failed(r1.crash, "fifth")
        faults.wait_mesh(name, n=2)
        os.kill(pids[1], signal.SIGKILL)
        faults.wait_mesh(marker, n=2)  # the death of proc 1 was seen
        join_hook_threads()
        got = faults.for_mesh(name)
        assert len(got) == 2, [str(f) for f in got]
        assert "first" in str(got[0]) and "{'gpus': 0/2}" in str(got[0])
        assert "fourth" in str(got[1]) and "{'gpus': 1/2}" in str(got[1])
        assert len(faults.for_mesh(marker)) == 2
    finally:
        pm.stop().get(timeout=30)


# ====================================================================== the default hook (subprocess)

DEFAULT_HOOK_CLIENT = """
import sys, threading
import monarch_core.actor as mactor
from monarch_core.actor import Actor, endpoint, this_host

class Fatal(BaseException):
    pass

class Crasher(Actor):
    @endpoint
    def crash(self, msg):
        raise Fatal(msg)

class Waiter(Actor):
    @endpoint
    def ok(self):
        return 1

MODE = sys.argv[1]
if MODE == "raising_hook":
    def hook(failure):
        print("HOOK CALLED", failure.mesh_name, flush=True)
        raise RuntimeError("my hook refuses")
    mactor.unhandled_fault_hook = hook
elif MODE == "sys_exit_0_hook":
    def hook(failure):
        print("HOOK CALLED", failure.mesh_name, flush=True)
        sys.exit(0)   # any exception, SystemExit(0) included, leaves the fault unhandled
    mactor.unhandled_fault_hook = hook
elif MODE == "dropping_hook":
    dropped = threading.Event()
    def hook(failure):
        print("HOOK DROPPED", failure.mesh_name, flush=True)
        dropped.set()
    mactor.unhandled_fault_hook = hook

pm = this_host().spawn_procs(per_host={"gpus": 1})
m = pm.spawn("crashy_mesh", Crasher)
m.crash.broadcast("default hook cause 4242")
if MODE == "dropping_hook":
    assert dropped.wait(30)
    print("CLIENT CONTINUES", flush=True)
    sys.exit(0)
try:
    if MODE == "blocked_recv":   # blocked without a timeout
        from monarch_core.actor import Channel
        _port, recv = Channel.open()
        recv.recv().get()
    else:
        threading.Event().wait(30)   # the unhandled fault interrupts this
    print("NOT INTERRUPTED", flush=True)
except KeyboardInterrupt:
    print("INTERRUPTED", flush=True)
    raise
"""


@pytest.mark.parametrize("mode", ["default", "raising_hook", "sys_exit_0_hook", "blocked_recv"])
def test_unhandled_fault_ends_the_client_with_exit_code_1(client_script, mode) -> None:
    r = client_script(DEFAULT_HOOK_CLIENT, mode)
    assert r.returncode == 1, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "INTERRUPTED" in r.stdout and "NOT INTERRUPTED" not in r.stdout
    # the report is logged
    assert "crashy_mesh" in r.stderr
    assert "default hook cause 4242" in r.stderr
    assert "Crasher" in r.stderr
    if mode in ("raising_hook", "sys_exit_0_hook"):
        assert "HOOK CALLED crashy_mesh" in r.stdout


def test_hook_returning_normally_drops_the_fault(client_script) -> None:
    r = client_script(DEFAULT_HOOK_CLIENT, "dropping_hook")
    assert r.returncode == 0, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "HOOK DROPPED crashy_mesh" in r.stdout
    assert "CLIENT CONTINUES" in r.stdout


class Stopping(Parent):
    """A Parent whose child fails while it is stopping."""

    @endpoint
    def fail_child_while_busy(self) -> None:
        """Busy until the stop is requested; then the child fails, and this
        returns once the failure's supervision event is queued behind the stop
        (white-box: the actor host's own flag and mailbox)."""
        import time

        from monarch_core._proc import _host
        from monarch_core.actor import context

        host = context().actor_instance._host
        deadline = time.monotonic() + T
        while not host._stop_requested:
            assert time.monotonic() < deadline, "the stop was never requested"
            time.sleep(0.01)
        try:
            self.child.die.call_one("failed after the stop began").get(timeout=T)
        except Exception:  # noqa: BLE001 - the child died, as meant
            pass
        while not any(item[0] == _host._SUPERVISE for item in list(host._control)):
            assert time.monotonic() < deadline, "the child's failure never reached its owner"
            time.sleep(0.01)

    def __cleanup__(self, exc) -> None:
        self.notes.send({"cleanup": True})


def test_a_supervision_event_after_the_stop_began_is_dropped(procs, faults) -> None:
    notes_port, notes = Channel.open()
    pname, cname = fresh("stopping_parent"), fresh("stopping_child")
    parent = procs.spawn(pname, Stopping, "handle", notes_port)
    one = parent.slice(gpus=0)
    one.spawn_child.call_one(cname).get(timeout=T)
    one.fail_child_while_busy.broadcast()
    parent.stop().get(timeout=T)
    seen = []
    while True:
        try:
            seen.append(notes.recv().get(timeout=2))
        except TimeoutError:
            break
    assert {"cleanup": True} in seen
    assert not [n for n in seen if "is_mesh_failure" in n], seen   # __supervise__ never saw it
    join_hook_threads()
    assert not [f for f in faults.failures if f.mesh_name in (pname, cname)], faults.failures
