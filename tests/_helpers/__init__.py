"""Helpers shared by the whole test suite.

Import them as ``from _helpers import ...`` (the root ``conftest.py`` puts
the ``tests`` folder on ``sys.path``, for ``plugins/*/tests`` too); never import a ``conftest`` module: pytest
loads every folder's ``conftest.py`` under the same module name, so which one
``import conftest`` finds depends on the collection order.

* :mod:`_helpers` (this module): unique names, timeouts, :func:`poll_until`,
  :func:`run_async` (a fresh trio run), :func:`client_runtime`.
* :mod:`_helpers.procs`: processes seen through ``/proc``.
* :mod:`_helpers.clients`: child interpreters that test this checkout.
* :mod:`_helpers.faults`: the recording ``unhandled_fault_hook``.
* :mod:`_helpers.config`: configured host meshes (``MONARCH_CONFIG``).
* :mod:`_helpers.transport`: the multi-host transport suite (netns hosts, TLS).
* :mod:`_helpers.fixtures`: the fixtures every test folder shares (a pytest
  plugin the root ``conftest.py`` loads).
"""

from __future__ import annotations

import itertools
import os
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

if TYPE_CHECKING:
    from monarch_core._proc._state import ProcRuntime

R = TypeVar("R")

#: generous timeout for anything that must arrive (a hang fails the test)
T = 10.0

_names = itertools.count()


def fresh(prefix: str) -> str:
    """A mesh (or actor) name unique in this test session, so that meshes and
    the failures they report can be told apart."""
    return f"{prefix}_{os.getpid()}_{next(_names)}"


def poll_until(predicate: Callable[[], R], timeout: float = T, interval: float = 0.02,
               what: str | None = None) -> R:
    """Call ``predicate`` until it returns something truthy, and return that;
    fail the test (``AssertionError``) when ``timeout`` seconds pass first.

    Only for conditions nothing notifies about (``/proc``, files, a kernel's
    records): wait on a future, port or event where there is one."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what or getattr(predicate, '__name__', 'condition')} "
                                 f"did not hold within {timeout}s (last: {got!r})")
        time.sleep(interval)


def run_async(afn: Callable[..., Awaitable[R]], *args: Any, timeout: float = 20.0) -> R:
    """``afn(*args)`` in a fresh trio run (a new event loop, nothing shared
    with other tests), failing with ``trio.TooSlowError`` after ``timeout``."""
    import trio

    async def main() -> R:
        with trio.fail_after(timeout):
            return await afn(*args)

    return trio.run(main)


def client_runtime() -> ProcRuntime:
    """This process's client runtime, started on first use:
    ``_start.ensure_runtime()`` then ``_state.current()``.

    Only for code running in the test process itself; code run in another
    process (a child interpreter's code string, an actor's endpoint) calls
    ``_state.current()`` there (after ``_start.ensure_runtime()`` where the
    runtime may not exist yet)."""
    from monarch_core._launch import _start
    from monarch_core._proc import _state

    _start.ensure_runtime()
    return _state.current()
