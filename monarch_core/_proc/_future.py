"""``Future``: one result, observable from sync code, asyncio and trio.

A future is backed by a thread-safe :class:`Cell` that the kernel (or a local
sender) resolves.  Results that arrive as bytes are decoded lazily, once, by the
first observer, so the kernel thread never runs user unpickling code.
"""

from __future__ import annotations

import inspect
import sys
import threading
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from monarch_core._kernel._poller import Poller as _Poller
from monarch_core._kernel._poller import following as _following
from monarch_core._proc import _construction

if TYPE_CHECKING:
    import asyncio

R = TypeVar("R")

_PENDING = object()
def _DECODING(*args: Any) -> Any:  # noqa: N802 - a sentinel
    """``Cell._decode`` while one observer decodes (the others wait for it):
    a sentinel (compared by identity), never called."""
    raise AssertionError("the decoding sentinel is never called")

#: The locks of every cell, striped: a cell takes ``_STRIPES[id(cell) >> 4 &
#: _MASK]`` (a lock per cell was one more object per call for the garbage
#: collector to track, a third of the client's time in a pipelined burst).
#: Only short critical sections that run no other code take one, so two
#: cells sharing a stripe never deadlock.
_MASK = 127
_STRIPES = tuple(_allocate_lock() for _ in range(_MASK + 1))


class _StripeLock:
    """``cell._lock``: the stripe of the cell, for code outside this class
    (a descriptor, no object per cell; the class's own methods index the
    stripes inline)."""

    def __get__(self, cell: Any, owner: Any = None) -> Any:
        return _STRIPES[id(cell) >> 4 & _MASK]


class Cell:
    """A one-shot, thread-safe result holder with callbacks."""

    __slots__ = ("_waiters", "_value", "_exc", "_decode", "_args", "_callbacks", "_done")

    _lock = _StripeLock()

    def __init__(self) -> None:
        self._waiters: list | None = None  # locks of blocked ``wait`` calls (made only when one blocks)
        self._value: Any = _PENDING
        self._exc: BaseException | None = None
        self._decode: Callable[..., Any] | None = None
        self._args: tuple = ()
        self._callbacks: list[Callable[[], None]] | None = None  # (made by the first ``add_callback``)
        self._done = False

    # -- producers (any thread) ---------------------------------------------
    def set_result(self, value: Any) -> bool:
        return self._finish(value, None, None)

    def set_exception(self, exc: BaseException) -> bool:
        return self._finish(None, exc, None)

    def set_lazy(self, decode: Callable[..., Any], args: tuple = ()) -> bool:
        """Resolve with ``decode(*args)``, evaluated by the first observer
        (``args`` rather than a closure: a reply makes one tuple, not five
        objects for the garbage collector to track)."""
        return self._finish(None, None, decode, args)

    def _finish(self, value: Any, exc: BaseException | None, decode: Callable[..., Any] | None,
                args: tuple = ()) -> bool:
        with _STRIPES[id(self) >> 4 & _MASK]:
            if self._done:
                return False
            self._value, self._exc, self._decode, self._args = value, exc, decode, args
            self._done = True
            cbs = self._callbacks
            self._callbacks = None
            waiters = self._waiters
            self._waiters = None
        if waiters:
            for w in waiters:
                w.release()
        if cbs:
            for cb in cbs:
                try:
                    cb()
                except Exception:  # pragma: no cover - a broken observer
                    import logging

                    logging.getLogger("monarch.actor").exception("future callback failed")
        return True

    # -- observers ------------------------------------------------------------
    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None) -> bool:
        """Block until resolved or ``timeout`` seconds pass; the state.

        In a process whose kernel reads its sockets with a poller, the
        waiting thread reads them itself meanwhile (it *leads* the poller),
        so the reply it waits for wakes it directly."""
        if self._done:
            return True
        if _construction._holder is not None:  # an actor's __init__ that waits lets the next one be constructed
            _construction.yield_turn()
        p = _Poller.current
        if p is not None:
            led = p.lead(self, timeout)
            if led is not None:
                return led
        with _following():
            return self._wait_lock(timeout)

    def _wait_lock(self, timeout: float | None) -> bool:
        with _STRIPES[id(self) >> 4 & _MASK]:
            if self._done:
                return True
            w = _allocate_lock()
            w.acquire()
            if self._waiters is None:
                self._waiters = [w]
            else:
                self._waiters.append(w)
        if w.acquire(True, -1 if timeout is None else max(0.0, timeout)):
            return True
        with _STRIPES[id(self) >> 4 & _MASK]:
            if self._waiters is not None and w in self._waiters:
                self._waiters.remove(w)
        return self._done

    def add_callback(self, cb: Callable[[], None]) -> bool:
        """Register ``cb``; False (and not registered) if already resolved."""
        with _STRIPES[id(self) >> 4 & _MASK]:
            if self._done:
                return False
            if self._callbacks is None:
                self._callbacks = [cb]
            else:
                self._callbacks.append(cb)
            return True

    def remove_callback(self, cb: Callable[[], None]) -> bool:
        """Unregister ``cb``; False if it has already been (or is being) called."""
        with _STRIPES[id(self) >> 4 & _MASK]:
            if self._done or not self._callbacks:
                return False
            try:
                self._callbacks.remove(cb)
            except ValueError:
                return False
            return True

    def _materialize(self) -> None:
        """Decode a lazy result, once: the first observer decodes (outside
        the lock: unpickling runs user code), others wait for it."""
        if self._decode is None:
            return
        lock = _STRIPES[id(self) >> 4 & _MASK]
        with lock:
            decode, args = self._decode, self._args
            if decode is None:
                return
            if decode is not _DECODING:
                self._decode = _DECODING
        if decode is _DECODING:  # another thread decodes it right now
            import time

            while self._decode is _DECODING:
                time.sleep(0.0005)
            return
        try:
            value, exc = decode(*args), None
        except BaseException as e:  # decoding failed: that is the outcome
            value, exc = None, e
        with lock:
            self._value, self._exc = value, exc
            self._args = ()
            self._decode = None

    def result(self) -> Any:
        self._materialize()
        if self._exc is not None:
            raise self._exc
        return self._value

    def exception(self) -> BaseException | None:
        self._materialize()
        return self._exc




def _kernel_thread_check() -> None:
    from monarch_core._proc import _state

    rt = _state.current_runtime_or_none()
    if rt is not None and rt.kernel.in_loop():
        raise RuntimeError(
            "Future.get() called on the monarch kernel thread; this would deadlock. "
            "Await the future instead."
        )


def format_duration(seconds: float | None) -> str:
    """A duration for people: ``"5.0 s"`` (never ``4.99999907900019 s``),
    ``"12 s"``, ``"50 ms"``; ``None`` is ``"no time limit"``."""
    if seconds is None:
        return "no time limit"
    s = float(seconds)
    if s >= 10:
        return f"{s:.0f} s"
    if s >= 0.1 or s <= 0:
        return f"{max(s, 0.0):.1f} s"
    return f"{s * 1000:.0f} ms"


class Future(Generic[R]):
    """The result of an asynchronous monarch operation.

    Observe it with :meth:`get` (blocking, from synchronous code), ``await``
    (from asyncio *or* trio code), or :meth:`as_asyncio`.  Observation never
    consumes it: every observer sees the same result.  ``Future(coro=...)``
    wraps a coroutine, which runs (once) on a helper asyncio loop the first
    time the future is observed.
    """

    __slots__ = ("_cell", "_coro", "_start_lock", "_site")
    #: (endpoint, adverb) of the call this future is the result of (set by the adverb; unset otherwise)
    _site: tuple[Any, str]

    def __init__(self, *, coro: Coroutine[Any, Any, R]) -> None:
        if not inspect.iscoroutine(coro):
            raise TypeError(
                f"Future(coro=...) needs a coroutine object, got {type(coro).__name__}. "
                "Call the async function: Future(coro=my_async_fn(args)), not Future(coro=my_async_fn)."
            )
        self._cell: Cell | None = None
        self._coro: Coroutine[Any, Any, R] | None = coro
        self._start_lock = threading.Lock()

    @classmethod
    def _of(cls, cell: Cell) -> Future[R]:
        f = cls.__new__(cls)
        f._cell = cell
        f._coro = None
        f._start_lock = None  # type: ignore[assignment]
        return f

    @classmethod
    def _resolved(cls, value: R) -> Future[R]:
        c = Cell()
        c.set_result(value)
        return cls._of(c)

    @classmethod
    def _failed(cls, exc: BaseException) -> Future[R]:
        c = Cell()
        c.set_exception(exc)
        return cls._of(c)

    @classmethod
    def _on_observe(cls, start: Callable[[], Cell]) -> Future[R]:
        """A future whose cell comes from ``start()``, called once, when the
        future is first observed (``get``/``result``/``exception``/``done``,
        ``await``, ``as_asyncio``); never, if it is dropped unobserved."""
        f = cls.__new__(cls)
        f._cell = None
        f._coro = _Deferred(start)  # type: ignore[assignment]
        f._start_lock = threading.Lock()
        return f

    def _ensure(self) -> Cell:
        cell = self._cell
        if cell is not None:
            return cell
        with self._start_lock:
            if self._cell is None:
                src = self._coro
                self._coro = None
                if type(src) is _Deferred:
                    cell = src.start()
                else:
                    cell = Cell()
                    _helper_loop().submit(src, cell)  # type: ignore[arg-type]
                self._cell = cell
        return self._cell  # type: ignore[return-value]

    # -- synchronous -----------------------------------------------------------
    def get(self, timeout: float | None = None) -> R:
        """Block until the result is available and return it (or raise its
        exception).  On ``TimeoutError`` the future is not consumed: a later
        ``get()`` or ``await`` still observes the result.  Avoid calling it
        inside a running event loop: it blocks the loop."""
        cell = self._ensure()
        if not cell.done():
            _kernel_thread_check()
            if not cell.wait(timeout):
                raise TimeoutError(f"{self._what()} did not resolve within {format_duration(timeout)} "
                                   "(it keeps running; get() again later)")
        return cell.result()

    def _what(self) -> str:
        """The future, in words: the call it is the result of (``"trainers.train.call()"``,
        set by the endpoint's adverb), else ``"the future"`` (only on a timeout)."""
        site = getattr(self, "_site", None)
        if site is not None:
            try:
                return f"{site[0]._describe()}.{site[1]}()"
            except Exception:  # noqa: BLE001 - a description must never hide the timeout
                pass
        return "the future"

    def result(self, timeout: float | None = None) -> R:
        """Same as :meth:`get`."""
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Block until resolved; return its exception, or ``None`` on success."""
        cell = self._ensure()
        if not cell.done():
            _kernel_thread_check()
            if not cell.wait(timeout):
                raise TimeoutError(f"{self._what()} did not resolve within {format_duration(timeout)}")
        return cell.exception()

    def done(self) -> bool:
        """True once the result (or exception) is available."""
        return self._ensure().done()

    # -- async -------------------------------------------------------------------
    def __await__(self) -> Generator[Any, None, R]:
        return self._await().__await__()

    async def _await(self) -> R:
        cell = self._ensure()
        if cell.done():
            return cell.result()
        aio = sys.modules.get("asyncio")  # not imported: certainly not on an asyncio loop
        loop = aio._get_running_loop() if aio is not None else None
        if loop is not None:
            await _wait_asyncio(cell, loop)
        else:
            await _wait_trio(cell)
        return cell.result()

    def as_asyncio(self) -> asyncio.Future[R]:
        """A standard ``asyncio.Future`` on the running loop that resolves with
        this future.  Raises ``RuntimeError`` off a loop (without consuming
        this future).  Each call returns a fresh loop-local future."""
        import asyncio

        loop = asyncio.get_running_loop()  # RuntimeError when there is none
        cell = self._ensure()
        af: asyncio.Future[R] = loop.create_future()

        def settle() -> None:
            if af.done():
                return
            try:
                af.set_result(cell.result())
            except BaseException as e:  # noqa: BLE001 - transfer any outcome
                af.set_exception(e)

        def cb() -> None:
            try:
                loop.call_soon_threadsafe(settle)
            except RuntimeError:  # loop closed meanwhile
                pass

        if not cell.add_callback(cb):
            settle()
        return af

    def __repr__(self) -> str:
        c = self._cell
        state = "pending" if c is None or not c.done() else "done"
        return f"<monarch Future {state}>"


async def _wait_asyncio(cell: Cell, loop: asyncio.AbstractEventLoop) -> None:
    waiter = loop.create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    def cb() -> None:
        try:
            loop.call_soon_threadsafe(wake)
        except RuntimeError:
            pass

    if not cell.add_callback(cb):
        return
    try:
        with _following():
            await waiter
    finally:
        cell.remove_callback(cb)


async def _wait_trio(cell: Cell) -> None:
    import trio

    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()

    def cb() -> None:
        try:
            token.run_sync_soon(trio.lowlevel.reschedule, task)
        except trio.RunFinishedError:
            pass

    if not cell.add_callback(cb):
        await trio.lowlevel.checkpoint()
        return

    def abort(_raise_cancel: Any) -> Any:
        if cell.remove_callback(cb):
            return trio.lowlevel.Abort.SUCCEEDED
        return trio.lowlevel.Abort.FAILED  # the reschedule is already on its way

    with _following():
        await trio.lowlevel.wait_task_rescheduled(abort)


class _Deferred:
    """What a :meth:`Future._on_observe` future runs when first observed."""

    __slots__ = ("start",)

    def __init__(self, start: Callable[[], Cell]) -> None:
        self.start = start


class _HelperLoop:
    """A background asyncio loop that runs ``Future(coro=...)`` coroutines."""

    def __init__(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        t = threading.Thread(target=self.loop.run_forever, name="monarch-futures", daemon=True)
        t.start()

    def submit(self, coro: Coroutine[Any, Any, Any], cell: Cell) -> None:
        async def runner() -> None:
            try:
                cell.set_result(await coro)
            except BaseException as e:  # noqa: BLE001
                cell.set_exception(e)

        import asyncio

        asyncio.run_coroutine_threadsafe(runner(), self.loop)


_helper: _HelperLoop | None = None
_helper_lock = threading.Lock()


def _helper_loop() -> _HelperLoop:
    global _helper
    if _helper is None:
        with _helper_lock:
            if _helper is None:
                _helper = _HelperLoop()
    return _helper
