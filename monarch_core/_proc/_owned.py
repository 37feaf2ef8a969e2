"""``returns_future``: an ``async def`` called synchronously, returning a
``Future`` whose body runs where it is first observed (the reference's
decorator of the same name).

Contract:

* Calling the decorated function creates the coroutine and returns a
  :class:`~monarch_core._proc._future.Future` at once; nothing runs yet.
* The first observer owns the body:
  - ``get(timeout)`` (or ``result``/``exception``) from synchronous code runs
    it to completion on the calling thread's own asyncio loop, in the calling
    thread's context (its ``contextvars``), and on timeout cancels it: the
    future then holds the ``CancelledError`` and ``get`` raises
    ``TimeoutError``;
  - ``await`` runs it inside the awaiting coroutine, on that loop.
  Every later observer, on any thread, waits for that result.
* Each thread's loop is made at its first ``get`` and closed when the
  thread exits.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
from typing import Any, Callable, Coroutine, Generator

from monarch_core._proc._future import Cell, Future, format_duration

__all__ = ["Applied", "returns_future"]

_threads = threading.local()


class _ThreadLoop:
    """One thread's loop; collected (and its loop closed) with the thread's locals."""

    def __init__(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        weakref.finalize(self, _close, self.loop)


def _close(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.is_closed():
        loop.close()


def _thread_loop() -> asyncio.AbstractEventLoop:
    holder = getattr(_threads, "holder", None)
    if holder is None:
        holder = _threads.holder = _ThreadLoop()
    return holder.loop


class OwnedFuture(Future[Any]):
    """The future :func:`returns_future` returns (see the module docstring)."""

    __slots__ = ("_body", "_owner_lock")

    def __init__(self, body: Coroutine[Any, Any, Any]) -> None:  # noqa: D107 - the base's __init__ is not used
        self._cell = Cell()
        self._coro = None
        self._start_lock = None  # type: ignore[assignment]
        self._body: Coroutine[Any, Any, Any] | None = body
        self._owner_lock = threading.Lock()

    def _claim(self) -> Coroutine[Any, Any, Any] | None:
        with self._owner_lock:
            body, self._body = self._body, None
            return body

    def get(self, timeout: float | None = None) -> Any:
        body = self._claim()
        if body is not None:
            self._run_here(body, timeout)
        return super().get(timeout)

    def result(self, timeout: float | None = None) -> Any:
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        body = self._claim()
        if body is not None:
            self._run_here(body, timeout)
        return super().exception(timeout)

    def _run_here(self, body: Coroutine[Any, Any, Any], timeout: float | None) -> None:
        import asyncio  # (lazily: importing the API loads no asyncio)

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            body.close()
            self._cell.set_exception(RuntimeError(
                "get() on a returns_future result inside a running event loop would block it: await it instead"))
            return
        loop = _thread_loop()
        task = loop.create_task(body)
        try:
            loop.run_until_complete(asyncio.wait_for(asyncio.shield(task), timeout))
        except asyncio.TimeoutError:
            task.cancel()
            try:
                loop.run_until_complete(task)
            except BaseException:  # noqa: BLE001 - the cancellation (or what the body raised meanwhile)
                pass
            self._cell.set_exception(asyncio.CancelledError(
                f"cancelled: get(timeout={timeout}) ran out before the body finished"))
            raise TimeoutError(f"the body did not finish within {format_duration(timeout)}; it was cancelled") from None
        except BaseException as e:  # noqa: BLE001 - the body's own exception is the future's
            self._cell.set_exception(e)
            return
        self._cell.set_result(task.result())

    def __await__(self) -> Generator[Any, None, Any]:
        body = self._claim()
        if body is None:
            return super().__await__()
        return self._await_owned(body).__await__()

    async def _await_owned(self, body: Coroutine[Any, Any, Any]) -> Any:
        try:
            value = await body
        except BaseException as e:
            self._cell.set_exception(e)
            raise
        self._cell.set_result(value)
        return value


def returns_future(fn: Callable[..., Coroutine[Any, Any, Any]]) -> Callable[..., Future[Any]]:
    """Decorate an ``async def`` so that calling it returns a ``Future``
    (see the module docstring)."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"@returns_future decorates an async def; {getattr(fn, '__qualname__', fn)!r} is not one")

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Future[Any]:
        return OwnedFuture(fn(*args, **kwargs))

    return call


class Applied:
    """What a call that has done its work already returns where the
    reference's is ``async``: a coroutine (``collections.abc.Coroutine``)
    that finishes at once with ``None``, so that ``await mesh.call(...)`` and
    ``asyncio.run(mesh.call(...))`` work as they do there, and a plain call
    needs nothing more (and warns about nothing when the result is dropped)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return iter(())

    def send(self, value: Any) -> None:
        raise StopIteration(None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> None:
        raise typ if val is None else val

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return "<done>"
