"""Which failures kill what (one test per row of the contract).

* an endpoint raising an ``Exception`` on call/call_one/choose/stream: the
  caller gets ``ActorError``, the actor survives;
* a ``BaseException`` that is not an ``Exception``, an exception inside a
  ``broadcast`` (nobody to reply to), or one escaping an
  ``explicit_response_port`` endpoint: the actor dies; calls in flight to it
  fail saying the actor and its descendants failed; later calls fail at once
  with the original cause;
* ``__init__`` raising: ``initialized`` and the first call report it;
* the process dying (``os._exit``, ``SIGKILL``, a segfault): every actor on
  it fails, with the exit status / signal in the message.
"""

from __future__ import annotations

import ctypes
import os
import signal

import pytest

from monarch_core.actor import Actor, ActorError, Channel, MeshFailure, endpoint, this_host
from monarch_core.errors import SupervisionError

from _helpers import T, fresh
from _helpers.faults import join_hook_threads


class Fatal(BaseException):
    """A BaseException that is not an Exception."""


class Victim(Actor):
    def __init__(self) -> None:
        self.n = 0

    @endpoint
    def ok(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def raise_exc(self, msg: str) -> None:
        self.n += 1
        raise ValueError(msg)

    @endpoint
    async def araise_exc(self, msg: str) -> None:
        self.n += 1
        raise ValueError(msg)

    @endpoint
    async def gated(self, notify, kind: str, msg: str) -> None:
        """Tell the client where to release us, wait for the release, then
        fail with ``kind``.  Meanwhile the client queues more calls behind
        this one, so that they are in flight when the actor dies."""
        gate_port, gate = Channel.open(once=True)
        notify.send(gate_port)
        await gate.recv()
        if kind == "keyboard":
            raise KeyboardInterrupt(msg)
        if kind == "fatal":
            raise Fatal(msg)
        if kind == "system_exit":
            raise SystemExit(msg)
        raise ValueError(msg)

    @endpoint(explicit_response_port=True)
    async def gated_explicit(self, port, notify, msg: str) -> None:
        gate_port, gate = Channel.open(once=True)
        notify.send(gate_port)
        await gate.recv()
        raise ValueError(msg)

    @endpoint(explicit_response_port=True)
    def explicit_ok(self, port, x: int) -> None:
        port.send(x * 2)

    @endpoint
    def exit_proc(self, code: int) -> None:
        os._exit(code)

    @endpoint
    def segfault(self) -> None:
        ctypes.string_at(0)


class Bystander(Actor):
    """A second actor mesh on the same procs."""

    @endpoint
    def ok(self) -> str:
        return "bystander"

    @endpoint
    async def block(self, notify) -> None:
        gate_port, gate = Channel.open(once=True)
        notify.send("blocked")
        await gate.recv()  # never released: only the proc's death ends this call


class BadInit(Actor):
    def __init__(self, msg: str) -> None:
        raise RuntimeError(msg)

    @endpoint
    def ok(self) -> int:
        return 1


# ====================================================================== Exception: the actor survives


@pytest.mark.parametrize("adverb", ["call_one", "call", "choose", "stream"])
@pytest.mark.parametrize("ep", ["raise_exc", "araise_exc"])
def test_endpoint_exception_gives_actor_error_and_actor_survives(procs, faults, adverb, ep) -> None:
    name = fresh("survivor")
    mesh = procs.spawn(name, Victim)
    target = mesh.slice(gpus=1) if adverb == "call_one" else mesh
    msg = f"plain exception via {adverb}"
    endpoint_ = getattr(target, ep)
    if adverb == "stream":
        futs = list(endpoint_.stream(msg))
        assert len(futs) == 2
    else:
        futs = [getattr(endpoint_, adverb)(msg)]
    for fut in futs:
        exc = fut.exception(timeout=T)
        assert type(exc) is ActorError, f"{adverb}: expected ActorError, got {type(exc).__name__}: {exc}"
        assert type(exc.exception) is ValueError
        assert msg in str(exc)
        assert ep in str(exc)  # names the endpoint
    # the actors survived, with their state
    values = mesh.ok.call().get(timeout=T).values()
    if adverb == "choose":
        assert sorted(values) == [1, 2]
    elif adverb == "call_one":
        assert values == [1, 2]
    else:
        assert values == [2, 2]
    assert faults.for_mesh(name) == []


def test_explicit_port_endpoint_that_replies_is_fine(procs) -> None:
    mesh = procs.spawn(fresh("explicit_ok"), Victim)
    assert mesh.slice(gpus=0).explicit_ok.call_one(21).get(timeout=T) == 42


# ====================================================================== the actor dies


FATAL_ROWS = [
    # (id, endpoint kind, adverb, what the cause text must contain)
    ("keyboard-interrupt", "keyboard", "call_one", "KeyboardInterrupt"),
    ("custom-base-exception", "fatal", "call_one", "Fatal"),
    ("system-exit", "system_exit", "call_one", "SystemExit"),
    ("exception-in-broadcast", "exc", "broadcast", "ValueError"),
    ("exception-in-explicit-port-endpoint", "explicit", "call_one", "ValueError"),
]


@pytest.mark.parametrize("kind,adverb,cause_type", [r[1:] for r in FATAL_ROWS], ids=[r[0] for r in FATAL_ROWS])
def test_fatal_failures_kill_the_actor(procs, faults, kind, adverb, cause_type) -> None:
    name = fresh(f"dies_{kind}")
    mesh = procs.spawn(name, Victim)
    victim = mesh.slice(gpus=0)
    msg = f"original cause {name}"
    notify, notified = Channel.open(once=True)

    fatal_fut = None
    if kind == "explicit":
        fatal_fut = victim.gated_explicit.call_one(notify, msg)
    elif adverb == "broadcast":
        victim.gated.broadcast(notify, kind, msg)
    else:
        fatal_fut = victim.gated.call_one(notify, kind, msg)
    gate = notified.recv().get(timeout=T)
    # queued behind the fatal message: in flight when the actor dies
    in_flight = [victim.ok.call_one(), victim.pid.call_one()]
    gate.send("go")

    expected_in_flight = "and its descendants failed"
    if fatal_fut is not None:
        exc = fatal_fut.exception(timeout=T)
        assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
        assert expected_in_flight in str(exc)
    for fut in in_flight:
        exc = fut.exception(timeout=T)
        assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
        assert expected_in_flight in str(exc)
        assert msg in str(exc)

    # the owner (the client) is told; nobody handles it: the hook
    failure = faults.wait_mesh(name)[0]
    assert isinstance(failure, MeshFailure)
    assert msg in str(failure)
    assert cause_type in str(failure)

    # later calls fail at once, with the original cause
    for later in (victim.ok.call_one(), mesh.ok.call()):
        exc = later.exception(timeout=T)
        assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
        assert msg in str(exc)
        assert cause_type in str(exc)
    with pytest.raises(SupervisionError, match=msg):
        victim.ok.broadcast()

    # the other rank is untouched
    assert mesh.slice(gpus=1).ok.call_one().get(timeout=T) == 1
    join_hook_threads()
    assert len(faults.for_mesh(name)) == 1


# ====================================================================== __init__ raises


def test_init_failure_is_reported_by_initialized_and_first_call(procs, faults) -> None:
    name = fresh("badinit")
    msg = f"init exploded {name}"
    mesh = procs.spawn(name, BadInit, msg)
    first = mesh.slice(gpus=0).ok.call_one()  # sent before __init__ has run

    exc = mesh.initialized.exception(timeout=T)
    assert type(exc) is ActorError, f"got {type(exc).__name__}: {exc}"
    assert msg in str(exc)
    assert "__init__" in str(exc)

    exc = first.exception(timeout=T)
    assert type(exc) in (ActorError, SupervisionError), f"got {type(exc).__name__}: {exc}"
    assert msg in str(exc)

    failures = faults.wait_mesh(name, n=2)  # both ranks failed
    for f in failures:
        assert msg in str(f)
        assert "__init__" in str(f)
        assert f.category == "user"

    later = mesh.ok.call().exception(timeout=T)
    assert type(later) is SupervisionError
    assert msg in str(later)


# ====================================================================== the process dies


def _kill_sigkill(mesh, pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _kill_exit(mesh, pid: int) -> None:
    mesh.exit_proc.broadcast(7)


def _kill_segfault(mesh, pid: int) -> None:
    mesh.segfault.broadcast()


@pytest.mark.parametrize(
    "kill,status",
    [
        (_kill_exit, "exited with code 7"),
        (_kill_sigkill, "SIGKILL"),
        (_kill_segfault, "SIGSEGV"),
    ],
    ids=["os._exit", "SIGKILL", "segfault"],
)
def test_process_death_fails_every_actor_on_it(faults, kill, status) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        a_name, b_name = fresh("on_dying_proc_a"), fresh("on_dying_proc_b")
        a = pm.spawn(a_name, Victim)
        b = pm.spawn(b_name, Bystander)
        pid = a.pid.call_one().get(timeout=30)
        notify, notified = Channel.open(once=True)
        in_flight = b.block.call_one(notify)
        assert notified.recv().get(timeout=T) == "blocked"

        kill(a, pid)

        exc = in_flight.exception(timeout=T)
        assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
        assert status in str(exc)
        for name in (a_name, b_name):
            f = faults.wait_mesh(name)[0]
            assert status in str(f)
            assert f.category == "infrastructure"
            assert "infrastructure" in str(f)
        for later in (a.ok.call_one(), b.ok.call_one()):
            exc = later.exception(timeout=T)
            assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
            assert status in str(exc)
        join_hook_threads()
        assert len(faults.for_mesh(a_name)) == 1
        assert len(faults.for_mesh(b_name)) == 1
    finally:
        pm.stop().get(timeout=30)
