"""Per-rank health: when rank 3 of a 4-rank mesh dies, the mesh and every
slice containing rank 3 fail fast; slices without it, and other meshes on the
surviving procs, keep working.  Detection of a SIGKILLed proc: the hook and
the in-flight call hear of it (generous timeouts, no wall-clock assertions)."""

from __future__ import annotations

import os
import signal

import pytest

from monarch_core.actor import Actor, Channel, endpoint, this_host
from monarch_core.errors import SupervisionError

from _helpers import T, fresh
from _helpers.faults import RECORDER, join_hook_threads

pytestmark = pytest.mark.unit


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def rank(self) -> int:
        from monarch_core.actor import current_rank

        return current_rank().rank

    @endpoint
    async def block(self, notify) -> None:
        _gate_port, gate = Channel.open(once=True)
        notify.send("blocked")
        await gate.recv()


class Other(Actor):
    @endpoint
    def hello(self) -> str:
        return "other"


@pytest.fixture(scope="module")
def rank3_dead():
    faults = RECORDER
    """Four procs; mesh ``main`` on all of them; rank 3's proc SIGKILLed
    while a call to it is in flight."""
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    name, other_name = fresh("health_main"), fresh("health_other")
    mesh = pm.spawn(name, Worker)
    other = pm.spawn(other_name, Other)
    pids = mesh.pid.call().get(timeout=60).values()
    assert other.hello.call().get(timeout=T).values() == ["other"] * 4
    notify, notified = Channel.open(once=True)
    in_flight = mesh.slice(gpus=3).block.call_one(notify)
    assert notified.recv().get(timeout=T) == "blocked"

    os.kill(pids[3], signal.SIGKILL)

    state = {
        "pm": pm,
        "mesh": mesh,
        "other": other,
        "name": name,
        "other_name": other_name,
        "pids": pids,
        "in_flight_exc": in_flight.exception(timeout=T),
        "failure": faults.wait_mesh(name)[0],
        "other_failure": faults.wait_mesh(other_name)[0],
    }
    yield state
    pm.stop().get(timeout=60)


def test_sigkill_is_detected_by_in_flight_call_and_hook(rank3_dead, faults) -> None:
    exc = rank3_dead["in_flight_exc"]
    assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
    assert "SIGKILL" in str(exc)
    f = rank3_dead["failure"]
    assert "{'gpus': 3/4}" in str(f)
    assert "SIGKILL" in str(f)
    assert "{'gpus': 3/4}" in str(rank3_dead["other_failure"])
    join_hook_threads()
    assert len(faults.for_mesh(rank3_dead["name"])) == 1  # only rank 3 failed
    assert len(faults.for_mesh(rank3_dead["other_name"])) == 1


@pytest.mark.parametrize(
    "sl",
    [
        {},
        {"gpus": 3},
        {"gpus": slice(2, 4)},
        {"gpus": slice(1, None)},
        {"gpus": slice(0, 4, 3)},
    ],
    ids=["whole", "rank3", "2:4", "1:", "0::3"],
)
def test_mesh_and_slices_containing_the_dead_rank_fail_fast(rank3_dead, sl) -> None:
    view = rank3_dead["mesh"].slice(**sl) if sl else rank3_dead["mesh"]
    futs = [view.rank.call(), view.rank.choose(), *view.rank.stream()]
    if view.size() == 1:
        futs.append(view.rank.call_one())
    for fut in futs:
        exc = fut.exception(timeout=T)
        assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
        assert "{'gpus': 3/4}" in str(exc)
        assert rank3_dead["name"] in str(exc)
    with pytest.raises(SupervisionError):
        view.rank.broadcast()


@pytest.mark.parametrize(
    "sl,ranks",
    [
        ({"gpus": 0}, [0]),
        ({"gpus": 2}, [2]),
        ({"gpus": slice(0, 3)}, [0, 1, 2]),
        ({"gpus": slice(0, 4, 2)}, [0, 2]),
    ],
    ids=["rank0", "rank2", "0:3", "0::2"],
)
def test_slices_without_the_dead_rank_keep_working(rank3_dead, sl, ranks) -> None:
    view = rank3_dead["mesh"].slice(**sl)
    assert view.rank.call().get(timeout=T).values() == list(range(len(ranks)))
    assert view.pid.call().get(timeout=T).values() == [rank3_dead["pids"][r] for r in ranks]
    assert sorted(f.get(timeout=T) for f in view.rank.stream()) == list(range(len(ranks)))
    assert view.pid.choose().get(timeout=T) in [rank3_dead["pids"][r] for r in ranks]
    view.rank.broadcast()  # does not raise


def test_other_meshes_on_surviving_procs_keep_working(rank3_dead) -> None:
    other = rank3_dead["other"]
    assert other.slice(gpus=slice(0, 3)).hello.call().get(timeout=T).values() == ["other"] * 3
    exc = other.hello.call().exception(timeout=T)
    assert type(exc) is SupervisionError
    # a new mesh on the surviving procs works
    survivors = rank3_dead["pm"].slice(gpus=slice(0, 3))
    fresh_mesh = survivors.spawn(fresh("health_new"), Other)
    assert fresh_mesh.hello.call().get(timeout=T).values() == ["other"] * 3


def test_a_mesh_spawned_after_the_death_fails_only_on_the_dead_rank(rank3_dead) -> None:
    late = rank3_dead["pm"].spawn(fresh("health_late"), Other)
    exc = late.initialized.exception(timeout=T)
    assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
    assert "SIGKILL" in str(exc)
    assert late.slice(gpus=slice(0, 3)).hello.call().get(timeout=T).values() == ["other"] * 3
    exc = late.slice(gpus=3).hello.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError, f"got {type(exc).__name__}: {exc}"
    assert "SIGKILL" in str(exc)


def test_stopping_a_mesh_with_a_dead_rank_completes(rank3_dead) -> None:
    rank3_dead["other"].stop().get(timeout=T)
    exc = rank3_dead["other"].slice(gpus=0).hello.call_one().exception(timeout=T)
    assert type(exc) is SupervisionError
