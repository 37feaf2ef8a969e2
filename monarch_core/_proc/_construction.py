"""The construction turn: actors of one proc are constructed one at a time.

Each actor runs on its own thread, so actors spawned back to back on one proc
would unpickle their classes and run their ``__init__`` s at the same time.
Both import modules the first time (a class pickled by value refers to its
script's modules; ``__init__`` imports what it uses), and CPython's imports
are not safe from several threads at once for packages with import cycles
between their submodules: three threads importing ``torch.distributions``,
``torch.optim`` and ``torch.nn`` see ``partially initialized module
'torch.nn.parameter' has no attribute 'Parameter'``, a pybind11 type
registered twice (``generic_type: cannot initialize type``), or ``KeyError``
from the import machinery -- and the process's torch stays broken.

So a proc constructs its actors in turn: the actor holding the *turn*
unpickles its class and runs its ``__init__``; the next waits.  Endpoint
messages never take the turn (the per-message path takes no lock).

The turn cannot deadlock a construction that waits on another actor:

* an ``__init__`` that blocks in ``Future.get()`` (calls another actor --
  perhaps one spawned after it on this same proc) gives the turn up first
  (:func:`yield_turn`, called by the future's wait);
* an ``__init__`` that blocks elsewhere (a rendezvous, a queue) keeps the
  turn for at most :data:`INIT_TURN_S` seconds: a construction that has waited
  that long goes on without it (logged at INFO).

Unpickling a class is never overlapped that way: a construction waits for
another's unpickling (imports) for up to :data:`UNPICKLE_TURN_S` seconds, then
fails with an error naming the actor that holds the turn.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
from _thread import get_ident as _get_ident
from typing import Any

logger = logging.getLogger("monarch.actor")

#: seconds a construction waits for an ``__init__`` of another actor of its proc
#: to finish before it goes on without the turn
INIT_TURN_S = 20.0
#: seconds a construction waits for another actor's class to be unpickled
UNPICKLE_TURN_S = 600.0

_cond = threading.Condition(threading.Lock())
#: the turn's holder: (thread id, actor, phase: "unpickle" or "__init__", when
#: that phase began, ``time.monotonic()``); None when free
_holder: tuple[int, str, str, float] | None = None


def take(actor: str) -> bool:
    """Wait for the turn for ``actor`` (its display name), in the
    ``"unpickle"`` phase.  True once held; False if the holder has been in
    its ``__init__`` for :data:`INIT_TURN_S` seconds (go on without the turn).
    ``TimeoutError`` if another actor's class has been unpickling for
    :data:`UNPICKLE_TURN_S` seconds."""
    global _holder
    me = _get_ident()
    with _cond:
        while _holder is not None:
            ident, name, phase, since = _holder
            if ident == me:  # (a construction nested in another on this thread: it has the turn)
                return False
            limit = INIT_TURN_S if phase == "__init__" else UNPICKLE_TURN_S
            left = since + limit - time.monotonic()
            if left <= 0:
                if phase == "unpickle":
                    raise TimeoutError(
                        f"actor {actor} could not be constructed: actor {name} of this proc has been "
                        f"unpickling its class (importing its modules) for over {limit:g}s")
                logger.info("actor %s: the __init__ of %s has run for over %gs on this proc; constructing "
                            "without waiting for it", actor, name, limit)
                return False
            _cond.wait(left)
        _holder = (me, actor, "unpickle", time.monotonic())
        return True


def enter_init() -> None:
    """The holder (this thread) has unpickled its class and runs ``__init__``."""
    global _holder
    with _cond:
        h = _holder
        if h is not None and h[0] == _get_ident():
            _holder = (h[0], h[1], "__init__", time.monotonic())
            _cond.notify_all()  # waiters recompute how long they wait


def give() -> None:
    """This thread's construction is over: release the turn if it holds it."""
    global _holder
    with _cond:
        h = _holder
        if h is not None and h[0] == _get_ident():
            _holder = None
            _cond.notify_all()


def yield_turn() -> None:
    """Called before a blocking wait (``Future.get()``): a construction that
    waits gives up the turn, so that what it waits for can be constructed.
    Costs one global read when no construction is under way."""
    h = _holder
    if h is not None and h[0] == _get_ident():
        give()


def import_module(name: str) -> Any:
    """``importlib.import_module(name)``, importing its packages first, one
    at a time from the top: a package that another thread is importing right
    now is waited for while this thread holds no lock of its submodules (so
    the two imports cannot meet in a cycle that Python resolves by handing
    out a partially initialised module)."""
    mod = sys.modules.get(name)
    if mod is not None and not _initializing(mod):
        return mod
    parts = name.split(".")
    for i in range(1, len(parts)):
        parent = ".".join(parts[:i])
        m = sys.modules.get(parent)
        if m is None or _initializing(m):
            importlib.import_module(parent)
    return importlib.import_module(name)


def _initializing(mod: Any) -> bool:
    return bool(getattr(getattr(mod, "__spec__", None), "_initializing", False))
