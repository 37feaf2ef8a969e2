"""Programs written for the reference, run unchanged: sync endpoints see no
asyncio loop, and ``PortReceiver.recv()`` futures claim a message when they
are first observed (the spec's "observation" wording for ``Future``)."""

from __future__ import annotations

import asyncio
import warnings

import pytest

from monarch_core.actor import Actor, Channel, Future, endpoint, this_proc

from _helpers import T, fresh


async def _double(x: int) -> int:
    await asyncio.sleep(0)
    return 2 * x


class Peer(Actor):
    @endpoint
    def value(self) -> int:
        return 41


class SyncCode(Actor):
    """Sync endpoints written as plain synchronous code."""

    def __init__(self, peer=None) -> None:  # noqa: ANN001
        self.peer = peer
        try:
            asyncio.get_running_loop()
            self.loop_in_init = True
        except RuntimeError:
            self.loop_in_init = False

    @endpoint
    def sees_a_loop(self) -> bool:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    @endpoint
    def saw_a_loop_in_init(self) -> bool:
        return self.loop_in_init

    @endpoint
    def runs_its_own_loop(self, x: int) -> tuple[int, list[str]]:
        """``asyncio.run`` inside a sync endpoint, as plain sync code does."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = asyncio.run(_double(x))
            again = asyncio.run(_double(got))  # twice: nothing left behind by the first
        return again, [str(w.message) for w in caught]

    @endpoint
    def blocks_on_a_future(self) -> tuple[int, list[str]]:
        """``Future.get()`` from sync code: no loop to block, no warning."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            v = self.peer.value.call_one().get(timeout=10)
        return v + 1, [str(w.message) for w in caught]

    @endpoint
    def wraps_a_coroutine(self, x: int) -> int:
        """A Future(coro=...) driven from sync code."""
        return Future(coro=_double(x)).get(timeout=10)

    @endpoint
    async def async_sees_its_loop(self) -> bool:
        asyncio.get_running_loop()
        await asyncio.sleep(0)
        return True


def test_sync_endpoints_see_no_asyncio_loop(procs) -> None:
    peer = procs.spawn(fresh("peer"), Peer).slice(gpus=1)
    m = procs.spawn(fresh("synccode"), SyncCode, peer).slice(gpus=0)
    assert m.sees_a_loop.call_one().get(timeout=T) is False
    assert m.saw_a_loop_in_init.call_one().get(timeout=T) is False
    assert m.runs_its_own_loop.call_one(5).get(timeout=T) == (20, [])
    assert m.blocks_on_a_future.call_one().get(timeout=T) == (42, [])
    assert m.wraps_a_coroutine.call_one(4).get(timeout=T) == 8
    # async endpoints still run on the actor's loop, and sync ones after them still see none
    assert m.async_sees_its_loop.call_one().get(timeout=T) is True
    assert m.sees_a_loop.call_one().get(timeout=T) is False
    assert m.runs_its_own_loop.call_one(1).get(timeout=T) == (4, [])


def test_sync_endpoints_of_a_local_actor_see_no_loop() -> None:
    """The same on an actor of the client's own proc (this_proc())."""
    m = this_proc().spawn(fresh("local_sync"), SyncCode)
    try:
        assert m.sees_a_loop.call_one().get(timeout=T) is False
        assert m.runs_its_own_loop.call_one(2).get(timeout=T) == (8, [])
    finally:
        m.stop().get(timeout=T)


# ---------------------------------------------------------------- recv: claimed when observed


def test_recv_futures_receive_in_the_order_they_are_observed() -> None:
    port, recv = Channel.open()
    f1 = recv.recv()
    f2 = recv.recv()
    port.send("first")
    port.send("second")
    assert f2.get(timeout=T) == "first"  # observed first: the first message
    assert f1.get(timeout=T) == "second"


def test_a_recv_future_dropped_unobserved_claims_nothing() -> None:
    port, recv = Channel.open()
    for _ in range(3):
        recv.recv()  # never observed
    port.send("a")
    port.send("b")
    assert recv.recv().get(timeout=T) == "a"
    assert recv.recv().get(timeout=T) == "b"


def test_a_recv_future_claims_on_await_and_as_asyncio() -> None:
    port, recv = Channel.open()

    async def main() -> list:
        fa = recv.recv()
        fb = recv.recv()
        fc = recv.recv()
        af = fc.as_asyncio()  # observed first
        port.send(1)
        port.send(2)
        port.send(3)
        first = await af
        second = await fb  # then fb, then fa
        third = await fa
        return [first, second, third]

    assert asyncio.run(main()) == [1, 2, 3]


def test_as_asyncio_off_a_loop_claims_nothing() -> None:
    port, recv = Channel.open()
    f = recv.recv()
    with pytest.raises(RuntimeError):
        f.as_asyncio()  # no running loop: not an observation
    g = recv.recv()
    port.send("x")
    port.send("y")
    assert g.get(timeout=T) == "x"
    assert f.get(timeout=T) == "y"


def test_a_timed_out_recv_keeps_its_claim() -> None:
    port, recv = Channel.open()
    f = recv.recv()
    with pytest.raises(TimeoutError):
        f.get(timeout=0.05)  # observed: it holds the next message
    later = recv.recv()
    port.send("mine")
    port.send("theirs")
    assert f.get(timeout=T) == "mine"
    assert later.get(timeout=T) == "theirs"


class Collector(Actor):
    """Receiving inside an actor, observed out of creation order."""

    @endpoint
    async def gather(self, n: int, port) -> list:  # noqa: ANN001
        p, r = Channel.open()
        futs = [r.recv() for _ in range(n)]
        port.send(p)
        out = []
        for f in reversed(futs):
            out.append(await f)
        return out


def test_recv_observation_order_inside_an_actor(procs) -> None:
    c = procs.spawn(fresh("collector"), Collector).slice(gpus=2)
    back, got = Channel.open(once=True)
    res = c.gather.call_one(3, back)
    p = got.recv().get(timeout=T)
    for i in range(3):
        p.send(i)
    assert res.get(timeout=T) == [0, 1, 2]
