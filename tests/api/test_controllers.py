"""``get_or_spawn_controller``, ``this_proc()`` / ``this_host()`` from the
client and from inside actors, and actors that spawn their own procs."""

from __future__ import annotations

import os

from monarch_core.actor import (
    Actor,
    Future,
    HostMesh,
    ProcMesh,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    get_or_spawn_controller,
    this_host,
    this_proc,
)

from _helpers import fresh


class Registry(Actor):
    def __init__(self, start: int = 0) -> None:
        self.n = start

    @endpoint
    def incr(self) -> int:
        self.n += 1
        return self.n

    @endpoint
    def ident(self) -> tuple:
        return (current_actor_name(), os.getpid())


class Leaf(Actor):
    def __init__(self, tag: str = "") -> None:
        self.tag = tag

    @endpoint
    def info(self) -> tuple:
        return (self.tag, current_rank().rank, current_size(), os.getpid())

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Parent(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def use_controller(self, name: str) -> tuple:
        ctl = await get_or_spawn_controller(name, Registry)
        n = await ctl.incr.call_one()
        ident = await ctl.ident.call_one()
        return (n, ident)

    @endpoint
    def use_controller_sync(self, name: str) -> int:
        ctl = get_or_spawn_controller(name, Registry).get()
        return ctl.incr.call_one().get()

    @endpoint
    def mesh_kinds(self) -> tuple:
        return (isinstance(this_host(), HostMesh), isinstance(this_proc(), ProcMesh))

    @endpoint
    async def spawn_local(self, tag: str) -> tuple:
        leaf = this_proc().spawn(fresh("leaf"), Leaf, tag)
        return (os.getpid(), await leaf.info.call_one())

    @endpoint
    async def spawn_own_procs(self) -> tuple:
        pm = this_host().spawn_procs(per_host={"w": 2})
        try:
            assert await pm.initialized is True
            leaves = pm.spawn(fresh("leaf"), Leaf, "child")
            vm = await leaves.info.call()
            return (os.getpid(), pm.sizes, vm.values())
        finally:
            await pm.stop()


# ---------------------------------------------------------------- controllers


def test_controller_is_a_singleton_from_the_client() -> None:
    name = fresh("ctl")
    f = get_or_spawn_controller(name, Registry)
    assert isinstance(f, Future)
    a = f.get()
    b = get_or_spawn_controller(name, Registry).get()
    assert a.incr.call_one().get() == 1
    assert b.incr.call_one().get() == 2
    assert a.ident.call_one().get() == b.ident.call_one().get()


def test_controller_constructor_args_used_once() -> None:
    name = fresh("ctl")
    a = get_or_spawn_controller(name, Registry, 100).get()
    assert a.incr.call_one().get() == 101
    b = get_or_spawn_controller(name, Registry, 5).get()  # already exists
    assert b.incr.call_one().get() == 102


def test_different_names_are_different_controllers() -> None:
    n1, n2 = fresh("ctl"), fresh("ctl")
    a = get_or_spawn_controller(n1, Registry).get()
    b = get_or_spawn_controller(n2, Registry).get()
    assert a.incr.call_one().get() == 1
    assert a.incr.call_one().get() == 2
    assert b.incr.call_one().get() == 1
    assert a.ident.call_one().get()[0] != b.ident.call_one().get()[0]


def test_controller_shared_between_client_and_actors(procs) -> None:
    name = fresh("ctl")
    ctl = get_or_spawn_controller(name, Registry).get()
    client_ident = ctl.ident.call_one().get()
    assert ctl.incr.call_one().get() == 1
    parents = procs.spawn(fresh("parent"), Parent)
    n, ident = parents.slice(gpus=2).use_controller.call_one(name).get()
    assert n == 2
    assert ident == client_ident
    # every actor reaches the same controller
    results = parents.use_controller.call(name).get().values()
    assert sorted(r[0] for r in results) == [3, 4, 5, 6]
    assert {r[1] for r in results} == {client_ident}
    assert parents.slice(gpus=0).use_controller_sync.call_one(name).get() == 7
    assert ctl.incr.call_one().get() == 8


def test_controller_first_spawned_from_an_actor(procs) -> None:
    name = fresh("ctl")
    parents = procs.spawn(fresh("parent"), Parent)
    n, ident = parents.slice(gpus=1).use_controller.call_one(name).get()
    assert n == 1
    ctl = get_or_spawn_controller(name, Registry).get()
    assert ctl.ident.call_one().get() == ident
    assert ctl.incr.call_one().get() == 2


# ---------------------------------------------------------------- this_proc / this_host


def test_this_proc_spawns_in_the_client_process() -> None:
    pm = this_proc()
    assert isinstance(pm, ProcMesh)
    leaf = pm.spawn(fresh("local"), Leaf, "here")
    tag, rank, size, pid = leaf.info.call_one().get()
    assert (tag, rank, size) == ("here", 0, {})
    assert pid == os.getpid()


def test_this_host_and_this_proc_inside_actor(procs) -> None:
    parents = procs.spawn(fresh("parent"), Parent)
    assert parents.mesh_kinds.call().get().values() == [(True, True)] * 4


def test_actor_spawns_on_its_own_proc(procs) -> None:
    parent = procs.spawn(fresh("parent"), Parent).slice(gpus=3)
    parent_pid, (tag, rank, size, leaf_pid) = parent.spawn_local.call_one("inner").get()
    assert (tag, rank, size) == ("inner", 0, {})
    assert leaf_pid == parent_pid
    assert parent_pid != os.getpid()


def test_actor_spawns_its_own_procs_and_calls_them(procs) -> None:
    parent = procs.spawn(fresh("parent"), Parent).slice(gpus=0)
    parent_pid, sizes, infos = parent.spawn_own_procs.call_one().get()
    assert sizes == {"w": 2}
    assert [(i[0], i[1], i[2]) for i in infos] == [
        ("child", 0, {"w": 2}),
        ("child", 1, {"w": 2}),
    ]
    child_pids = {i[3] for i in infos}
    assert len(child_pids) == 2
    assert parent_pid not in child_pids
    assert os.getpid() not in child_pids
    # the parent keeps working afterwards
    assert parent.pid.call_one().get() == parent_pid
