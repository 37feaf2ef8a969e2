"""``Future``: get/result/exception, timeouts, awaiting from asyncio and trio,
``as_asyncio`` and ``Future(coro=...)``."""

from __future__ import annotations

import asyncio

import pytest
import trio

from monarch_core.actor import (
    Actor,
    ActorError,
    Channel,
    Future,
    Port,
    ValueMesh,
    concurrent_endpoint,
    current_rank,
    endpoint,
)

from _helpers import fresh


class Echo(Actor):
    def __init__(self) -> None:
        self._ev: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._ev is None:
            self._ev = asyncio.Event()
        return self._ev

    @endpoint
    def echo(self, x):  # noqa: ANN001, ANN201
        return x

    @endpoint
    async def aecho(self, x):  # noqa: ANN001, ANN201
        await asyncio.sleep(0)
        return (x, current_rank().rank)

    @endpoint
    def fail(self, msg: str) -> None:
        raise ValueError(msg)

    @concurrent_endpoint(explicit_response_port=True)
    async def gated(self, port: Port[str], value: str) -> None:
        await self._event().wait()
        port.send(value)

    @endpoint
    def release(self) -> None:
        self._event().set()


@pytest.fixture(scope="module")
def echo(procs):
    return procs.spawn(fresh("echo"), Echo)


@pytest.fixture(scope="module")
def echo1(echo):
    return echo.slice(gpus=1)


# ---------------------------------------------------------------- synchronous observation


def test_get_result_and_exception_on_success(echo1) -> None:
    f = echo1.echo.call_one({"a": [1, 2]})
    assert f.get() == {"a": [1, 2]}
    assert f.result() == {"a": [1, 2]}
    assert f.exception() is None
    assert f.get() == {"a": [1, 2]}  # observing again sees the same value


def test_get_with_timeout_on_completed_call(echo1) -> None:
    assert echo1.echo.call_one(5).get(timeout=30) == 5
    assert echo1.echo.call_one(6).result(timeout=30) == 6


def test_exception_returns_actor_error(echo1) -> None:
    f = echo1.fail.call_one("bad value 17")
    exc = f.exception()
    assert isinstance(exc, ActorError)
    assert "bad value 17" in str(exc)
    with pytest.raises(ActorError, match="bad value 17"):
        f.get()
    with pytest.raises(ActorError, match="bad value 17"):
        f.result()


def test_timeout_does_not_consume_port_future() -> None:
    port, recv = Channel.open()
    fut = recv.recv()
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.05)
    with pytest.raises(TimeoutError):
        fut.result(timeout=0.05)
    with pytest.raises(TimeoutError):
        fut.exception(timeout=0.05)
    port.send("late")
    assert fut.get(timeout=30) == "late"
    assert fut.get() == "late"


def test_timeout_does_not_consume_call_future(procs) -> None:
    e = procs.spawn(fresh("echo"), Echo).slice(gpus=0)
    fut = e.gated.call_one("opened")
    with pytest.raises(TimeoutError):
        fut.get(timeout=0.1)
    e.release.call_one().get(timeout=30)
    assert fut.get(timeout=30) == "opened"

    async def later() -> str:
        return await fut

    assert asyncio.run(later()) == "opened"


# ---------------------------------------------------------------- asyncio


def test_await_from_asyncio(echo, echo1) -> None:
    async def main() -> tuple:
        a = await echo1.echo.call_one("x")
        b, c = await asyncio.gather(echo1.aecho.call_one(1), echo1.aecho.call_one(2))
        vm = await echo.aecho.call(3)
        return a, b, c, vm

    a, b, c, vm = asyncio.run(main())
    assert a == "x"
    assert (b, c) == ((1, 0), (2, 0))
    assert isinstance(vm, ValueMesh)
    assert vm.values() == [(3, 0), (3, 1), (3, 2), (3, 3)]


def test_await_error_from_asyncio(echo1) -> None:
    async def main() -> None:
        await echo1.fail.call_one("async failure 3")

    with pytest.raises(ActorError, match="async failure 3"):
        asyncio.run(main())


def test_as_asyncio_on_a_loop(echo1) -> None:
    async def main() -> tuple:
        f = echo1.echo.call_one(11)
        af1 = f.as_asyncio()
        af2 = f.as_asyncio()
        assert isinstance(af1, asyncio.Future)
        assert af1 is not af2
        return await af1, await af2, await f

    assert asyncio.run(main()) == (11, 11, 11)


def test_as_asyncio_off_loop_raises_without_consuming(echo1) -> None:
    f = echo1.echo.call_one(12)
    with pytest.raises(RuntimeError):
        f.as_asyncio()
    assert f.get() == 12


def test_as_asyncio_carries_exception(echo1) -> None:
    async def main() -> None:
        await echo1.fail.call_one("via as_asyncio").as_asyncio()

    with pytest.raises(ActorError, match="via as_asyncio"):
        asyncio.run(main())


# ---------------------------------------------------------------- trio


def test_await_from_trio(echo, echo1) -> None:
    results: dict = {}

    async def main() -> None:
        results["one"] = await echo1.echo.call_one("from trio")
        vm = await echo.aecho.call(4)
        results["all"] = vm.values()
        async with trio.open_nursery() as n:

            async def one(i: int) -> None:
                results[i] = await echo1.echo.call_one(i)

            for i in range(3):
                n.start_soon(one, i)

    trio.run(main)
    assert results == {
        "one": "from trio",
        "all": [(4, 0), (4, 1), (4, 2), (4, 3)],
        0: 0,
        1: 1,
        2: 2,
    }


def test_await_error_from_trio(echo1) -> None:
    async def main() -> None:
        await echo1.fail.call_one("trio failure 9")

    with pytest.raises(ActorError, match="trio failure 9"):
        trio.run(main)


# ---------------------------------------------------------------- Future(coro=...)


async def _add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


async def _raise() -> None:
    await asyncio.sleep(0)
    raise KeyError("from coro")


def test_future_from_coroutine_get() -> None:
    f = Future(coro=_add(1, 2))
    assert f.get() == 3
    assert f.result() == 3
    assert f.exception() is None


def test_future_from_coroutine_exception() -> None:
    f = Future(coro=_raise())
    with pytest.raises(KeyError, match="from coro"):
        f.get()
    assert isinstance(f.exception(), KeyError)


def test_future_from_coroutine_awaited_from_asyncio() -> None:
    async def main() -> int:
        return await Future(coro=_add(20, 22))

    assert asyncio.run(main()) == 42


def test_future_from_coroutine_awaited_from_trio() -> None:
    out = []

    async def main() -> None:
        out.append(await Future(coro=_add(2, 5)))

    trio.run(main)
    assert out == [7]


def test_future_from_coroutine_that_awaits_actor(echo1) -> None:
    async def combined() -> tuple:
        a = await echo1.echo.call_one("p")
        b = await echo1.aecho.call_one("q")
        return a, b

    f = Future(coro=combined())
    assert f.get() == ("p", ("q", 0))
