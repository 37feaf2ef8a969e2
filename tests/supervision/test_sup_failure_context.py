"""Every error a caller gets for a failed call says where it failed.

The reference's release notes: "endpoint failures surface clearer context,
including actor and endpoint names" and "supervision errors describe the full
hierarchy of exits".  For each way a call can fail -- the endpoint raised, its
process died, the actor (or its proc mesh) was stopped, the actor died of a
failure further down -- the error names the actor mesh and its class, the
endpoint, the rank(s) and their coordinates, the proc and the host, and for
a cascade the chain from the first failure up; what the texts said before
(the exit status, "and its descendants failed", the stop reason) stays.
"""

from __future__ import annotations

import os
import signal
import socket

import pytest

from monarch_core.actor import Actor, ActorError, Channel, endpoint, this_host, this_proc
from monarch_core.errors import SupervisionError

from _helpers import T, fresh
from _helpers.faults import join_hook_threads

HOST = socket.gethostname()


class Fatal(BaseException):
    pass


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def ok(self) -> str:
        return "ok"

    @endpoint
    def bad_step(self, msg: str) -> None:
        raise ValueError(msg)

    @endpoint
    def exit_proc(self, code: int) -> None:
        os._exit(code)

    @endpoint
    async def wait_forever(self, notify) -> None:  # noqa: ANN001
        gate_port, gate = Channel.open(once=True)
        notify.send("waiting")
        await gate.recv()

    @endpoint(explicit_response_port=True)
    def reply_with_error(self, port, msg: str) -> None:  # noqa: ANN001
        port.exception(ValueError(msg))

    @endpoint
    def system_exit(self) -> None:
        raise SystemExit(4)

    @endpoint
    def keyboard_interrupt(self) -> None:
        raise KeyboardInterrupt("interrupted on purpose")


def _names_the_call(text: str, mesh: str, endpoint_: str, coords: str, proc: str) -> None:
    assert f"actor mesh {mesh!r}" in text, text
    assert "class Worker" in text or "(Worker" in text, text
    assert f"{mesh}.{endpoint_}" in text, text
    assert coords in text, text
    assert proc in text, text
    assert f"on host {HOST}" in text, text


# ====================================================================== the endpoint raised


def test_an_endpoint_exception_names_actor_class_endpoint_rank_proc_and_host(procs) -> None:
    name = fresh("ctx_raise")
    mesh = procs.spawn(name, Worker)
    exc = mesh.bad_step.call("bad input 3").exception(timeout=T)
    assert type(exc) is ActorError, f"{type(exc).__name__}: {exc}"
    assert exc.actor in (f"{name}{{'gpus': 0/2}}", f"{name}{{'gpus': 1/2}}")
    assert exc.endpoint == "bad_step"
    assert exc.actor_class.endswith("Worker")
    assert exc.proc.startswith("proc procs") and exc.host == HOST
    text = str(exc)
    assert "bad input 3" in text and "ValueError" in text and "Traceback" in text
    assert f"actor {exc.actor} (class {exc.actor_class}), endpoint bad_step, on {exc.proc} on host {HOST}" in text
    assert "endpoint None" not in text


def test_port_exception_names_the_explicit_response_port_endpoint(procs) -> None:
    name = fresh("ctx_port")
    one = procs.spawn(name, Worker).slice(gpus=1)
    exc = one.reply_with_error.call_one("through the port").exception(timeout=T)
    assert type(exc) is ActorError, f"{type(exc).__name__}: {exc}"
    assert exc.endpoint == "reply_with_error"
    text = str(exc)
    assert "endpoint None" not in text
    assert f"Actor call {name}.reply_with_error failed" in text
    assert f"actor {name}{{'gpus': 1/2}}" in text and "through the port" in text


@pytest.mark.parametrize("ep,cause", [("system_exit", "SystemExit"), ("keyboard_interrupt", "KeyboardInterrupt")])
def test_system_exit_and_keyboard_interrupt_name_the_endpoint(procs, faults, ep, cause) -> None:
    name = fresh(f"ctx_{ep}")
    one = procs.spawn(name, Worker).slice(gpus=0)
    exc = getattr(one, ep).call_one().exception(timeout=T)
    assert type(exc) is SupervisionError, f"{type(exc).__name__}: {exc}"
    text = str(exc)
    assert "endpoint None" not in text
    assert f"endpoint {ep}" in text and f"{ep} was not completed" in text and cause in text
    assert "and its descendants failed" in text
    failure = faults.wait_mesh(name)[0]
    assert "endpoint None" not in str(failure)
    assert f"{name}.{ep} raised {cause}" in str(failure)
    later = one.ok.call_one().exception(timeout=T)
    assert type(later) is SupervisionError
    assert f"{name}.{ep}" in str(later) and "endpoint None" not in str(later)


# ====================================================================== the process died


@pytest.mark.parametrize("how", ["os._exit", "SIGKILL"])
def test_a_process_death_names_the_call_in_flight(faults, how) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name=fresh("ctxprocs"))
    try:
        name = fresh("ctx_death")
        mesh = pm.spawn(name, Worker)
        pids = mesh.pid.call().get(timeout=30).values()
        victim = mesh.slice(gpus=1)
        if how == "os._exit":
            fut = victim.exit_proc.call_one(3)
            status = "exited with code 3"
            ep = "exit_proc"
        else:
            notify, notified = Channel.open(once=True)
            fut = victim.wait_forever.call_one(notify)
            assert notified.recv().get(timeout=T) == "waiting"
            os.kill(pids[1], signal.SIGKILL)
            status = "SIGKILL"
            ep = "wait_forever"
        exc = fut.exception(timeout=T)
        assert type(exc) is SupervisionError, f"{type(exc).__name__}: {exc}"
        text = str(exc)
        assert status in text  # what it said before
        assert f"call_one() of {name}.{ep}" in text
        _names_the_call(text, name, ep, f"(actor {name}{{'gpus': 1/2}})", f"proc {pm.name}{{'gpus': 1/2}}")
        faults.wait_mesh(name)
        # a later call() to the whole mesh fails at once, naming the failed rank and why
        later = mesh.ok.call().exception(timeout=T)
        assert type(later) is SupervisionError
        ltext = str(later)
        assert f"cannot call {name}.ok" in ltext and "(Worker)" in ltext
        assert f"failed rank(s) of this view: 1 ({name}{{'gpus': 1/2}})" in ltext
        assert status in ltext and f"on host {HOST}" in ltext
    finally:
        pm.stop().get(timeout=30)


def test_a_process_death_during_call_names_the_rank_that_was_lost(faults) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name=fresh("ctxcall"))
    try:
        name = fresh("ctx_call_death")
        mesh = pm.spawn(name, Worker)
        pids = mesh.pid.call().get(timeout=30).values()
        notify, notified = Channel.open()
        fut = mesh.wait_forever.call(notify)
        assert [notified.recv().get(timeout=T) for _ in range(2)] == ["waiting", "waiting"]
        os.kill(pids[0], signal.SIGKILL)
        exc = fut.exception(timeout=T)
        assert type(exc) is SupervisionError, f"{type(exc).__name__}: {exc}"
        text = str(exc)
        assert f"call() of {name}.wait_forever" in text
        _names_the_call(text, name, "wait_forever", "rank 0 {'gpus': 0/2}", f"proc {pm.name}{{'gpus': 0/2}}")
        assert "rank 1" not in text  # only the rank that was lost
        assert "SIGKILL" in text
        faults.wait_mesh(name)
    finally:
        pm.stop().get(timeout=30)


# ====================================================================== stops


def test_a_stopped_actor_mesh_names_itself_and_the_reason(procs, faults) -> None:
    name = fresh("ctx_stopped")
    mesh = procs.spawn(name, Worker)
    assert mesh.ok.call().get(timeout=T).values() == ["ok", "ok"]
    mesh.stop("making room for the eval job").get(timeout=T)
    exc = mesh.slice(gpus=1).ok.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError, f"{type(exc).__name__}: {exc}"
    text = str(exc)
    assert "stopped" in text and "making room for the eval job" in text
    assert f"call_one() of {name}.ok" in text
    assert f"actor {name}{{'gpus': 1/2}} (Worker) on proc" in text and f"on host {HOST}" in text
    assert "-" + name not in text  # not the internal actor key
    join_hook_threads()
    assert faults.for_mesh(name) == []


def test_the_reason_given_to_proc_mesh_stop_reaches_later_callers(faults) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, name=fresh("ctxstop"))
    name = fresh("ctx_pm_stopped")
    mesh = pm.spawn(name, Worker)
    assert mesh.ok.call().get(timeout=30).values() == ["ok", "ok"]
    pm.stop("preempted by the scheduler").get(timeout=30)
    for fut in (mesh.slice(gpus=0).ok.call_one(), mesh.ok.call()):
        exc = fut.exception(timeout=T)
        assert type(exc) is SupervisionError, f"{type(exc).__name__}: {exc}"
        text = str(exc)
        assert "was stopped" in text  # what it said before
        assert f"its proc mesh {pm.name!r} was stopped: preempted by the scheduler" in text
        assert f"{name}.ok" in text and "class Worker" in text
    with pytest.raises(RuntimeError, match="preempted by the scheduler"):
        pm.spawn(fresh("after"), Worker)
    join_hook_threads()
    assert faults.for_mesh(name) == []


# ====================================================================== cascades


class Leaf(Actor):
    @endpoint
    def fail(self, msg: str) -> None:
        raise Fatal(msg)


class Middle(Actor):
    """Owns a Leaf mesh and does not handle its failure."""

    @endpoint
    async def go(self, leaf_name: str, msg: str) -> None:
        self.leaf = this_proc().spawn(leaf_name, Leaf)
        self.leaf.fail.broadcast(msg)

    @endpoint
    def ok(self) -> str:
        return "middle"


def test_a_call_to_an_actor_failed_by_a_cascade_shows_the_chain_from_the_first_failure(procs, faults) -> None:
    mname, lname = fresh("ctx_mid"), fresh("ctx_leaf")
    middle = procs.slice(gpus=0).spawn(mname, Middle)
    middle.go.call_one(lname, "the root cause 42").get(timeout=T)
    faults.wait_mesh(mname)
    exc = middle.ok.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError, f"{type(exc).__name__}: {exc}"
    text = str(exc)
    assert "First failure" in text and "the root cause 42" in text
    first = next(ln for ln in text.splitlines() if ln.startswith("First failure"))
    assert lname in first and "Leaf" in first and f"on host {HOST}" in first
    then = next(ln for ln in text.splitlines() if ln.startswith("Which then failed"))
    assert mname in then and "Middle" in then
    assert text.index("First failure") < text.index("Which then failed")


class Caller(Actor):
    """Calls a mesh it was given (a reference: it knows nothing of its health)."""

    @endpoint
    def call_ok(self, mesh) -> str:  # noqa: ANN001
        exc = mesh.ok.call_one().exception(timeout=10)
        return f"{type(exc).__name__}: {exc}"


def test_an_actor_failed_by_a_cascade_refuses_calls_with_the_chain(procs, faults) -> None:
    """A caller that learns of the failure from the failed actor itself (its
    refusal) gets the cascade too, the failed actor's own line last."""
    mname, lname = fresh("ctx_mid_ref"), fresh("ctx_leaf_ref")
    middle = procs.slice(gpus=0).spawn(mname, Middle)
    middle.go.call_one(lname, "the root cause 43").get(timeout=T)
    faults.wait_mesh(mname)
    caller = procs.slice(gpus=1).spawn(fresh("ctx_caller"), Caller)
    text = caller.call_ok.call_one(middle).get(timeout=T)
    assert text.startswith("SupervisionError: "), text
    assert f"call_one() of {mname}.ok (actor mesh {mname!r}, class" in text
    assert f"actor {mname} (Middle, on proc" in text and "and its descendants failed; ok was not completed" in text
    lines = text.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("First failure"))
    then = next(i for i, ln in enumerate(lines) if ln.startswith("Which then failed"))
    assert first < then
    assert lname in lines[first] and "(Leaf)" in lines[first] and f"on host {HOST}" in lines[first]
    assert mname in lines[then] and "(Middle)" in lines[then]
    assert "the root cause 43" in text
