"""``returns_future`` as the reference (torchmonarch 0.7.0) defines it: the body runs once, for its
first observer, in the context of the call; ``get(timeout)`` cancels it and every observer sees the
timeout; a thread's loop is shut down when the thread exits; a body started by ``await`` is held."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import time
import warnings
import weakref
from typing import Any

import pytest

from monarch_core.actor import returns_future

pytestmark = pytest.mark.unit

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def test_the_body_sees_the_context_of_the_call_and_its_writes_stay_inside() -> None:
    @returns_future
    async def read_and_write() -> str:
        seen = VAR.get()
        VAR.set("body")
        return seen

    token = VAR.set("caller")
    try:
        future = read_and_write()
        VAR.set("after the call")
        assert future.get(timeout=30) == "caller"
        assert VAR.get() == "after the call"
    finally:
        VAR.reset(token)


def test_the_first_observer_owns_the_body_and_a_dropped_future_runs_nothing() -> None:
    runs: list[int] = []

    @returns_future
    async def count() -> int:
        runs.append(1)
        return len(runs)

    future = count()
    assert future.get(timeout=30) == 1
    assert future.get(timeout=30) == 1
    assert asyncio.run(_await(future)) == 1
    assert runs == [1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count()  # dropped unobserved
        gc.collect()
    assert runs == [1]
    assert not [w for w in caught if "never awaited" in str(w.message)]


async def _await(future: Any) -> Any:
    return await future


def test_a_timeout_cancels_the_body_and_is_every_observers_outcome() -> None:
    cleaned: list[int] = []

    @returns_future
    async def blocks() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append(1)

    future = blocks()
    with pytest.raises(TimeoutError):
        future.get(timeout=0.05)
    assert cleaned == [1]
    with pytest.raises(TimeoutError):  # not CancelledError: the timeout is the outcome
        future.get(timeout=30)


def test_a_threads_loop_closes_the_async_generators_left_open_when_the_thread_exits() -> None:
    closed: list[str] = []
    kept: list[Any] = []

    async def numbers() -> Any:
        try:
            yield 1
            yield 2
        finally:
            closed.append("generator")

    @returns_future
    async def leaves_a_generator() -> asyncio.AbstractEventLoop:
        generator = numbers()
        kept.append(generator)
        await generator.__anext__()
        await asyncio.to_thread(int)
        return asyncio.get_running_loop()

    box: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: box.update(loop=leaves_a_generator().get(timeout=30)), daemon=True)
    worker.start()
    worker.join(30)
    loop = box["loop"]
    deadline = time.monotonic() + 30
    while not loop.is_closed() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loop.is_closed()
    assert closed == ["generator"]


def test_a_body_started_by_an_observer_is_held_when_the_observer_is_cancelled() -> None:
    tasks: list[weakref.ref[asyncio.Task[Any]]] = []

    @returns_future
    async def parks() -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(weakref.ref(task))
        await asyncio.get_running_loop().create_future()

    async def main() -> None:
        observer = parks().as_asyncio()
        await asyncio.sleep(0)
        observer.cancel()
        del observer
        gc.collect()
        assert tasks and tasks[0]() is not None

    asyncio.run(main())
