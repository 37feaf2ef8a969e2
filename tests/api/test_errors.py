"""Errors: remote exceptions become ``ActorError`` (and the actor survives),
bad arguments fail at the call site, bad spawns, failing ``__init__``."""

from __future__ import annotations

import threading

import pytest

import monarch_core.actor as mactor
import monarch_core.errors as merrors
from monarch_core.actor import Actor, ActorError, endpoint

from _helpers import fresh


class Fragile(Actor):
    def __init__(self) -> None:
        self.calls = 0

    @endpoint
    def ok(self) -> int:
        self.calls += 1
        return self.calls

    @endpoint
    def boom(self, msg: str) -> None:
        self.calls += 1
        _deep_helper(msg)

    @endpoint
    async def aboom(self, msg: str) -> None:
        self.calls += 1
        raise RuntimeError(msg)

    @endpoint
    def takes_two(self, a: int, b: int) -> int:
        self.calls += 1
        return a + b

    @endpoint
    def unpicklable_result(self):  # noqa: ANN201
        return threading.Lock()


def _deep_helper(msg: str) -> None:
    raise ValueError(f"remote says: {msg}")


class BadInit(Actor):
    def __init__(self) -> None:
        raise RuntimeError("init exploded 77")

    @endpoint
    def ok(self) -> int:
        return 1


class NotAnActor:
    def ok(self) -> int:
        return 1


# ---------------------------------------------------------------- remote exceptions


def test_actor_error_is_the_same_type_in_both_modules() -> None:
    assert mactor.ActorError is merrors.ActorError
    assert issubclass(ActorError, Exception)


def test_endpoint_exception_becomes_actor_error(procs) -> None:
    f = procs.spawn(fresh("fragile"), Fragile).slice(gpus=1)
    with pytest.raises(ActorError) as info:
        f.boom.call_one("the sky fell").get()
    text = str(info.value)
    assert "remote says: the sky fell" in text
    assert "ValueError" in text
    assert "Traceback" in text
    assert "_deep_helper" in text  # the remote frames are in the traceback
    assert "test_errors.py" in text


def test_actor_error_carries_remote_exception(procs) -> None:
    f = procs.spawn(fresh("fragile"), Fragile).slice(gpus=1)
    with pytest.raises(ActorError) as info:
        f.boom.call_one("carried").get()
    assert isinstance(info.value.exception, ValueError)
    assert "remote says: carried" in str(info.value.exception)


def test_async_endpoint_exception(procs) -> None:
    f = procs.spawn(fresh("fragile"), Fragile).slice(gpus=0)
    with pytest.raises(ActorError, match="async trouble"):
        f.aboom.call_one("async trouble").get()


def test_actor_keeps_serving_after_exception(procs) -> None:
    f = procs.spawn(fresh("fragile"), Fragile)
    one = f.slice(gpus=2)
    assert one.ok.call_one().get() == 1
    with pytest.raises(ActorError):
        one.boom.call_one("x").get()
    with pytest.raises(ActorError):
        one.aboom.call_one("y").get()
    assert one.ok.call_one().get() == 4  # state survived, every call ran once
    assert f.ok.call().get().values() == [1, 1, 5, 1]


def test_call_fails_if_any_rank_fails(procs) -> None:
    f = procs.spawn(fresh("fragile"), Fragile)
    with pytest.raises(ActorError, match="remote says: all"):
        f.boom.call("all").get()
    assert f.ok.call().get().values() == [2, 2, 2, 2]


def test_stream_and_choose_deliver_errors(procs) -> None:
    f = procs.spawn(fresh("fragile"), Fragile)
    futs = list(f.boom.stream("streamed"))
    assert len(futs) == 4
    for fut in futs:
        with pytest.raises(ActorError, match="remote says: streamed"):
            fut.get()
    with pytest.raises(ActorError, match="remote says: chosen"):
        f.boom.choose("chosen").get()
    assert sorted(f.ok.call().get().values()) == [2, 2, 2, 3]


def test_unpicklable_result_is_an_error_not_a_hang(procs) -> None:
    f = procs.spawn(fresh("fragile"), Fragile).slice(gpus=3)
    exc = f.unpicklable_result.call_one().exception(timeout=60)  # TimeoutError = hang
    assert isinstance(exc, Exception)
    assert f.ok.call_one().get() == 1


# ---------------------------------------------------------------- call-site errors


@pytest.mark.parametrize(
    "args,kwargs",
    [((1,), {}), ((1, 2, 3), {}), ((), {"a": 1, "c": 2}), ((1,), {"a": 1, "b": 2})],
)
def test_wrong_arguments_raise_type_error_at_call_site(procs, args, kwargs) -> None:
    f = procs.spawn(fresh("fragile"), Fragile)
    one = f.slice(gpus=0)
    with pytest.raises(TypeError):
        f.takes_two.call(*args, **kwargs)
    with pytest.raises(TypeError):
        one.takes_two.call_one(*args, **kwargs)
    with pytest.raises(TypeError):
        f.takes_two.choose(*args, **kwargs)
    with pytest.raises(TypeError):
        f.takes_two.stream(*args, **kwargs)
    with pytest.raises(TypeError):
        f.takes_two.broadcast(*args, **kwargs)
    # nothing reached the actors
    assert f.ok.call().get().values() == [1, 1, 1, 1]
    assert one.takes_two.call_one(1, b=2).get() == 3


def test_unpicklable_arguments_fail_at_call_site(procs) -> None:
    f = procs.spawn(fresh("fragile"), Fragile)
    lock = threading.Lock()
    with pytest.raises(Exception, match=r"(?i)pickl"):
        f.takes_two.call(lock, 1)
    with pytest.raises(Exception, match=r"(?i)pickl"):
        f.slice(gpus=0).takes_two.call_one(1, b=lock)
    with pytest.raises(Exception, match=r"(?i)pickl"):
        f.takes_two.broadcast(lock, lock)
    assert f.ok.call().get().values() == [1, 1, 1, 1]


def test_spawning_a_non_actor_class_is_a_value_error(procs) -> None:
    with pytest.raises(ValueError):
        procs.spawn(fresh("bad"), NotAnActor)
    with pytest.raises(ValueError):
        procs.spawn(fresh("bad"), int)


# ---------------------------------------------------------------- failing __init__


def test_failing_init(procs) -> None:
    m = procs.spawn(fresh("badinit"), BadInit)  # returns immediately
    with pytest.raises(Exception, match="init exploded 77"):
        m.initialized.get(timeout=60)
    with pytest.raises(Exception, match="init exploded 77"):
        m.slice(gpus=0).ok.call_one().get(timeout=60)
    with pytest.raises(Exception):
        m.ok.call().get(timeout=60)


def test_failing_init_first_call_raises_without_waiting_initialized(procs) -> None:
    m = procs.spawn(fresh("badinit"), BadInit)
    with pytest.raises(Exception, match="init exploded 77"):
        m.slice(gpus=1).ok.call_one().get(timeout=60)


def test_procs_survive_a_failed_actor(procs) -> None:
    procs.spawn(fresh("badinit"), BadInit)
    f = procs.spawn(fresh("fragile"), Fragile)
    assert f.ok.call().get().values() == [1, 1, 1, 1]
