"""A new user's common mistakes with endpoints each get one error that names
the problem and the fix, and the program goes on: a misspelt keyword, a
``get(timeout=)`` that runs out, a result that cannot be pickled."""

from __future__ import annotations

import threading
import time

import pytest

from monarch_core.actor import Actor, ActorError, endpoint

from _helpers import fresh


class Trainer(Actor):
    @endpoint
    def train(self, batch: int, lr: float = 0.1) -> int:
        return batch

    @endpoint
    def nap(self, seconds: float) -> str:
        time.sleep(seconds)
        return "rested"

    @endpoint
    def lock(self) -> threading.Lock:
        return threading.Lock()

    @endpoint
    def nested(self) -> dict:
        return {"ok": 1, "handle": threading.Lock()}


@pytest.fixture(scope="module")
def trainers(procs):  # noqa: ANN001, ANN201
    return procs.spawn(fresh("trainers"), Trainer)


def test_a_misspelt_keyword_is_named_with_the_parameter_it_resembles(trainers) -> None:
    with pytest.raises(TypeError) as info:
        trainers.train.call(bach=1)
    text = str(info.value)
    assert "unexpected keyword argument 'bach', did you mean 'batch'?" in text, text
    assert "missing" not in text, text  # (Signature.bind alone reports the missing 'batch' first)
    assert "Nothing was sent." in text
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'lrr', did you mean 'lr'\?"):
        trainers.slice(gpus=0).train.call_one(1, lrr=0.2)
    # a keyword that resembles nothing lists the keywords there are
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zzz'; its keyword arguments are 'batch', 'lr'"):
        trainers.train.broadcast(1, zzz=2)
    # and the program goes on
    assert trainers.train.call(batch=3).get(timeout=60).values() == [3, 3, 3, 3]


def test_a_get_that_runs_out_names_the_call_and_a_rounded_duration(trainers) -> None:
    fut = trainers.nap.call(3.0)
    with pytest.raises(TimeoutError) as info:
        fut.get(timeout=0.25)
    assert str(info.value).startswith(f"{trainers.name}.nap.call() did not resolve within 0.2 s"), info.value
    one = trainers.slice(gpus=1).nap.call_one(3.0)
    with pytest.raises(TimeoutError, match=rf"^{trainers.name}\.nap\.call_one\(\) did not resolve within 5\.0 s"):
        one.get(timeout=4.99999907900019)
    # the futures keep running: a later get sees their results
    assert fut.get(timeout=60).values() == ["rested"] * 4
    assert one.get(timeout=60) == "rested"


def test_an_unpicklable_result_is_one_error_naming_the_endpoint_and_the_type(trainers) -> None:
    one = trainers.slice(gpus=2)
    for ep, kind in ((one.lock, "lock"), (one.nested, "dict")):
        exc = ep.call_one().exception(timeout=60)
        assert isinstance(exc, ActorError), exc
        text = str(exc)
        assert f"{trainers.name}.{ep.name} returned a {kind}, which cannot be sent back to the caller" in text, text
        assert "cannot pickle '_thread.lock' object" in text, text
        assert "Return plain data" in text
        # no traceback through the pickler and the runtime, and no chained second one
        assert "File " not in text and "direct cause" not in text, text
    assert one.train.call_one(7).get(timeout=60) == 7  # the actor goes on
