"""The context API (``context``, ``current_rank``, ``current_size``,
``current_actor_name``) and the ``Point`` / ``Extent`` types."""

from __future__ import annotations


import pytest

from monarch_core.actor import (
    Actor,
    Context,
    Extent,
    Point,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
)

from _helpers import fresh


class Probe(Actor):
    def __init__(self) -> None:
        self.init_rank = current_rank()
        self.init_name = current_actor_name()

    @endpoint
    def probe(self) -> tuple:
        r = current_rank()
        assert isinstance(r, Point)
        ctx = context()
        assert isinstance(ctx, Context)
        assert ctx.actor_instance is not None
        assert ctx.message_rank == r
        return (r.rank, dict(r), current_size(), current_actor_name())

    @endpoint
    async def aprobe(self) -> tuple:
        r = current_rank()
        return (r.rank, dict(r), current_size())

    @endpoint
    def point_details(self) -> tuple:
        r = current_rank()
        return (r.rank, list(r.keys()), list(r.values()), r.extent, {k: r.size(k) for k in r})

    @endpoint
    def init_info(self) -> tuple:
        return (self.init_rank.rank, dict(self.init_rank), self.init_name)


# ---------------------------------------------------------------- inside endpoints


def test_rank_and_size_on_full_mesh(procs) -> None:
    p = procs.spawn(fresh("probe"), Probe)
    got = p.probe.call().get().values()
    assert [g[0] for g in got] == [0, 1, 2, 3]
    assert [g[1] for g in got] == [{"gpus": i} for i in range(4)]
    assert [g[2] for g in got] == [{"gpus": 4}] * 4


def test_async_endpoint_sees_its_rank(procs) -> None:
    p = procs.spawn(fresh("probe"), Probe)
    assert p.aprobe.call().get().values() == [(i, {"gpus": i}, {"gpus": 4}) for i in range(4)]


def test_rank_is_within_the_sliced_mesh(procs) -> None:
    p = procs.spawn(fresh("probe"), Probe)
    got = p.slice(gpus=slice(2, 4)).probe.call().get().values()
    assert [(g[0], g[1], g[2]) for g in got] == [
        (0, {"gpus": 0}, {"gpus": 2}),
        (1, {"gpus": 1}, {"gpus": 2}),
    ]
    # stepped slice
    got = p.slice(gpus=slice(1, 4, 2)).aprobe.call().get().values()
    assert got == [(0, {"gpus": 0}, {"gpus": 2}), (1, {"gpus": 1}, {"gpus": 2})]


def test_integer_slice_removes_dimension(procs) -> None:
    p = procs.spawn(fresh("probe"), Probe)
    rank, coords, size, _name = p.slice(gpus=3).probe.call_one().get()
    assert (rank, coords, size) == (0, {}, {})


def test_rank_in_2d_slices(procs2d) -> None:
    p = procs2d.spawn(fresh("probe"), Probe)
    assert p.aprobe.call().get().values() == [
        (0, {"dp": 0, "tp": 0}, {"dp": 2, "tp": 2}),
        (1, {"dp": 0, "tp": 1}, {"dp": 2, "tp": 2}),
        (2, {"dp": 1, "tp": 0}, {"dp": 2, "tp": 2}),
        (3, {"dp": 1, "tp": 1}, {"dp": 2, "tp": 2}),
    ]
    assert p.slice(tp=1).aprobe.call().get().values() == [
        (0, {"dp": 0}, {"dp": 2}),
        (1, {"dp": 1}, {"dp": 2}),
    ]
    assert p.slice(dp=1).aprobe.call().get().values() == [
        (0, {"tp": 0}, {"tp": 2}),
        (1, {"tp": 1}, {"tp": 2}),
    ]


def test_rank_in_renamed_and_flattened_meshes(procs2d) -> None:
    p = procs2d.spawn(fresh("probe"), Probe)
    assert [v[1] for v in p.rename(dp="x").aprobe.call().get().values()] == [
        {"x": 0, "tp": 0},
        {"x": 0, "tp": 1},
        {"x": 1, "tp": 0},
        {"x": 1, "tp": 1},
    ]
    assert p.flatten("all").aprobe.call().get().values() == [
        (i, {"all": i}, {"all": 4}) for i in range(4)
    ]


def test_point_details_inside_endpoint(procs2d) -> None:
    p = procs2d.spawn(fresh("probe"), Probe)
    rank, keys, values, extent, sizes = p.slice(dp=1, tp=slice(0, 2)).point_details.call().get().item(tp=1)
    assert rank == 1
    assert keys == ["tp"]
    assert values == [1]
    assert extent == Extent(["tp"], [2])
    assert sizes == {"tp": 2}


def test_actor_names(procs) -> None:
    name = fresh("named")
    p = procs.spawn(name, Probe)
    names = [g[3] for g in p.probe.call().get().values()]
    assert all(isinstance(n, str) and name in n for n in names)
    assert len(set(names)) == 4
    assert current_actor_name() not in names
    # the name is the actor's, not the message's: the same from a slice
    assert p.slice(gpus=2).probe.call_one().get()[3] == names[2]


def test_context_in_init(procs) -> None:
    name = fresh("named")
    p = procs.spawn(name, Probe)
    infos = p.init_info.call().get().values()
    assert [(i[0], i[1]) for i in infos] == [(r, {"gpus": r}) for r in range(4)]
    probes = p.probe.call().get().values()
    assert [i[2] for i in infos] == [pr[3] for pr in probes]


# ---------------------------------------------------------------- on the client


def test_client_context() -> None:
    ctx = context()
    assert isinstance(ctx, Context)
    assert ctx.actor_instance is not None
    r = current_rank()
    assert isinstance(r, Point)
    assert r.rank == 0
    assert current_size() == {}
    name = current_actor_name()
    assert isinstance(name, str) and name
    assert current_actor_name() == name


# ---------------------------------------------------------------- Point / Extent


def test_extent() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    assert list(e.keys()) == ["hosts", "gpus"]
    assert e.nelements == 8
    assert e == Extent(["hosts", "gpus"], [2, 4])
    assert e != Extent(["hosts", "gpus"], [4, 2])
    assert e.region is not None
    assert Extent([], []).nelements == 1


def test_point_is_a_mapping() -> None:
    e = Extent(["hosts", "gpus"], [2, 4])
    p = Point(6, e)
    assert p.rank == 6
    assert p.extent == e
    assert p["hosts"] == 1 and p["gpus"] == 2
    assert dict(p) == {"hosts": 1, "gpus": 2}
    assert list(p.keys()) == ["hosts", "gpus"]
    assert list(p.values()) == [1, 2]
    assert list(p.items()) == [("hosts", 1), ("gpus", 2)]
    assert p.get("gpus") == 2
    assert p.get("nope") is None
    assert p.get("nope", 7) == 7
    assert len(p) == 2
    assert "gpus" in p and "nope" not in p
    assert p.size("gpus") == 4 and p.size("hosts") == 2
    assert Point(6, e) == p
    with pytest.raises(KeyError):
        p["nope"]


def test_points_enumerate_row_major() -> None:
    e = Extent(["a", "b", "c"], [2, 3, 2])
    coords = [dict(Point(r, e)) for r in range(e.nelements)]
    expected = [{"a": a, "b": b, "c": c} for a in range(2) for b in range(3) for c in range(2)]
    assert coords == expected
