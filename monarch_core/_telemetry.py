"""Telemetry: ``@traced`` spans and lifecycle events, batched to plugin sinks.

Sinks come from the ``monarch_telemetry_sinks`` hook, resolved once per
process.  With no sink installed nothing is recorded at all.  Events are
buffered and handed to sinks in batches from a background thread about once a
second, and at exit.
"""

from __future__ import annotations

import atexit
import collections
import functools
import inspect
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, TypeVar, overload

if TYPE_CHECKING:  # hookspecs imports pluggy: not at ``import monarch_core.actor``
    from monarch_core.hookspecs import TelemetryEvent, TelemetrySink

logger = logging.getLogger("monarch.telemetry")

F = TypeVar("F", bound=Callable[..., Any])
FLUSH_INTERVAL = 1.0
MAX_BUFFER = 100_000


class _Recorder:
    def __init__(self) -> None:
        self.sinks: list[TelemetrySink] | None = None
        self.buffer: collections.deque[TelemetryEvent] = collections.deque(maxlen=MAX_BUFFER)
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def enabled(self) -> bool:
        sinks = self.sinks
        if sinks is None:
            sinks = self._resolve()
        return bool(sinks)

    def _resolve(self) -> list[TelemetrySink]:
        with self.lock:
            if self.sinks is None:
                from monarch_core._plugins import registry

                sinks: list[TelemetrySink] = []
                try:
                    for group in registry().pm.hook.monarch_telemetry_sinks():
                        sinks.extend(group or ())
                except Exception:
                    logger.exception("a monarch_telemetry_sinks hook failed; telemetry from it is disabled")
                self.sinks = sinks
                if sinks:
                    self.thread = threading.Thread(target=self._run, name="monarch-telemetry", daemon=True)
                    self.thread.start()
                    atexit.register(self.flush, True)
        return self.sinks

    def record(self, event: TelemetryEvent) -> None:
        if self.enabled():
            self.buffer.append(event)

    def _run(self) -> None:
        while True:
            time.sleep(FLUSH_INTERVAL)
            self.flush()

    def flush(self, close: bool = False) -> None:
        batch = []
        buf = self.buffer
        while buf:
            try:
                batch.append(buf.popleft())
            except IndexError:
                break
        for sink in self.sinks or ():
            try:
                if batch:
                    sink.emit(batch)
                if close:
                    sink.close()
            except Exception:
                logger.exception("telemetry sink %r failed", sink)


recorder = _Recorder()


def _event(*args: Any) -> TelemetryEvent:
    from monarch_core.hookspecs import TelemetryEvent

    return TelemetryEvent(*args)


def lifecycle(name: str, **attributes: Any) -> None:
    """Record a lifecycle event (proc/actor spawned, stopped, failed)."""
    if recorder.sinks == []:
        return
    recorder.record(_event("lifecycle", name, time.time_ns(), 0, attributes))


#: The context variable holding the running actor (set by ``_actor._state``,
#: which this bottom-layer module does not import).
current_actor: Any = None


def _span_attrs() -> dict[str, Any]:
    host = current_actor.get() if current_actor is not None else None
    return {"actor": host.actor_id} if host is not None else {}


@overload
def traced(fn: F, /) -> F: ...
@overload
def traced(*, name: str) -> Callable[[F], F]: ...


def traced(fn: Any = None, /, *, name: str | None = None) -> Any:
    """Wrap a sync or async function in a telemetry span (named ``name`` or the
    function's ``__name__``), associated with the current actor, if any."""

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        span = name or getattr(f, "__name__", "span")
        if inspect.iscoroutinefunction(f):

            @functools.wraps(f)
            async def awrapper(*args: Any, **kwargs: Any) -> Any:
                if not recorder.enabled():
                    return await f(*args, **kwargs)
                t0 = time.time_ns()
                p0 = time.perf_counter_ns()
                try:
                    return await f(*args, **kwargs)
                finally:
                    recorder.buffer.append(
                        _event("span", span, t0, time.perf_counter_ns() - p0, _span_attrs())
                    )

            return awrapper

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not recorder.enabled():
                return f(*args, **kwargs)
            t0 = time.time_ns()
            p0 = time.perf_counter_ns()
            try:
                return f(*args, **kwargs)
            finally:
                recorder.buffer.append(_event("span", span, t0, time.perf_counter_ns() - p0, _span_attrs()))

        return wrapper

    if fn is not None:
        if not callable(fn):
            raise TypeError(f"@traced decorates a function; got {fn!r}. Use @traced or @traced(name='...').")
        return deco(fn)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"traced(name=...) must be a str, got {name!r}")
    return deco
