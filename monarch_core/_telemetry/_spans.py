"""Spans: ``@traced``, the trace context, and the client/server span of a call.

A span is recorded when its work is part of a traced call -- the context
variable :data:`current_span` holds ``(trace_id, span_id)`` -- or when this
process traces everything (``state.tracing``).  The context of a call travels
in its message header (24 bytes, :func:`pack_context`), so the server-side span
of an endpoint is the child of the caller's span, and ``@traced`` functions
inside the endpoint are children of that.  When nothing is traced, no id is
drawn, no context is packed and nothing is appended.

``traced`` wrappers refer only to module-level functions of this module, so a
function defined in ``__main__`` that uses ``@traced`` pickles by value (for an
actor class spawned on a proc) and records, over there, into that proc's own
buffers.

A recorded span is the tuple ``(name, trace_id (16 bytes), span_id, parent_id, start_ns,
duration_ns, kind, thread, attributes)`` (attributes flat: ``(key, value, ...)``): ``start_ns`` is wall-clock time
(``time.time_ns``), ``duration_ns`` from ``time.perf_counter_ns``, ``kind``
``"client"``, ``"server"`` or ``"internal"``, ``thread`` the actor's display
name or the thread's name.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
import time
from random import getrandbits
from typing import Any, Callable, Optional, TypeVar, overload

from monarch_core._telemetry._core import MAX_BUFFERED, actor_name, state

F = TypeVar("F", bound=Callable[..., Any])

#: ``(trace_id, span_id)`` of the span the running code is part of, or None
#: (``trace_id``: 16 bytes, ``span_id``: a 64-bit int).
current_span: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("monarch_span", default=None)

#: Bytes of a packed trace context (what a traced message's header starts with).
CONTEXT_SIZE = 24
_now = time.perf_counter_ns
_wall = time.time_ns
_from_bytes = int.from_bytes


def new_id() -> int:
    """A random non-zero 64-bit span id."""
    return getrandbits(64) or 1


def new_trace() -> bytes:
    """A random 16-byte trace id."""
    return (getrandbits(128) or 1).to_bytes(16, "big")


def pack_context(trace_id: bytes, span_id: int) -> bytes:
    """The 24 header bytes that make the receiver's span a child of ``span_id``."""
    return trace_id + span_id.to_bytes(8, "big")


def unpack_context(b: bytes) -> tuple[bytes, int]:
    """``(trace_id, parent_span_id)`` of :func:`pack_context`'s bytes."""
    if len(b) != CONTEXT_SIZE:
        raise ValueError(f"a trace context is {CONTEXT_SIZE} bytes, got {len(b)}")
    return b[:16], _from_bytes(b[16:], "big")


_local = threading.local()


def _thread() -> str:
    """The track of spans begun on this thread: its actor's display name (an
    actor has a thread of its own), else the thread's name (cached per thread)."""
    track = getattr(_local, "track", None)
    if track is None:
        name = actor_name()
        track = _local.track = name if name is not None else threading.current_thread().name
    return track  # type: ignore[no-any-return]


def begin(parent: Optional[tuple]) -> Optional[list]:
    """Start a span under ``parent`` (``(trace_id, span_id)``, or None for a new
    trace when this process traces everything); None when not recorded.  The
    list is ``[trace_id, span_id, parent_id, start_ns, perf_ns, thread]``
    (``thread``: the track of the code that starts it)."""
    if parent is None:
        if not state.tracing:
            return None
        return [new_trace(), new_id(), 0, _wall(), _now(), _thread()]
    if not state.enabled:
        return None
    return [parent[0], new_id(), parent[1], _wall(), _now(), _thread()]


def end(sp: list, name: str, kind: str, attrs: tuple, error: Optional[str] = None) -> None:
    """Record span ``sp`` (from :func:`begin`) as finished now; ``attrs`` is
    flat, ``(key, value, key, value, ...)`` (a tuple of plain values is not
    tracked by the garbage collector, however many wait for the next batch)."""
    dur = _now() - sp[4]
    if error is not None:
        attrs = (*attrs, "error", error)
    spans = state.spans
    if len(spans) >= MAX_BUFFERED:
        state.dropped += 1
        return
    spans.append((name, sp[0], sp[1], sp[2], sp[3], dur, kind, sp[5], attrs))


# ------------------------------------------------------------------ @traced


def _enter(name: str) -> Optional[list]:
    sp = begin(current_span.get())
    if sp is None:
        return None
    sp.append(current_span.set((sp[0], sp[1])))
    sp.append(name)
    return sp


def _exit(sp: list, error: Optional[BaseException]) -> None:
    try:
        current_span.reset(sp[6])
    except ValueError:  # a generator-based coroutine resumed in another context: leave it
        pass
    end(sp, sp[7], "internal", (), None if error is None else type(error).__name__)


@overload
def traced(fn: F, /) -> F: ...
@overload
def traced(*, name: str) -> Callable[[F], F]: ...


def traced(fn: Any = None, /, *, name: Optional[str] = None) -> Any:
    """Wrap a sync or async function in a telemetry span.

    The span is named ``name`` or the function's ``__name__``, belongs to the
    running actor (its thread track), and is the child of the span the caller
    is part of -- the endpoint's, inside an endpoint.  It is recorded when the
    call is part of a traced call or this process traces everything
    (``MONARCH_TRACE``, ``record_trace``); otherwise the wrapper only calls the
    function.  An exception is recorded on the span (``error``: its type) and
    re-raised.  Works for functions and methods defined in modules and in
    ``__main__`` (they pickle with the actor classes that use them).
    """

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            raise TypeError(f"@traced decorates a function; got {f!r}. Use @traced or @traced(name='...').")
        span = name or getattr(f, "__name__", "span")
        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                sp = _enter(span)
                if sp is None:
                    return await f(*args, **kwargs)
                err = None
                try:
                    return await f(*args, **kwargs)
                except BaseException as e:
                    err = e
                    raise
                finally:
                    _exit(sp, err)

            return awrapper

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            sp = _enter(span)
            if sp is None:
                return f(*args, **kwargs)
            err = None
            try:
                return f(*args, **kwargs)
            except BaseException as e:
                err = e
                raise
            finally:
                _exit(sp, err)

        return wrapper

    if fn is not None:
        if not callable(fn):
            raise TypeError(f"@traced decorates a function; got {fn!r}. Use @traced or @traced(name='...').")
        return deco(fn)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"traced(name=...) must be a str, got {name!r}")
    return deco


def attrs_dict(flat: Any) -> dict:
    """The attributes of a recorded span as a dict."""
    return dict(zip(flat[::2], flat[1::2])) if flat else {}
