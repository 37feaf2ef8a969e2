"""The runtime's one in-process event bus: what the runtime tells its observers.

monarch-core has two extension mechanisms, and only two:

* **pluggy hooks** (:mod:`monarch_core.hookspecs`) for what *plugins provide*
  (transports, schedulers, sinks, the lifecycle hooks they implement);
* **this bus** for what *the runtime tells* the code that watches it: a
  proc failed, an actor stopped, an endpoint raised, this process is
  stopping.  A listener subscribes by event name at run time (an explicit
  call by the code that needs it, never an import-time side effect) and is
  called with the event's arguments.

An :class:`EventBus` is a scope, not a new mechanism: each kernel holds one
for its own events (``kernel.events``: ``proc_failed``), each proc runtime
one for what it tells of itself (``ProcRuntime.events``: meshes and procs
spawned and stopped, failures, supervision; :mod:`monarch_core._proc._runtime_events`),
and the process has one for its lifecycle (:mod:`monarch_core._proc._lifecycle`,
which also forwards each event to the plugins' hooks of the same name).

Events are rare -- never per message: a per-message seam would be a method
on a component's declared interface (a ``Protocol``), not an event.  A
listener that raises is logged on ``monarch.events`` with its name, and the
event goes on to the others.  Emitting an event nobody listens to costs a
dict lookup.  Thread-safe: listeners may subscribe from any thread, and an
event is delivered on the thread that emits it, to the listeners subscribed
when it was emitted.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Iterable

__all__ = ["EventBus"]

logger = logging.getLogger("monarch.events")


class EventBus:
    """Named events and their listeners (see the module docstring).

    ``EventBus(("proc_failed",))`` declares the events it carries; subscribing
    to or emitting another name raises ``KeyError`` naming the known ones."""

    def __init__(self, events: Iterable[str]) -> None:
        self._listeners: dict[str, tuple[Callable[..., None], ...]] = {e: () for e in events}
        self._lock = threading.Lock()

    @property
    def events(self) -> tuple[str, ...]:
        """The event names this bus carries."""
        return tuple(self._listeners)

    def _check(self, event: str) -> None:
        if event not in self._listeners:
            raise KeyError(f"unknown event {event!r}; this bus carries {', '.join(sorted(self._listeners))}")

    def subscribe(self, event: str, fn: Callable[..., None]) -> None:
        """Call ``fn(**arguments)`` on every ``event`` from now on (once,
        however often it subscribes)."""
        self._check(event)
        with self._lock:
            if fn not in self._listeners[event]:
                self._listeners[event] = (*self._listeners[event], fn)

    def unsubscribe(self, event: str, fn: Callable[..., None]) -> None:
        """Stop calling ``fn`` on ``event`` (nothing if it was not subscribed)."""
        self._check(event)
        with self._lock:
            self._listeners[event] = tuple(f for f in self._listeners[event] if f != fn)

    def listeners(self, event: str) -> tuple[Callable[..., None], ...]:
        """The listeners of ``event`` now (a snapshot)."""
        self._check(event)
        return self._listeners[event]

    def emit(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call each listener of ``event`` with ``args`` and ``kwargs`` (each
        event's documentation says which); one that raises is logged and the
        others still run."""
        for fn in self.listeners(event):
            call(event, getattr(fn, "__qualname__", repr(fn)), fn, kwargs, args)


def call(event: str, name: str, fn: Callable[..., None], kwargs: dict[str, Any], args: tuple = ()) -> None:
    """Run one listener ``fn`` (called ``name`` in the log) of ``event``; log what it raises."""
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - one listener must not stop the others, or the event
        logger.exception("the %s listener %s raised", event, name)
