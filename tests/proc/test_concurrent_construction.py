"""Actors spawned back to back on one proc are constructed one at a time
(``monarch_core._proc._construction``): their classes' unpickling and their
``__init__`` s import modules, and CPython's imports from several threads at
once hand out partially initialised torch modules (issue 39 item 3).

Each round starts fresh procs (nothing imported yet) and spawns three actor
meshes on them back to back, whose classes -- defined in the client script's
``__main__``, so pickled by value -- refer to ``torch.distributions``,
``torch.optim`` and ``torch.nn``: at module level (imported while the class
is unpickled) and inside ``__init__``.  Before the construction turn, most
rounds failed with ``partially initialized module 'torch.nn.parameter' has
no attribute 'Parameter'``, ``generic_type: cannot initialize type
"RpcBackendOptions"`` or ``KeyError('torch')``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import pytest

from _helpers.clients import describe
from monarch_core._proc import _construction
from monarch_core.actor import Actor, endpoint, this_host, this_proc

pytest.importorskip("torch")

ROUNDS = 2  # x 2 procs x 2 kinds of class: 8 fresh procs, each a race of three imports of torch

SCRIPT = """
import sys

import torch.distributions
import torch.nn
import torch.optim

from monarch_core.actor import Actor, endpoint, this_host


class Sampler(Actor):
    def __init__(self) -> None:
        self.cls = torch.distributions.Categorical

    @endpoint
    def cls_name(self) -> str:
        return self.cls.__name__


class Optimizer(Actor):
    def __init__(self) -> None:
        self.cls = torch.optim.Adam

    @endpoint
    def cls_name(self) -> str:
        return self.cls.__name__


class Layer(Actor):
    def __init__(self) -> None:
        self.cls = torch.nn.Linear

    @endpoint
    def cls_name(self) -> str:
        return self.cls.__name__


class LocalSampler(Actor):
    def __init__(self) -> None:
        from torch.distributions import Categorical

        self.cls = Categorical

    @endpoint
    def cls_name(self) -> str:
        return self.cls.__name__


class LocalOptimizer(Actor):
    def __init__(self) -> None:
        import torch.optim as optim

        self.cls = optim.Adam

    @endpoint
    def cls_name(self) -> str:
        return self.cls.__name__


class LocalLayer(Actor):
    def __init__(self) -> None:
        from torch.nn import Linear

        self.cls = Linear

    @endpoint
    def cls_name(self) -> str:
        return self.cls.__name__


def main(rounds: int) -> None:
    kinds = {"module level": (Sampler, Optimizer, Layer), "in __init__": (LocalSampler, LocalOptimizer, LocalLayer)}
    for r in range(rounds):
        for kind, classes in kinds.items():
            procs = this_host().spawn_procs(per_host={"gpus": 2})
            meshes = [procs.spawn(f"m{i}", c) for i, c in enumerate(classes)]  # back to back
            names = [m.cls_name.call().get(timeout=240).values() for m in meshes]
            assert names == [["Categorical"] * 2, ["Adam"] * 2, ["Linear"] * 2], names
            procs.stop().get(timeout=60)
            print(f"round {r} ({kind}): ok", flush=True)
    print("ALL OK", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
"""


def test_actors_whose_classes_import_torch_submodules_construct_back_to_back_on_fresh_procs(
    client_script: Callable[..., Any],
) -> None:
    res = client_script(SCRIPT, str(ROUNDS), timeout=900)
    assert res.returncode == 0 and "ALL OK" in res.stdout, describe(res)
    assert "partially initialized" not in res.stderr and "failed in __init__" not in res.stderr, describe(res)


# ---------------------------------------------------------------- the turn itself (real threads)


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_construction_waits_for_the_turn_and_gets_it_when_the_holder_gives_it_up() -> None:
    assert _construction.take("a[0]") is True
    try:
        t, out = _in_thread(lambda: (_construction.take("b[0]"), _construction.give())[0])
        t.join(0.5)
        assert t.is_alive(), "b took the turn while a held it"
    finally:
        _construction.give()
    t.join(30)
    assert out == [True]
    assert _construction._holder is None


def test_an_init_that_waits_on_a_future_gives_up_the_turn() -> None:
    from monarch_core._proc._future import Cell

    assert _construction.take("a[0]") is True
    _construction.enter_init()
    cell = Cell()
    try:
        assert cell.wait(0.05) is False  # a blocking wait in __init__: the turn is yielded
        assert _construction._holder is None
        t, out = _in_thread(lambda: (_construction.take("b[0]"), _construction.give())[0])
        t.join(30)
        assert out == [True]
    finally:
        _construction.give()


def test_an_init_that_blocks_elsewhere_holds_the_turn_only_for_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_construction, "INIT_TURN_S", 0.3)
    assert _construction.take("a[0]") is True
    _construction.enter_init()
    try:
        t0 = time.monotonic()
        t, out = _in_thread(lambda: _construction.take("b[0]"))
        t.join(30)
        assert out == [False]  # went on without the turn
        assert time.monotonic() - t0 >= 0.3
    finally:
        _construction.give()


def test_a_construction_that_waits_too_long_for_an_unpickling_fails_naming_the_holder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_construction, "UNPICKLE_TURN_S", 0.2)
    assert _construction.take("slow[0]") is True
    try:
        t, out = _in_thread(lambda: _construction.take("b[0]"))
        t.join(30)
        assert len(out) == 1 and isinstance(out[0], TimeoutError), out
        assert "slow[0]" in str(out[0]) and "b[0]" in str(out[0])
    finally:
        _construction.give()


# ---------------------------------------------------------------- no deadlock on real procs


class Helper(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"


class Parent(Actor):
    """Spawns a helper on its own proc in ``__init__`` and waits for it: the
    helper's construction needs the turn the parent's holds."""

    def __init__(self) -> None:
        helper = this_proc().spawn("helper", Helper)
        self.answer = helper.ping.call_one().get(timeout=120)
        holder = _construction._holder
        # the wait gave the turn up (else the helper was built only once INIT_TURN_S ran out)
        self.kept_turn = holder is not None and holder[0] == threading.get_ident()

    @endpoint
    def get(self) -> tuple[str, bool]:
        return self.answer, self.kept_turn


def test_an_init_that_calls_an_actor_spawned_after_it_on_its_proc_does_not_wait_for_the_turn(
    meshes: list,
) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    meshes.append(procs)
    parent = procs.spawn("parent", Parent)
    assert parent.get.call_one().get(timeout=180) == ("pong", False)
