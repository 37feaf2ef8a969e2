"""The root client's side: sinks, the batches procs ship, and the telemetry thread.

Sinks live in the root client only: the ``monarch_telemetry_sinks`` plugins
(resolved once, when the client's runtime starts; the built-in plugin
``telemetry_files``, :mod:`._plugin`, gives the ones the settings name,
``MONARCH_TRACE_FILE`` and ``MONARCH_TELEMETRY_JSONL``) and the ones added from
Python (``monarch_core.telemetry.add_sink``, ``record_trace``).  Procs ship
their batches here (:func:`ingest`); the telemetry thread hands them, with the
client's own, to every sink about once per ``MONARCH_TELEMETRY_INTERVAL`` and
at shutdown.  A sink that raises is logged and kept.  With no sink, batches
still update the endpoint metrics; spans and events are dropped.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
from typing import Any, Optional

from monarch_core import settings
from monarch_core._proc import _output
from monarch_core._telemetry import _batch, _metrics
from monarch_core._telemetry._core import state

logger = logging.getLogger("monarch.telemetry")



def kinds_of(sink: Any) -> frozenset[str]:
    """The event kinds ``sink`` wants (its ``kinds`` attribute; default all)."""
    kinds = getattr(sink, "kinds", None)
    if kinds is None:
        return _batch.ALL_KINDS
    try:
        k = frozenset(kinds)
    except TypeError:
        raise TypeError(f"{sink!r}.kinds must be a set of event kinds from {sorted(_batch.ALL_KINDS)}, got {kinds!r}") from None
    unknown = sorted(k - _batch.ALL_KINDS)
    if unknown:
        raise ValueError(f"{sink!r}.kinds holds unknown kind(s) {unknown}; the kinds are {sorted(_batch.ALL_KINDS)}")
    return k


class Hub:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.emit_lock = threading.Lock()
        self.entries: list[tuple[Any, frozenset[str]]] = []
        self.pending: collections.deque[dict] = collections.deque()
        self.sources: dict[str, Optional[str]] = {}  # proc id -> address: procs that shipped here
        self.thread: Optional[threading.Thread] = None
        self.wake = threading.Event()
        self.closed = False
        self.started = False

    # -------------------------------------------------------------- sinks
    def start(self) -> None:
        """Resolve the plugins' sinks (once; the root's runtime start)."""
        with self.lock:
            if self.started or not state.enabled:
                return
            self.started = True
            self.closed = False
            try:
                from monarch_core._plugins import registry

                for group in registry().pm.hook.monarch_telemetry_sinks():
                    for sink in group or ():
                        self._add(sink)
            except Exception:
                logger.exception("a monarch_telemetry_sinks hook failed; its sinks are not used")

    def add(self, sink: Any) -> None:
        """Install ``sink`` (anything with ``emit(events)``; ``close()`` optional)."""
        if not callable(getattr(sink, "emit", None)):
            raise TypeError(
                f"add_sink() takes a TelemetrySink (an object with emit(events) and close()), got {sink!r}"
            )
        kinds_of(sink)
        with self.lock:
            self.closed = False
            self._add(sink)

    def _add(self, sink: Any) -> None:
        self.entries.append((sink, kinds_of(sink)))
        self._changed()
        if self.thread is None or not self.thread.is_alive():
            self.thread = threading.Thread(target=self._run, name="monarch-telemetry", daemon=True)
            self.thread.start()

    def remove(self, sink: Any, close: bool = True) -> bool:
        """Flush everything to ``sink``, then uninstall it (and ``close()`` it)."""
        self.tick()
        with self.lock:
            # a plugin's sink is held behind its GuardedSink: the plugin's own object finds it too
            held = [s for s, _k in self.entries if s is sink or getattr(s, "wrapped", None) is sink]
            self.entries = [(s, k) for s, k in self.entries if not any(s is h for h in held)]
            self._changed()
        if close:
            for s in held:
                _close(s)
        return bool(held)

    def _changed(self) -> None:
        state.sinks_active = bool(self.entries)
        if state.is_root:
            state.tracing = state.enabled and any("span" in k for _s, k in self.entries)

    def proc_ended(self, proc: str) -> None:
        """``proc`` is gone: forget where it was (its figures stay, as stopped meshes')."""
        self.sources.pop(proc, None)
        _metrics.proc_ended(proc)

    # -------------------------------------------------------------- batches
    def ingest(self, batch: dict) -> None:
        """A batch a proc shipped (any thread)."""
        proc = batch.get("proc")
        if not isinstance(proc, str):
            logger.warning("telemetry batch without a proc id dropped")
            return
        self.sources[proc] = batch.get("address")
        metrics = batch.get("metrics")
        retired = batch.get("retired")
        if metrics or retired:
            _metrics.merge(proc, str(batch.get("host")), metrics or (), retired or ())
        if batch.get("output") or batch.get("log_file"):
            _output.printer.add(batch)
        if self.entries and (batch.get("spans") or batch.get("events") or metrics or retired):
            self.pending.append(batch)

    def tick(self) -> None:
        """Hand everything recorded so far to the sinks (any thread; serialized).
        Only in the root: a proc's buffers go to the root in its batches."""
        if not state.is_root:
            return
        with self.emit_lock:
            batches = []
            local = _batch.collect()
            if local is not None:
                batches.append(local)
            batches.extend(_batch.drain(self.pending))
            entries = list(self.entries)
            if not batches or not entries:
                return
            for sink, kinds in entries:
                try:
                    raw = getattr(sink, "emit_batches", None)
                    if raw is not None:  # a built-in sink that takes the batches as they are
                        raw(batches)
                        continue
                    events: list = []
                    for b in batches:
                        events.extend(_batch.events_of(b, kinds))
                    if events:
                        sink.emit(events)
                except Exception:
                    logger.exception("telemetry sink %r failed; it is kept", sink)

    def _run(self) -> None:
        while True:
            self.wake.wait(state.interval)
            self.wake.clear()
            if self.closed:
                return
            try:
                self.tick()
            except Exception:  # pragma: no cover - tick logs sink errors itself
                logger.exception("telemetry thread failed")

    def close(self) -> None:
        """Final flush to every sink, then close them (the root's shutdown; idempotent)."""
        if not state.is_root:
            return
        _output.printer.flush()
        try:
            self.tick()
        finally:
            with self.lock:
                entries, self.entries = self.entries, []
                self.closed = True
                self.started = False
                self._changed()
            self.wake.set()
            for sink, _k in entries:
                _close(sink)


def _close(sink: Any) -> None:
    close = getattr(sink, "close", None)
    if close is None:
        return
    try:
        close()
    except Exception:
        logger.exception("closing telemetry sink %r failed", sink)


hub = Hub()
atexit.register(hub.close)
