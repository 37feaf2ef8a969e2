"""An actor runs without an asyncio loop until something needs one
(``_proc._mailbox``): a synchronous actor never makes one for its endpoint
messages; the first item that needs a loop makes it, and the actor goes on on
it with nothing lost and nothing reordered.  White-box where it asks whether
the actor has a loop (``Mailbox.own_loop``); everything else through the
public API, in real procs."""

from __future__ import annotations

import asyncio

import pytest

from monarch_core.actor import Actor, context, endpoint, this_host

from _helpers import T, fresh


def _has_loop() -> bool:
    return context().actor_instance._host._mailbox.own_loop is not None


class Sync(Actor):
    def __init__(self) -> None:
        self.log: list[int] = []

    @endpoint
    def has_loop(self) -> bool:
        return _has_loop()

    @endpoint
    def running_loop(self) -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    @endpoint
    def later(self, i: int, delay: float) -> object:
        """Synchronous, but returns an awaitable: awaited on the actor's loop, before the next message."""

        async def note() -> int:
            await asyncio.sleep(delay)
            self.log.append(i)
            return i

        return note()

    @endpoint
    def note(self, i: int) -> int:
        self.log.append(i)
        return i

    @endpoint
    def get_log(self) -> list[int]:
        return list(self.log)

    @endpoint
    def fail(self) -> None:
        raise ValueError("boom")


class Async(Actor):
    @endpoint
    async def has_loop(self) -> bool:
        return _has_loop()


@pytest.fixture
def procs():  # type: ignore[no-untyped-def]
    pm = this_host().spawn_procs(per_host={"p": 1})
    # The proc's first actor reads the proc's sockets while idle, on a loop from the start: not these.
    assert pm.spawn(fresh("first"), Sync).has_loop.call_one().get(timeout=T) is True
    try:
        yield pm
    finally:
        pm.stop().get(timeout=T)


def test_a_synchronous_actor_handles_its_messages_without_a_loop(procs) -> None:  # type: ignore[no-untyped-def]
    a = procs.spawn(fresh("sync"), Sync)
    futs = [a.note.call_one(i) for i in range(50)]
    assert [f.get(timeout=T) for f in futs] == list(range(50))
    assert a.get_log.call_one().get(timeout=T) == list(range(50))
    assert a.running_loop.call_one().get(timeout=T) is False
    assert a.has_loop.call_one().get(timeout=T) is False


def test_an_async_actor_has_its_loop_from_its_construction(procs) -> None:  # type: ignore[no-untyped-def]
    assert procs.spawn(fresh("async"), Async).has_loop.call_one().get(timeout=T) is True


def test_the_first_awaitable_makes_the_loop_and_what_was_queued_behind_it_keeps_its_order(  # type: ignore[no-untyped-def]
        procs) -> None:
    a = procs.spawn(fresh("switch"), Sync)
    assert a.has_loop.call_one().get(timeout=T) is False
    # Queued together: the awaitable is finished on the new loop before the notes behind it run.
    first = a.later.call_one(0, 0.3)
    rest = [a.note.call_one(i) for i in range(1, 20)]
    assert first.get(timeout=T) == 0
    assert [f.get(timeout=T) for f in rest] == list(range(1, 20))
    assert a.get_log.call_one().get(timeout=T) == list(range(20))
    assert a.has_loop.call_one().get(timeout=T) is True
    assert a.running_loop.call_one().get(timeout=T) is False  # (sync code still sees none)
    assert a.later.call_one(20, 0.0).get(timeout=T) == 20  # and the loop goes on serving


def test_a_failing_endpoint_and_a_stop_of_a_loopless_actor_behave_as_before(procs) -> None:  # type: ignore[no-untyped-def]
    a = procs.spawn(fresh("stop"), Sync)
    with pytest.raises(Exception, match="boom"):
        a.fail.call_one().get(timeout=T)
    assert a.note.call_one(1).get(timeout=T) == 1  # an endpoint's exception does not kill the actor
    b = procs.spawn(fresh("stopped"), Sync)
    assert b.note.call_one(1).get(timeout=T) == 1
    b.stop().get(timeout=T)  # (its stop runs on a loop made for it)
    with pytest.raises(Exception, match="stopped"):
        b.note.call_one(2).get(timeout=T)
    assert a.note.call_one(2).get(timeout=T) == 2
