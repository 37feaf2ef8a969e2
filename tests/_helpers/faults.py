"""The recording ``unhandled_fault_hook``.

The default hook ends the client process; the suite installs this recorder
for the whole session (``_helpers.fixtures``, the documented way: assign
``monarch_core.actor.unhandled_fault_hook``) so that a test which makes an
actor fail on purpose cannot take pytest down, and tests can wait for the
failures they expect.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from _helpers import T


class FaultRecorder:
    """Records every failure that reaches the client; lets tests wait for one."""

    def __init__(self) -> None:
        self.failures: list[Any] = []
        self.threads: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, failure: Any) -> None:
        with self._cond:
            self.failures.append(failure)
            self.threads.append(threading.current_thread().name)
            self._cond.notify_all()

    def for_mesh(self, name: str) -> list[Any]:
        with self._cond:
            return [f for f in self.failures if f.mesh_name == name]

    def wait_for(self, pred: Callable[[Any], bool], timeout: float = T, what: str = "a failure") -> Any:
        """The first recorded failure satisfying ``pred`` (waits up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for f in self.failures:
                    if pred(f):
                        return f
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"unhandled_fault_hook was not called with {what} within {timeout}s; "
                        f"got {[repr(f) for f in self.failures]}"
                    )
                self._cond.wait(left)

    def wait_text(self, text: str, timeout: float = T) -> str:
        """The first recorded failure whose report contains ``text``, as text."""
        return str(self.wait_for(lambda f: text in str(f), timeout, what=f"a report mentioning {text!r}"))

    def wait_mesh(self, name: str, timeout: float = T, n: int = 1) -> list[Any]:
        """Wait until ``n`` failures of mesh ``name`` were recorded; return them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                got = [f for f in self.failures if f.mesh_name == name]
                if len(got) >= n:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"expected {n} failure(s) of mesh {name!r} within {timeout}s, got {len(got)}: "
                        f"{[repr(f) for f in self.failures]}"
                    )
                self._cond.wait(left)


#: the session's recorder (installed by ``_helpers.fixtures``)
RECORDER = FaultRecorder()


def join_hook_threads(timeout: float = T) -> None:
    """Let hook calls already started finish (they run on helper threads)."""
    deadline = time.monotonic() + timeout
    for t in threading.enumerate():
        if t is not threading.current_thread() and "fault-hook" in t.name:
            t.join(max(0.0, deadline - time.monotonic()))
