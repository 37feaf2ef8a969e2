"""``returns_future``: an ``async def`` called synchronously, returning a
``Future`` whose body runs where it is first observed (the reference's
decorator of the same name; its 0.7.0 behaviour is the contract).

Contract:

* Calling the decorated function creates the coroutine, captures the
  caller's ``contextvars`` context (the body sees the context *of the call*;
  its own writes do not leak back) and returns a
  :class:`~monarch_core._proc._future.Future` at once; nothing runs yet.
* The first observer owns the body, which runs once:
  - ``get(timeout)`` (or ``result``/``exception``) from synchronous code runs
    it to completion on the calling thread's own asyncio loop, then cancels
    the tasks it left behind (as ``asyncio.run`` does); on timeout it cancels
    the body, runs its cleanup, and the future fails with that
    ``TimeoutError`` for every observer; on an interrupt
    (``KeyboardInterrupt`` while it runs) it cancels the body, runs its
    cleanup, re-raises the interrupt, and the future fails with
    ``CancelledError``;
  - ``await`` / ``as_asyncio()`` on an asyncio loop runs it as a task on that
    loop, held until it finishes even when nothing else refers to it;
    cancelling an observer cancels only that observer.
  Every later observer, on any thread, waits for that result.
* A future dropped unobserved runs none of the body (and warns nothing).
* Each thread's loop is made at its first ``get``, reused, and shut down when
  the thread exits: the async generators a body left open are closed, its
  default executor is shut down, and the loop is closed.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Generator

from monarch_core._proc._future import Cell, Future, format_duration

if TYPE_CHECKING:
    import asyncio

__all__ = ["Applied", "returns_future"]

_threads = threading.local()
#: body tasks started by ``await``/``as_asyncio``, held until they finish
_HELD: set[asyncio.Task[Any]] = set()


class _ThreadLoop:
    """One thread's loop; collected (and its loop shut down) with the thread's locals."""

    def __init__(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        weakref.finalize(self, _shutdown, self.loop)


def _shutdown(loop: asyncio.AbstractEventLoop) -> None:
    """What ``asyncio.run`` does at its end: close async generators, shut the executor down, close."""
    if loop.is_closed() or loop.is_running():
        return
    try:
        _cancel_leftovers(loop)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    except BaseException:  # noqa: BLE001 - a thread ending must not fail on its loop's cleanup
        pass
    finally:
        loop.close()


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    import asyncio

    left = [t for t in asyncio.all_tasks(loop) if not t.done()]
    if not left:
        return
    for t in left:
        t.cancel()
    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


def _thread_loop() -> asyncio.AbstractEventLoop:
    holder = getattr(_threads, "holder", None)
    if holder is None:
        holder = _threads.holder = _ThreadLoop()
    return holder.loop


class OwnedFuture(Future[Any]):
    """The future :func:`returns_future` returns (see the module docstring)."""

    __slots__ = ("_body", "_owner_lock", "_context")

    def __init__(self, body: Coroutine[Any, Any, Any]) -> None:  # noqa: D107 - the base's __init__ is not used
        self._cell = Cell()
        self._coro = None
        self._start_lock = None  # type: ignore[assignment]
        self._body: Coroutine[Any, Any, Any] | None = body
        self._owner_lock = threading.Lock()
        self._context = contextvars.copy_context()

    @property
    def _out(self) -> Cell:
        """The cell the body's outcome goes to (always set: made in ``__init__``)."""
        cell = self._cell
        assert cell is not None
        return cell

    def _claim(self) -> Coroutine[Any, Any, Any] | None:
        with self._owner_lock:
            body, self._body = self._body, None
            return body

    def __del__(self) -> None:
        body = getattr(self, "_body", None)
        if body is not None:  # dropped unobserved: none of it runs, and Python warns nothing
            body.close()

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
            self._out.set_exception(RuntimeError(
                "get() on a returns_future result inside a running event loop would block it: await it instead"))
            return
        try:
            loop = _thread_loop()
        except BaseException as e:  # noqa: BLE001 - no loop: every observer fails alike, the body unstarted
            body.close()
            self._out.set_exception(asyncio.CancelledError("interrupted before the body started")
                                     if isinstance(e, KeyboardInterrupt) else e)
            raise
        task = loop.create_task(body, context=self._context)  # type: ignore[call-arg]
        try:
            loop.run_until_complete(asyncio.wait_for(asyncio.shield(task), timeout))
        except asyncio.TimeoutError:
            err = TimeoutError(f"the body did not finish within {format_duration(timeout)}; it was cancelled")
            self._cancel(loop, task, err)
            raise err from None
        except KeyboardInterrupt:
            self._cancel(loop, task, asyncio.CancelledError("cancelled: interrupted (KeyboardInterrupt)"))
            raise
        except BaseException as e:  # noqa: BLE001 - the body's own exception is the future's
            self._out.set_exception(e)
        else:
            self._out.set_result(task.result())
        finally:
            if not loop.is_closed():
                _cancel_leftovers(loop)

    def _cancel(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any], outcome: BaseException) -> None:
        """Claim ``outcome`` first (what the body returns while cancelled does not replace it), then
        cancel the body and run its cleanup."""
        self._out.set_exception(outcome)
        task.cancel()
        while not task.done():
            try:
                loop.run_until_complete(task)
            except KeyboardInterrupt:  # a second interrupt: keep letting the cleanup finish
                continue
            except BaseException:  # noqa: BLE001 - the cancellation (or what the body raised meanwhile)
                pass

    def _start_task(self) -> bool:
        """Claim the body and start it as a held task on the running asyncio loop (True), or
        return False when there is no running asyncio loop (``None`` claimed)."""
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        body = self._claim()
        if body is not None:
            task = loop.create_task(self._drive(body), context=self._context)  # type: ignore[call-arg]
            _HELD.add(task)
            task.add_done_callback(_HELD.discard)
        return True

    async def _drive(self, body: Coroutine[Any, Any, Any]) -> None:
        try:
            value = await body
        except BaseException as e:  # noqa: BLE001 - every outcome is the future's
            self._out.set_exception(e)
            return
        self._out.set_result(value)

    def __await__(self) -> Generator[Any, None, Any]:
        if self._body is None or self._start_task():
            return super().__await__()
        body = self._claim()  # awaited off asyncio (trio): run it inside the awaiting coroutine
        if body is None:
            return super().__await__()
        return self._await_owned(body).__await__()

    def as_asyncio(self) -> asyncio.Future[Any]:
        if self._body is not None:
            self._start_task()
        return super().as_asyncio()

    async def _await_owned(self, body: Coroutine[Any, Any, Any]) -> Any:
        try:
            value = await body
        except BaseException as e:
            self._out.set_exception(e)
            raise
        self._out.set_result(value)
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
        return (yield from ())

    def send(self, value: Any) -> None:
        raise StopIteration(None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> None:
        raise typ if val is None else val

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return "<done>"
