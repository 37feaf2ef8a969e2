"""What ``spawn`` / ``spawn_procs`` check before anything is sent, and what
a client hears of an ``__init__`` that raised (issue 41 item 1).

* the constructor arguments are bound to ``Class.__init__`` 's signature at
  ``spawn()``: ``TypeError`` naming the class and the argument, as
  torchmonarch 0.7.0 does (the actors used to fail remotely, and the default
  fault hook ended the client with a ``KeyboardInterrupt`` traceback);
* a second live actor mesh of the same name on one proc mesh is refused
  (their metrics used to merge);
* ``per_host={}`` is refused;
* an ``__init__`` that raises remotely is reported once, by the user's call
  (actor, rank, remote traceback), and the client goes on.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from _helpers.clients import describe
from monarch_core.actor import Actor, endpoint, this_host


class Trainer(Actor):
    def __init__(self, lr: float, *, momentum: float = 0.0) -> None:
        self.lr = lr
        self.momentum = momentum

    @endpoint
    def get_lr(self) -> float:
        return self.lr


class NoInit(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"


@pytest.fixture(scope="module")
def procs() -> Any:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=60)


def test_a_missing_constructor_argument_is_a_type_error_at_spawn_naming_class_and_argument(procs: Any) -> None:
    before = dict(procs._actor_meshes)
    with pytest.raises(TypeError, match=r"Trainer.*missing a required argument: 'lr'"):
        procs.spawn("trainers_missing", Trainer)
    assert procs._actor_meshes == before  # nothing was spawned
    trainers = procs.spawn("trainers_ok", Trainer, 0.5)  # and the procs are fine
    assert trainers.get_lr.call().get(timeout=60).values() == [0.5, 0.5]
    trainers.stop().get(timeout=60)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((0.1, 0.2), {}, r"Trainer.*too many positional arguments"),
        ((0.1,), {"nesterov": True}, r"Trainer.*unexpected keyword argument 'nesterov'"),
        ((), {"momentum": 0.9}, r"Trainer.*missing a required argument: 'lr'"),
    ],
)
def test_arguments_that_do_not_fit_the_constructor_are_refused_at_spawn(
    procs: Any, args: tuple, kwargs: dict, match: str,
) -> None:
    with pytest.raises(TypeError, match=match):
        procs.spawn("trainers_bad", Trainer, *args, **kwargs)


def test_a_misspelt_constructor_keyword_is_named_with_a_guess_not_reported_as_a_missing_argument(procs: Any) -> None:
    # ``Signature.bind`` reports the missing ``lr`` first; spawn names the
    # keyword the user actually wrote, as endpoint calls do
    before = dict(procs._actor_meshes)
    with pytest.raises(TypeError) as info:
        procs.spawn("trainers_misspelt", Trainer, learning_rate=0.1)
    msg = str(info.value)
    assert "unexpected keyword argument 'learning_rate'" in msg, msg
    assert "its keyword arguments are 'lr', 'momentum'" in msg, msg
    assert "missing a required argument" not in msg, msg
    with pytest.raises(TypeError, match=r"Trainer\.__init__\(lr.*unexpected keyword argument 'l_r', "
                                        r"did you mean 'lr'\? Nothing was spawned\."):
        procs.spawn("trainers_misspelt", Trainer, l_r=0.1)
    assert procs._actor_meshes == before  # nothing was spawned


def test_a_class_without_init_takes_no_constructor_arguments(procs: Any) -> None:
    with pytest.raises(TypeError, match=r"NoInit defines no __init__"):
        procs.spawn("noinit_bad", NoInit, 1)


def test_spawning_a_second_live_mesh_of_the_same_name_is_refused_until_the_first_stops(procs: Any) -> None:
    first = procs.spawn("dup", NoInit)
    assert first.ping.call().get(timeout=60).values() == ["pong", "pong"]
    with pytest.raises(ValueError, match=r"already has an actor mesh named 'dup' \(class NoInit\).*another name"):
        procs.spawn("dup", Trainer, 0.1)
    with pytest.raises(ValueError, match=r"already has an actor mesh named 'dup'"):
        procs.slice(gpus=1).spawn("dup", NoInit)  # a slice shares its mesh's actor meshes
    first.stop().get(timeout=60)
    again = procs.spawn("dup", NoInit)  # its name is free once it has stopped
    assert again.ping.call().get(timeout=60).values() == ["pong", "pong"]
    again.stop().get(timeout=60)


def test_per_host_with_no_dimension_is_refused() -> None:
    with pytest.raises(ValueError, match=r"per_host=\{\} names no dimension.*per_host=\{'gpus': 4\}"):
        this_host().spawn_procs(per_host={})


# ---------------------------------------------------------------- the client, with the default fault hook

MISSING = """
from monarch_core.actor import Actor, endpoint, this_host


class Trainer(Actor):
    def __init__(self, lr: float) -> None:
        self.lr = lr

    @endpoint
    def get_lr(self) -> float:
        return self.lr


procs = this_host().spawn_procs(per_host={"gpus": 2})
try:
    procs.spawn("trainers", Trainer)
except TypeError as e:
    print("spawn refused:", e, flush=True)
trainers = procs.spawn("trainers", Trainer, lr=0.1)
print("lr", trainers.get_lr.call().get(timeout=60).values(), flush=True)
procs.stop().get(timeout=60)
print("went on", flush=True)
"""

RAISING = """
import time

from monarch_core.actor import Actor, ActorError, endpoint, this_host


class Trainer(Actor):
    def __init__(self, lr: float) -> None:
        raise ValueError(f"learning rate {lr} is out of range")

    @endpoint
    def get_lr(self) -> float:
        return 0.0


procs = this_host().spawn_procs(per_host={"gpus": 2})
trainers = procs.spawn("trainers", Trainer, 7.0)
try:
    trainers.get_lr.call().get(timeout=60)
except ActorError as e:
    print("CAUGHT", e, flush=True)
time.sleep(2)  # the failures' supervision reports have reached the client meanwhile
print("went on", flush=True)
"""


def test_a_spawn_without_its_argument_refuses_at_spawn_and_the_client_goes_on(
    client_script: Callable[..., Any],
) -> None:
    res = client_script(MISSING, timeout=180)
    assert res.returncode == 0, describe(res)
    assert "spawn refused:" in res.stdout and "missing a required argument: 'lr'" in res.stdout, describe(res)
    assert "lr [0.1, 0.1]" in res.stdout and "went on" in res.stdout, describe(res)
    assert "KeyboardInterrupt" not in res.stderr, describe(res)


def test_an_init_that_raises_is_reported_once_by_the_call_and_the_client_goes_on(
    client_script: Callable[..., Any],
) -> None:
    res = client_script(RAISING, timeout=180)
    out, err = res.stdout, res.stderr
    assert res.returncode == 0 and "went on" in out, describe(res)
    caught = out.split("CAUGHT", 1)[1]
    # the call names the actor, the rank and the remote traceback
    assert "trainers.__init__" in caught and "rank " in caught and "actor trainers{'gpus': " in caught, describe(res)
    assert 'raise ValueError(f"learning rate {lr} is out of range")' in caught, describe(res)
    # told once: no second report of the traceback, no interrupt
    assert "KeyboardInterrupt" not in err and "unhandled supervision failure" not in err, describe(res)
    assert (out + err).count('raise ValueError(f"learning rate') == 1, describe(res)


def test_a_proc_bind_of_the_wrong_length_says_so_in_the_references_words_too() -> None:
    with pytest.raises(ValueError, match=r"proc_bind length \(1\) must equal procs_per_host \(4\).*one dict per proc"):
        this_host().spawn_procs(per_host={"gpus": 4}, proc_bind=[{"cpunodebind": "0"}])
