"""The messaging adverbs: ``call``, ``call_one``, ``choose``, ``stream``,
``broadcast``, ``rref``, plus ``send`` and ``Accumulator``."""

from __future__ import annotations

import os

import pytest

from monarch_core.actor import (
    Accumulator,
    Actor,
    Channel,
    Point,
    ValueMesh,
    current_rank,
    current_size,
    endpoint,
    send,
)

from _helpers import fresh


class Worker(Actor):
    def __init__(self) -> None:
        self.total = 0
        self.seen: list = []

    @endpoint
    def rank(self) -> int:
        return current_rank().rank

    @endpoint
    def where(self) -> tuple:
        return (current_rank().rank, dict(current_rank()), current_size(), os.getpid())

    @endpoint
    def times(self, k: int) -> int:
        return k * current_rank().rank

    @endpoint
    def add(self, x: int) -> int:
        self.total += x
        self.seen.append(x)
        return self.total

    @endpoint
    def get_total(self) -> int:
        return self.total

    @endpoint
    def get_seen(self) -> list:
        return list(self.seen)


# ---------------------------------------------------------------- call


def test_call_returns_value_mesh(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    vm = w.times.call(10).get()
    assert isinstance(vm, ValueMesh)
    assert vm.values() == [0, 10, 20, 30]
    assert vm.sizes == {"gpus": 4}
    assert vm.size() == 4
    assert vm.item(gpus=2) == 20
    assert vm.get(3) == 30
    items = list(vm.items())
    assert [v for _p, v in items] == [0, 10, 20, 30]
    assert [dict(p) for p, _v in items] == [{"gpus": i} for i in range(4)]
    assert all(isinstance(p, Point) for p, _v in items)
    assert [p.rank for p, _v in items] == [0, 1, 2, 3]


def test_value_mesh_iterates_like_the_reference(procs) -> None:
    """A program written for the reference: ``for point, value in vm``."""
    w = procs.spawn(fresh("w"), Worker)
    seen = {}
    for point, value in w.times.call(10).get():
        seen[point["gpus"]] = value
        assert point.rank == point["gpus"]
    assert seen == {0: 0, 1: 10, 2: 20, 3: 30}


def test_call_on_2d_mesh(procs2d) -> None:
    w = procs2d.spawn(fresh("w"), Worker)
    vm = w.where.call().get()
    assert vm.sizes == {"dp": 2, "tp": 2}
    for rank, (point, (r, coords, size, _pid)) in enumerate(vm.items()):
        assert point.rank == rank == r
        assert dict(point) == coords == {"dp": rank // 2, "tp": rank % 2}
        assert size == {"dp": 2, "tp": 2}
    assert vm.item(dp=1, tp=0)[0] == 2
    assert len({pid for (_r, _c, _s, pid) in vm.values()}) == 4


def test_value_mesh_item_bad_coordinates(procs2d) -> None:
    vm = procs2d.spawn(fresh("w"), Worker).rank.call().get()
    with pytest.raises(KeyError):
        vm.item(dp=0)  # missing tp
    with pytest.raises(KeyError):
        vm.item(dp=0, tp=0, bogus=1)


# ---------------------------------------------------------------- call_one


def test_call_one_on_single_actor(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    assert w.slice(gpus=3).add.call_one(5).get() == 5
    assert w.slice(gpus=3).get_total.call_one().get() == 5


def test_call_one_on_many_raises_value_error_before_sending(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    with pytest.raises(ValueError):
        w.add.call_one(1)
    with pytest.raises(ValueError):
        w.slice(gpus=slice(0, 2)).add.call_one(1)
    # nothing was sent anywhere
    assert w.get_total.call().get().values() == [0, 0, 0, 0]


# ---------------------------------------------------------------- choose


def test_choose_picks_one_actor(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    futs = [w.rank.choose() for _ in range(12)]
    ranks = [f.get() for f in futs]
    assert all(isinstance(r, int) and 0 <= r < 4 for r in ranks)


def test_choose_runs_exactly_once(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    assert w.add.choose(7).get() == 7
    assert sorted(w.get_total.call().get().values()) == [0, 0, 0, 7]


def test_choose_on_slice_stays_in_slice(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    sub = w.slice(gpus=slice(2, 4))
    for _ in range(6):
        _r, coords, size, _pid = sub.where.choose().get()
        assert size == {"gpus": 2}
        assert coords["gpus"] in (0, 1)
    totals_before = w.get_total.call().get().values()
    sub.add.choose(1).get()
    totals = w.get_total.call().get().values()
    assert totals[:2] == totals_before[:2] == [0, 0]
    assert sorted(totals[2:]) == [0, 1]


# ---------------------------------------------------------------- stream


def test_stream_yields_every_rank_once(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    futs = list(w.times.stream(3))
    assert len(futs) == 4
    assert sorted(f.get() for f in futs) == [0, 3, 6, 9]


def test_stream_on_slice(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    got = sorted(f.get() for f in w.slice(gpus=slice(1, 4)).rank.stream())
    assert got == [0, 1, 2]


def test_stream_iterates_lazily_as_futures(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    seen = []
    for f in w.rank.stream():
        seen.append(f.get())
    assert sorted(seen) == [0, 1, 2, 3]


# ---------------------------------------------------------------- broadcast


def test_broadcast_effect_is_seen_by_later_call(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    assert w.add.broadcast(5) is None
    w.add.broadcast(6)
    # messages from one sender are delivered in order
    assert w.get_seen.call().get().values() == [[5, 6]] * 4
    assert w.get_total.call().get().values() == [11] * 4


def test_broadcast_on_slice(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    w.slice(gpus=slice(0, 4, 2)).add.broadcast(1)
    assert w.get_total.call().get().values() == [1, 0, 1, 0]


# ---------------------------------------------------------------- send


def test_send_all_with_port(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    port, recv = Channel.open()
    assert send(w.times, (2,), {}, port=port, selection="all") is None
    got = sorted(recv.recv().get() for _ in range(4))
    assert got == [0, 2, 4, 6]


def test_send_all_with_ranked_port(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    port, recv = Channel.open_ranked()
    send(w.times, (), {"k": 5}, port=port)
    got = sorted(recv.recv().get() for _ in range(4))
    assert got == [(0, 0), (1, 5), (2, 10), (3, 15)]


def test_send_choose_reaches_one_actor(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    send(w.add, (9,), {}, selection="choose")
    # FIFO per sender: the later call observes the send on whichever actor got it
    assert sorted(w.get_total.call().get().values()) == [0, 0, 0, 9]


def test_send_without_port_is_fire_and_forget(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    send(w.add, (4,), {})
    assert w.get_total.call().get().values() == [4, 4, 4, 4]


def test_send_checks_arguments(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    with pytest.raises(TypeError):
        send(w.add, (1, 2, 3), {})
    assert w.get_total.call().get().values() == [0, 0, 0, 0]


# ---------------------------------------------------------------- Accumulator


def test_accumulator_sums(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    acc = Accumulator(w.rank, 0, lambda a, b: a + b)
    assert acc.accumulate().get() == 6
    acc2 = Accumulator(w.times, 100, lambda a, b: a + b)
    assert acc2.accumulate(10).get() == 160
    assert acc2.accumulate(k=1).get() == 106


def test_accumulator_on_slice_collects_every_value(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    acc = Accumulator(w.slice(gpus=slice(1, 4)).times, (), lambda a, b: a + (b,))
    assert sorted(acc.accumulate(2).get()) == [0, 2, 4]


# ---------------------------------------------------------------- rref


def test_rref_needs_tensor_engine(procs) -> None:
    w = procs.spawn(fresh("w"), Worker)
    with pytest.raises((RuntimeError, ImportError)):  # outside activate(); no engine: install it
        w.rank.rref()
