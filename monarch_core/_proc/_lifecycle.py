"""Lifecycle events of this process: the proc runtime's one extension point.

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

Events are rare (never per message).  The plugin hooks' implementations are
looked up once per process, so an event nobody listens to costs a tuple
check; ``endpoint_raised`` calls the implementations directly.  A listener
that raises is logged with its name and the event goes on to the others.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

__all__ = ["EVENTS", "emit", "endpoint_raised", "subscribe"]

logger = logging.getLogger("monarch.lifecycle")

#: event name -> the plugin hook that announces it to plugins.
EVENTS = {
    "actor_stopped": "monarch_actor_stopped",
    "proc_stopping": "monarch_proc_stopping",
    "proc_stopped": "monarch_proc_stopped",
    "endpoint_raised": "monarch_endpoint_raised",
}

_subscribers: dict[str, list[Callable[..., None]]] = {e: [] for e in EVENTS}
#: event -> ((plugin name, function), ...) of the installed plugins, found
#: once per plugin registry (tests make new ones).
_hooks: dict[str, tuple[tuple[str, Callable[..., None]], ...]] = {}
_hooks_of: list[Any] = [None]


def subscribe(event: str, fn: Callable[..., None]) -> None:
    """Call ``fn(**arguments of the event)`` on every ``event`` from now on
    (once, however often it subscribes).  ``KeyError`` for an unknown event."""
    subs = _subscribers[event]
    if fn not in subs:
        subs.append(fn)


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
    listeners = [(getattr(fn, "__qualname__", repr(fn)), fn) for fn in _subscribers[event]]
    listeners.extend(_plugin_hooks(event))
    for name, fn in listeners:
        try:
            fn(**kwargs)
        except Exception:  # noqa: BLE001 - one listener must not stop the others, or the event
            logger.exception("the %s listener %s raised", event, name)


def endpoint_raised(exc: BaseException) -> None:
    """An endpoint raised ``exc`` (the actor's thread): tell the listeners."""
    if _plugin_hooks("endpoint_raised") or _subscribers["endpoint_raised"]:
        emit("endpoint_raised", exc=exc)
