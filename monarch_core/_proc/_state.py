"""Process-wide runtime state: the kernel, this proc's identity, the context.

:func:`current` is the one accessor of this process's runtime.  In the
client the runtime is created on first use (``_launch._start.ensure_runtime()``,
which the mesh API's entry points call, starting the kernel thread); in a proc ``_launch._proc_main`` creates it
before the loop starts; both through ``_start.build_runtime``.  This module holds the state only: it imports
nothing of the runtime above it.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import os
import sys
import threading
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from monarch_core import settings
from monarch_core._kernel._events import EventBus
from monarch_core._mesh._shape import Extent, Point
from monarch_core._proc._instrumentation import Instrumentation, NoInstrumentation
from monarch_core._proc._runtime_events import EVENTS

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.actor")

ProcRef = tuple  # (proc_id, address)


class Recent(MutableMapping):
    """A mapping that keeps only its ``limit`` most recently set entries (the
    oldest go first): a record of what ended -- stopped actors -- that a long
    job does not grow.  Thread-safe for single operations."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._d: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __getitem__(self, k: Any) -> Any:
        return self._d[k]

    def get(self, k: Any, default: Any = None) -> Any:
        return self._d.get(k, default)

    def __setitem__(self, k: Any, v: Any) -> None:
        with self._lock:
            d = self._d
            d[k] = v
            d.move_to_end(k)
            while len(d) > self.limit:
                d.popitem(last=False)

    def __delitem__(self, k: Any) -> None:
        with self._lock:
            del self._d[k]

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._d))

    def __len__(self) -> int:
        return len(self._d)


@dataclass
class ProcRuntime:
    """Everything this process knows about itself."""

    kernel: Kernel
    agent: Any  # the proc agent (``_agent.ProcAgent``; the kernel sees a ``ProcAgentProtocol``)
    proc_id: str
    name: str
    is_client: bool
    transport: str
    root: ProcRef
    parent: ProcRef | None
    point: Point
    python_executable: str
    proc_mesh_name: str = "client"
    caches: dict[str, Any] = field(default_factory=dict)
    #: What the runtime calls per call (``_instrumentation``): telemetry's, handed in where the runtime is built.
    instrumentation: Instrumentation = field(default_factory=NoInstrumentation)
    #: What the runtime tells of itself (``_runtime_events``): listeners subscribe where the runtime is built.
    events: EventBus = field(default_factory=lambda: EventBus(EVENTS))

    @property
    def ref(self) -> ProcRef:
        return (self.proc_id, self.kernel.address)



_runtime: ProcRuntime | None = None
runtime_lock = threading.Lock()
_shutdown_done = False

#: The actor (an ``_host.ActorHost``) whose code is running, if any.
current_actor: contextvars.ContextVar[Any] = contextvars.ContextVar("monarch_current_actor", default=None)
#: The rank of the message being handled, within the cast's extent.
current_message_rank: contextvars.ContextVar[Point | None] = contextvars.ContextVar(
    "monarch_message_rank", default=None
)

_NULL = NoInstrumentation()
#: the runtime events of a process that has no runtime: checked, heard by nobody
_UNHEARD = EventBus(EVENTS)

_EMPTY = Extent([], [])
ROOT_POINT = Point(0, _EMPTY)


def current_runtime_or_none() -> ProcRuntime | None:
    return _runtime


def instrumentation() -> Instrumentation:
    """The instrumentation of this process's runtime (the null one while it has none)."""
    rt = _runtime
    return rt.instrumentation if rt is not None else _NULL


def emit(event: str, **arguments: Any) -> None:
    """Tell the listeners of this process's runtime (``ProcRuntime.events``)
    that runtime event ``event`` (``_runtime_events.EVENTS``) happened, with
    its ``arguments``; nobody hears it while the process has no runtime (yet,
    or any more).  ``KeyError`` for an unknown event; a listener's error is
    logged, not raised."""
    rt = _runtime
    (rt.events if rt is not None else _UNHEARD).emit(event, **arguments)


def actor_name() -> str | None:
    """The display name of the actor running on this thread (``None`` outside actors)."""
    host = current_actor.get()
    return host.display_name if host is not None else None


def set_runtime(rt: ProcRuntime) -> None:
    global _runtime
    _runtime = rt


def current() -> ProcRuntime:
    """This process's runtime: the one accessor, for every layer.
    ``RuntimeError`` if it has none (yet, or any more).  Code that may be the
    first to need one in a client -- the mesh API's entry points -- calls
    ``_launch._start.ensure_runtime()`` first, which starts it."""
    rt = _runtime
    if rt is None:
        if _shutdown_done:
            raise RuntimeError(
                "the monarch context was shut down (shutdown_context() or interpreter exit); "
                "no new meshes can be created in this process"
            )
        raise RuntimeError(
            "this process has no monarch runtime: the monarch context was shut down, or nothing started it "
            "(this_proc(), this_host() or hosts_from_config() start it in a client)"
        )
    return rt


def tune_malloc(env: dict | None = None) -> bool:
    """Let large buffers reuse freed memory (glibc only).

    Every large message a proc receives lands in a new buffer.  A freshly
    mapped 64 MiB buffer costs ~16k page faults (~35 ms on a VM, five times
    the copy itself); from the heap, once a buffer of that size has been
    freed, the next one reuses its pages.  glibc serves large requests from
    a non-main thread's arena with fresh mappings whatever the threshold, so
    the process uses one arena (threads allocating at the same time then
    share its lock).  The cost: up to this many MiB of freed memory may stay
    in the process for reuse.  True if applied (call before threads start)."""
    try:
        mb = settings.get("MONARCH_MALLOC_REUSE_MB", env)
    except ValueError as e:  # a proc must start: say so, and go on without the tuning
        logging.getLogger("monarch.proc").warning("%s", e)
        return False
    if mb <= 0:
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False
    size = mb << 20
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
    return (
        bool(mallopt(M_MMAP_THRESHOLD, size))
        and bool(mallopt(M_TRIM_THRESHOLD, size))
        and bool(mallopt(M_ARENA_MAX, 1))
    )


_requested_exit_code = 0


def request_exit_code(code: int) -> None:
    """Make the interpreter exit with ``code`` (used by the default
    unhandled-fault hook, which ends the client with exit code 1)."""
    global _requested_exit_code
    _requested_exit_code = code


def requested_exit_code() -> int:
    return _requested_exit_code


def mark_shut_down() -> bool:
    """Record that this process's monarch context is shut down (no new
    runtime starts); False if it already was."""
    global _shutdown_done
    with runtime_lock:
        was = _shutdown_done
        _shutdown_done = True
    return not was


def clear_runtime() -> None:
    global _runtime
    with runtime_lock:
        _runtime = None


def is_shut_down() -> bool:
    return _shutdown_done
