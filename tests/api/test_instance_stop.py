"""``context().actor_instance.stop(reason)``: an actor stopping itself (the
reference's ``Instance.stop``; its ``sleep_actors.py`` example).  It finishes
the message it is handling and those already queued, then stops: later calls
are refused, its cleanup runs, and no failure reaches the owner."""

from __future__ import annotations

import pytest

from monarch_core.actor import Actor, context, endpoint
from monarch_core.errors import SupervisionError

from _helpers import T, fresh


class StopsItself(Actor):
    def __init__(self) -> None:
        self.handled: list[str] = []

    @endpoint
    def finish(self, reason: str) -> str:
        context().actor_instance.stop(reason)
        context().actor_instance.stop(reason)  # again: nothing more
        return "finished"  # the call that asked for the stop still answers

    @endpoint
    def finish_once_another_is_queued(self, reason: str) -> str:
        """Stop once a later message has reached this actor's queue (the test's
        client sent it right after this one; waiting for it makes "queued
        before the stop" a fact, not a race with the client's second send)."""
        import time

        from monarch_core._proc import _state

        host = _state.current_actor.get()
        deadline = time.monotonic() + T
        while not (host._incoming or host._pending) and time.monotonic() < deadline:
            time.sleep(0.005)
        context().actor_instance.stop(reason)
        return "finished"

    @endpoint
    async def afinish(self) -> str:
        context().actor_instance.stop()
        return "finished"

    @endpoint
    def record(self, what: str) -> list[str]:
        self.handled.append(what)
        return list(self.handled)


def test_an_actor_that_stops_itself_answers_the_call_and_refuses_later_ones(procs, faults) -> None:  # type: ignore[no-untyped-def]
    name = fresh("stops_itself")
    actors = procs.slice(gpus=0).spawn(name, StopsItself)
    assert actors.record.call_one("before").get(timeout=T) == ["before"]
    assert actors.finish.call_one("work done").get(timeout=T) == "finished"
    with pytest.raises(SupervisionError, match="stopped"):
        actors.record.call_one("after").get(timeout=T)
    assert faults.for_mesh(name) == []  # a normal end, not a failure


def test_messages_queued_before_the_stop_are_still_handled(procs, faults) -> None:  # type: ignore[no-untyped-def]
    name = fresh("stops_itself_queued")
    actors = procs.slice(gpus=1).spawn(name, StopsItself)
    stop = actors.finish_once_another_is_queued.call_one("done")
    queued = actors.record.call_one("queued before the stop ran")
    assert stop.get(timeout=T) == "finished"
    assert queued.get(timeout=T) == ["queued before the stop ran"]
    with pytest.raises(SupervisionError):
        actors.record.call_one("after").get(timeout=T)
    assert faults.for_mesh(name) == []


def test_an_async_endpoint_stops_its_actor_and_the_mesh_stop_still_completes(procs, faults) -> None:  # type: ignore[no-untyped-def]
    name = fresh("stops_itself_async")
    actors = procs.spawn(name, StopsItself)
    assert list(actors.afinish.call().get(timeout=T).values()) == ["finished"] * 4
    with pytest.raises(SupervisionError):
        actors.record.call("after").get(timeout=T)
    actors.stop().get(timeout=T)  # stopping a mesh whose actors stopped themselves
    assert faults.for_mesh(name) == []


def test_a_mesh_stop_through_the_cast_tree_of_actors_that_stopped_themselves_completes(client_script) -> None:  # type: ignore[no-untyped-def]
    # MONARCH_CAST_TREE_MIN=2: the mesh's stop travels through its cast tree (as for meshes of 128 actors and more)
    out = client_script(
        """
from monarch_core.actor import Actor, context, endpoint, this_host

class S(Actor):
    @endpoint
    def finish(self) -> str:
        context().actor_instance.stop("done")
        return "finished"

procs = this_host().spawn_procs(per_host={"gpus": 3})
actors = procs.spawn("s", S)
print(list(actors.finish.call().get(timeout=30).values()))
print("stop:", actors.stop().get(timeout=30))
procs.stop().get(timeout=30)
""", env={"MONARCH_CAST_TREE_MIN": "2"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "['finished', 'finished', 'finished']" in out.stdout
    assert "stop: None" in out.stdout
