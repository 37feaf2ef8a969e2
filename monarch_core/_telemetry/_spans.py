"""Spans: ``@traced``, the trace context, and the client/server span of a call.

A span is recorded when its work is part of a traced call -- the context
variable :data:`current_span` holds ``(trace_id, span_id)`` -- or when this
process traces everything (``state.tracing``).  The context of a call travels
in its message header (24 bytes, :func:`new_context`), so the server-side span
of an endpoint is the child of the caller's span, and ``@traced`` functions
inside the endpoint are children of that.  When nothing is traced, no id is
drawn, no context is packed and nothing is appended.

``traced`` wrappers refer only to module-level functions of this module, so a
function defined in ``__main__`` that uses ``@traced`` pickles by value (for an
actor class spawned on a proc) and records, over there, into that proc's own
buffers.

A recorded span is the seven items of :func:`record` -- its name, kind,
thread and attributes shared with every span of its call site (:func:`meta`),
the trace id, its span id, its parent's, start (``time.perf_counter_ns``),
duration and error -- appended to one flat list, so that recording costs one
``extend``, a buffered span is no object for the garbage collector, and a
batch marshals compactly; :func:`records` groups them again and :func:`decode`
gives the full form.  The ids are kept as
they were drawn: a server span keeps the whole context it got (parent None),
a client span the context it sent (span id None), and a span under either
keeps that context as its trace id; :func:`decode` splits them at the root.  ``kind`` is ``"client"``, ``"server"`` or
``"internal"``, ``thread`` the actor's display name or the thread's name.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
import time
from random import getrandbits
from typing import Any, Callable, Optional, TypeVar, overload

from monarch_core._proc._state import actor_name
from monarch_core._telemetry._core import MAX_FLAT, SPAN_FIELDS, state

F = TypeVar("F", bound=Callable[..., Any])

#: The span the running code is part of, or None: a tuple whose first two items
#: are its trace id (16 bytes, or a 24-byte context that starts with it) and
#: ``span_id`` (a 64-bit int).
current_span: contextvars.ContextVar[Optional[tuple]] = contextvars.ContextVar("monarch_span", default=None)

#: Bytes of a packed trace context (what a traced message's header starts with).
CONTEXT_SIZE = 24
_now = time.perf_counter_ns
_wall = time.time_ns
_from_bytes = int.from_bytes


def new_context() -> bytes:
    """A new trace's context: a random trace id and span id in one draw
    (what a traced call's message carries, :data:`CONTEXT_SIZE` bytes)."""
    return getrandbits(192).to_bytes(CONTEXT_SIZE, "little")


def child_context(parent: tuple) -> bytes:
    """The context of a new span under ``parent`` (its first item: a trace id,
    or a whole context that starts with one)."""
    return parent[0][:16] + getrandbits(64).to_bytes(8, "little")


_local = threading.local()


def _thread() -> str:
    """The track of spans begun on this thread: its actor's display name (an
    actor has a thread of its own), else the thread's name (cached per thread)."""
    track = getattr(_local, "track", None)
    if track is None:
        name = actor_name()
        track = _local.track = name if name is not None else threading.current_thread().name
    return track  # type: ignore[no-any-return]


def begin(parent: Optional[tuple]) -> Optional[tuple]:
    """Start a span under ``parent`` (``(trace_id, span_id)``, or None for a new
    trace when this process traces everything); None when not recorded.
    The tuple is ``(trace_id, span_id, parent_id)``; its start time is the
    caller's (``time.perf_counter_ns``)."""
    if parent is None:
        if not state.tracing:
            return None
        return ((getrandbits(128) or 1).to_bytes(16, "big"), getrandbits(64) or 1, 0)
    if not state.enabled:
        return None
    return (parent[0], getrandbits(64) or 1, parent[1])


_metas: dict[tuple, tuple] = {}


def meta(name: str, kind: str, attrs: tuple = ()) -> tuple:
    """The shared part of the spans one call site records on this thread:
    ``(name, kind, thread, attrs)`` -- one object, so a batch's ``marshal``
    writes it once and refers to it after."""
    thread = _thread()
    k = (name, kind, thread, attrs)
    m = _metas.get(k)
    if m is None:
        if len(_metas) > 100_000:
            _metas.clear()
        m = _metas[k] = k
    return m


def record(m: tuple, trace: bytes, span_id: Optional[int], parent: Optional[int], t0: int, dt: int,
           error: Optional[str] = None) -> None:
    """Record a finished span: ``m`` from :func:`meta`, ``t0`` its start
    (``perf_counter_ns``), ``dt`` its duration.  ``parent`` None: ``trace`` is
    a whole 24-byte context (:func:`new_context`) holding trace and parent.
    ``span_id`` None: a client span, whose id is in ``trace`` (the context it sent).
    The span's :data:`SPAN_FIELDS` items are appended to ``state.spans`` in one
    ``extend`` (atomic; the tuple is freed at once)."""
    spans = state.spans
    if len(spans) >= MAX_FLAT:
        state.dropped += 1
        return
    spans.extend((m, trace, span_id, parent, t0, dt, error))


def records(flat: list) -> Any:
    """The span records (tuples of :data:`SPAN_FIELDS`) of a flat span list."""
    return zip(*[iter(flat)] * SPAN_FIELDS)


def decode(rec: tuple, offset: int) -> tuple:
    """A span record as ``(name, trace_id, span_id, parent_id, start_ns, duration_ns,
    kind, thread, attributes)``: ``offset`` turns ``perf_counter_ns`` into wall-clock
    ns (a batch carries it), ``attributes`` flat, with ``error`` at the end if any."""
    (name, kind, thread, attrs), trace, span_id, parent, t0, dt, error = rec
    if parent is None:  # a server span: ``trace`` is the context it got (trace id, parent)
        parent = _from_bytes(trace[16:24], "big")
    elif span_id is None:  # a client span: ``trace`` is the context it sent (trace id, its id)
        span_id = _from_bytes(trace[16:24], "big")
    trace = trace[:16]
    if error is not None:
        attrs = (*attrs, "error", error)
    return (name, trace, span_id, parent, t0 + offset, dt, kind, thread, attrs)


def clock_offset() -> int:
    """Wall-clock ns minus ``perf_counter_ns`` now."""
    return _wall() - _now()


# ------------------------------------------------------------------ @traced


def _enter(name: str) -> Optional[list]:
    b = begin(current_span.get())
    if b is None:
        return None
    return [b, current_span.set(b), meta(name, "internal"), _now()]


def _exit(sp: list, error: Optional[BaseException]) -> None:
    dt = _now() - sp[3]
    try:
        current_span.reset(sp[1])
    except ValueError:  # a generator-based coroutine resumed in another context: leave it
        pass
    b = sp[0]
    record(sp[2], b[0], b[1], b[2], sp[3], dt, None if error is None else type(error).__name__)


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
        span: str = name or str(getattr(f, "__name__", "span"))
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
        return deco(fn)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"traced(name=...) must be a str, got {name!r}")
    return deco


def attrs_dict(flat: Any) -> dict:
    """The attributes of a recorded span as a dict."""
    return dict(zip(flat[::2], flat[1::2])) if flat else {}
