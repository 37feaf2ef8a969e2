"""Lifecycle events of this process, on the runtime's event bus.

The proc runtime announces what happens to it here -- an actor stopped, an
endpoint raised, the process begins to stop, it stopped -- and never calls up into the
layers above it or into plugins by name.  Two kinds of listeners:

* **plugins**, through the lifecycle hooks of :mod:`monarch_core.hookspecs`
  (``monarch_actor_stopped``, ``monarch_proc_stopping``,
  ``monarch_proc_stopped``, ``monarch_endpoint_raised``;
  ``monarch_proc_setup`` is the bootstrap seam's);
* **the core's own layers**, which :func:`subscribe` at run time when they
  come to hold something an event must release (the launch layer, when it
  makes its first host allocation).  Subscribing is an explicit call made by
  the code that needs it, never an import-time side effect.

The listeners of both kinds hear an event through one
:class:`~monarch_core._kernel._events.EventBus` (:data:`bus`; the kernel's
own events, ``kernel.events``, are another instance of it): the core's
subscribers first, then the plugins' hook implementations.

Events are rare (never per message).  The plugin hooks' implementations are
looked up once per process, so an event nobody listens to costs a tuple
check; ``endpoint_raised`` calls the implementations directly.  A listener
that raises is logged with its name and the event goes on to the others.
"""

from __future__ import annotations

from typing import Any, Callable

from monarch_core._kernel._events import EventBus, call

__all__ = ["EVENTS", "bus", "emit", "endpoint_raised", "subscribe"]


#: event name -> the plugin hook that announces it to plugins.
EVENTS = {
    "actor_stopped": "monarch_actor_stopped",
    "proc_stopping": "monarch_proc_stopping",
    "proc_stopped": "monarch_proc_stopped",
    "endpoint_raised": "monarch_endpoint_raised",
}

#: this process's lifecycle events and the core's subscribers to them
bus = EventBus(EVENTS)
#: event -> ((plugin name, function), ...) of the installed plugins, found
#: once per plugin registry (tests make new ones).
_hooks: dict[str, tuple[tuple[str, Callable[..., None]], ...]] = {}
_hooks_of: list[Any] = [None]


def subscribe(event: str, fn: Callable[..., None]) -> None:
    """Call ``fn(**arguments of the event)`` on every ``event`` from now on
    (once, however often it subscribes).  ``KeyError`` for an unknown event."""
    bus.subscribe(event, fn)


def _plugin_hooks(event: str) -> tuple[tuple[str, Callable[..., None]], ...]:
    from monarch_core._plugins import registry

    reg = registry()
    if _hooks_of[0] is not reg:
        _hooks.clear()
        _hooks_of[0] = reg
    found = _hooks.get(event)
    if found is None:
        caller = getattr(reg.pm.hook, EVENTS[event])
        found = tuple((impl.plugin_name, impl.function) for impl in caller.get_hookimpls())
        _hooks[event] = found
    return found


def emit(event: str, **kwargs: Any) -> None:
    """Announce ``event`` to the core's subscribers, then to plugins."""
    bus.emit(event, **kwargs)
    for name, fn in _plugin_hooks(event):
        call(event, name, fn, kwargs)


def endpoint_raised(exc: BaseException) -> None:
    """An endpoint raised ``exc`` (the actor's thread): tell the listeners."""
    if _plugin_hooks("endpoint_raised") or bus.listeners("endpoint_raised"):
        emit("endpoint_raised", exc=exc)
