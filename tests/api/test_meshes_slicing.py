"""Mesh geometry on ``HostMesh``, ``ProcMesh``, actor meshes and
``ValueMesh``: ``slice``, ``rename``, ``split``, ``flatten``, ``size``,
``sizes``, ``extent`` and their errors; spawning on sliced meshes."""

from __future__ import annotations

import os

import pytest

from monarch_core.actor import (
    Actor,
    Extent,
    HostMesh,
    ProcMesh,
    ValueMesh,
    current_rank,
    current_size,
    endpoint,
    this_host,
)

from _helpers import fresh


class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def where(self) -> tuple:
        return (dict(current_rank()), current_size(), os.getpid())


def check_geometry_ops(mesh, kind: type) -> None:  # noqa: ANN001
    """Common checks for a mesh of extent {"dp": 2, "tp": 2}."""
    assert isinstance(mesh, kind)
    assert mesh.sizes == {"dp": 2, "tp": 2}
    assert mesh.extent == Extent(["dp", "tp"], [2, 2])
    assert mesh.size() == 4
    assert mesh.size("dp") == 2
    assert mesh.size("tp") == 2

    s = mesh.slice(dp=1)
    assert isinstance(s, kind)
    assert s.sizes == {"tp": 2}
    s = mesh.slice(dp=slice(0, 1), tp=1)
    assert s.sizes == {"dp": 1}
    assert mesh.slice(dp=0, tp=0).sizes == {}
    assert mesh.slice(dp=0, tp=0).size() == 1

    r = mesh.rename(dp="x", tp="y")
    assert isinstance(r, kind)
    assert r.sizes == {"x": 2, "y": 2}
    assert mesh.rename(tp="z").sizes == {"dp": 2, "z": 2}

    f = mesh.flatten("all")
    assert isinstance(f, kind)
    assert f.sizes == {"all": 4}

    sp = mesh.flatten("n").split(n=("a", "b"), b=2)
    assert isinstance(sp, kind)
    assert sp.sizes == {"a": 2, "b": 2}
    sp = mesh.split(tp=("t1", "t2"), t2=1)
    assert sp.sizes == {"dp": 2, "t1": 2, "t2": 1}

    with pytest.raises(TypeError):
        mesh.slice(bogus=0)
    with pytest.raises(TypeError):
        mesh.rename(bogus="x")
    with pytest.raises(KeyError, match="has no dimension 'bogus'; its dimensions are \\['dp', 'tp'\\]"):
        mesh.size("bogus")  # a lookup, as in the reference
    with pytest.raises(IndexError):
        mesh.slice(dp=2)
    with pytest.raises(IndexError):
        mesh.slice(tp=5)


# ---------------------------------------------------------------- ProcMesh


def test_proc_mesh_geometry(procs2d) -> None:
    check_geometry_ops(procs2d, ProcMesh)


def test_proc_mesh_initialized(procs, procs2d) -> None:
    assert procs.initialized.get() is True
    assert procs2d.initialized.get() is True
    assert procs.sizes == {"gpus": 4}


def test_spawn_on_sliced_proc_mesh_uses_those_procs(procs) -> None:
    full = procs.spawn(fresh("pid"), Pid)
    pids = full.pid.call().get().values()
    assert len(set(pids)) == 4
    sub = procs.slice(gpus=slice(1, 3)).spawn(fresh("pid"), Pid)
    assert sub.sizes == {"gpus": 2}
    assert sub.where.call().get().values() == [
        ({"gpus": 0}, {"gpus": 2}, pids[1]),
        ({"gpus": 1}, {"gpus": 2}, pids[2]),
    ]
    single = procs.slice(gpus=3).spawn(fresh("pid"), Pid)
    assert single.pid.call_one().get() == pids[3]


def test_spawn_on_split_proc_mesh(procs) -> None:
    pids = procs.spawn(fresh("pid"), Pid).pid.call().get().values()
    split = procs.split(gpus=("a", "b"), b=2)
    assert split.sizes == {"a": 2, "b": 2}
    m = split.spawn(fresh("pid"), Pid)
    assert m.where.call().get().values() == [
        ({"a": 0, "b": 0}, {"a": 2, "b": 2}, pids[0]),
        ({"a": 0, "b": 1}, {"a": 2, "b": 2}, pids[1]),
        ({"a": 1, "b": 0}, {"a": 2, "b": 2}, pids[2]),
        ({"a": 1, "b": 1}, {"a": 2, "b": 2}, pids[3]),
    ]


# ---------------------------------------------------------------- actor meshes


def test_actor_mesh_geometry(procs2d) -> None:
    m = procs2d.spawn(fresh("pid"), Pid)
    check_geometry_ops(m, type(m))


def test_actor_mesh_slices_route_to_right_actors(procs2d) -> None:
    m = procs2d.spawn(fresh("pid"), Pid)
    pids = m.pid.call().get().values()
    assert m.slice(dp=1).pid.call().get().values() == pids[2:]
    assert m.slice(tp=0).pid.call().get().values() == [pids[0], pids[2]]
    assert m.slice(dp=1, tp=0).pid.call_one().get() == pids[2]
    assert m.flatten("n").slice(n=slice(1, 3)).pid.call().get().values() == pids[1:3]
    assert m.rename(dp="x").slice(x=0).pid.call().get().values() == pids[:2]
    assert m.slice(dp=0).slice(tp=1).pid.call_one().get() == pids[1]
    # negative index counts from the end
    assert m.slice(dp=-1, tp=-1).pid.call_one().get() == pids[3]


def test_actor_mesh_split_routes(procs) -> None:
    m = procs.spawn(fresh("pid"), Pid)
    pids = m.pid.call().get().values()
    sp = m.split(gpus=("a", "b"), b=2)
    assert sp.sizes == {"a": 2, "b": 2}
    assert sp.slice(a=1).pid.call().get().values() == pids[2:]
    assert sp.slice(b=0).pid.call().get().values() == [pids[0], pids[2]]


# ---------------------------------------------------------------- ValueMesh


def test_value_mesh_geometry(procs2d) -> None:
    vm = procs2d.spawn(fresh("pid"), Pid).where.call().get()
    check_geometry_ops(vm, ValueMesh)


def test_value_mesh_slicing_values(procs2d) -> None:
    vm = procs2d.spawn(fresh("pid"), Pid).where.call().get()
    coords = [v[0] for v in vm.values()]
    assert coords == [{"dp": 0, "tp": 0}, {"dp": 0, "tp": 1}, {"dp": 1, "tp": 0}, {"dp": 1, "tp": 1}]
    assert [v[0] for v in vm.slice(tp=1).values()] == [coords[1], coords[3]]
    assert vm.slice(dp=1, tp=0).item() == vm.item(dp=1, tp=0)
    assert [v[0] for v in vm.flatten("n").values()] == coords
    assert vm.flatten("n").item(n=3) == vm.get(3)
    assert vm.rename(dp="x").item(x=1, tp=1) == vm.item(dp=1, tp=1)
    sub = vm.slice(dp=1)
    assert [p.rank for p, _v in sub.items()] == [0, 1]
    assert [dict(p) for p, _v in sub.items()] == [{"tp": 0}, {"tp": 1}]
    assert sub.get(1) == vm.get(3)


# ---------------------------------------------------------------- HostMesh


def test_this_host_is_a_host_mesh() -> None:
    h = this_host()
    assert isinstance(h, HostMesh)
    assert h.sizes == {}
    assert h.size() == 1
    with pytest.raises(TypeError):
        h.slice(hosts=0)


def test_host_mesh_geometry(hosts2) -> None:
    assert isinstance(hosts2, HostMesh)
    assert hosts2.sizes == {"hosts": 2}
    assert hosts2.extent == Extent(["hosts"], [2])
    assert hosts2.size() == 2
    assert hosts2.size("hosts") == 2
    assert hosts2.slice(hosts=1).sizes == {}
    assert hosts2.slice(hosts=slice(0, 1)).sizes == {"hosts": 1}
    assert hosts2.rename(hosts="nodes").sizes == {"nodes": 2}
    assert hosts2.split(hosts=("a", "b"), b=2).sizes == {"a": 1, "b": 2}
    assert hosts2.flatten("x").sizes == {"x": 2}
    assert isinstance(hosts2.slice(hosts=0), HostMesh)
    with pytest.raises(TypeError):
        hosts2.slice(gpus=0)
    with pytest.raises(IndexError):
        hosts2.slice(hosts=2)


def test_spawn_procs_on_host_mesh(hosts2) -> None:
    pm = hosts2.spawn_procs(per_host={"gpus": 2})
    try:
        assert pm.sizes == {"hosts": 2, "gpus": 2}
        assert pm.initialized.get() is True
        m = pm.spawn(fresh("pid"), Pid)
        got = m.where.call().get().values()
        assert [g[0] for g in got] == [
            {"hosts": 0, "gpus": 0},
            {"hosts": 0, "gpus": 1},
            {"hosts": 1, "gpus": 0},
            {"hosts": 1, "gpus": 1},
        ]
        assert len({g[2] for g in got}) == 4
        assert m.slice(hosts=1).where.call().get().values() == [
            ({"gpus": 0}, {"gpus": 2}, got[2][2]),
            ({"gpus": 1}, {"gpus": 2}, got[3][2]),
        ]
    finally:
        pm.stop().get()


def test_spawn_procs_on_sliced_host_mesh(hosts2) -> None:
    pm = hosts2.slice(hosts=1).spawn_procs(per_host={"gpus": 1})
    try:
        assert pm.sizes == {"gpus": 1}
        m = pm.spawn(fresh("pid"), Pid)
        assert m.where.call_one().get()[:2] == ({"gpus": 0}, {"gpus": 1})
    finally:
        pm.stop().get()
