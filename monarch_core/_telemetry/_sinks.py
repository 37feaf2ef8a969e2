"""The sinks that ship with monarch-core: JSON lines, and a Chrome trace-event file.

Both are :class:`~monarch_core.hookspecs.TelemetrySink` s: they receive
batches of events in the root client (from its telemetry thread, never per
call) and write them as they come, so a run that ends badly still leaves what
was flushed.
"""

from __future__ import annotations

import json
import logging
import marshal
import os
import threading
from collections.abc import Sequence
from typing import IO, Any, Optional

from monarch_core._telemetry._batch import ALL_KINDS, hex_id
from monarch_core._telemetry._spans import attrs_dict, decode, records
from monarch_core.hookspecs import TelemetryEvent, TelemetrySink

logger = logging.getLogger("monarch.telemetry")



def _open(path: str, mode: str) -> IO[str]:
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise TypeError(f"a telemetry file path must be a non-empty str or os.PathLike, got {path!r}")
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise FileNotFoundError(f"cannot write telemetry to {path!r}: the directory {d!r} does not exist")
    return open(path, mode, encoding="utf-8")


class JsonLinesSink(TelemetrySink):
    """One JSON object per event and line: ``{"kind", "name", "start_ns",
    "duration_ns", "attributes": {...}}`` (see ``docs/observability.md`` for
    the attributes of each kind).  Appends to ``path``; ``monarch summary PATH``
    reads it back.  ``kinds`` limits what it writes (default: every kind)."""

    def __init__(self, path: str, kinds: Optional[Sequence[str]] = None) -> None:
        self.path = os.fspath(path)
        self.kinds = frozenset(kinds) if kinds is not None else ALL_KINDS
        unknown = sorted(self.kinds - ALL_KINDS)
        if unknown:
            raise ValueError(f"JsonLinesSink(kinds=...): unknown kind(s) {unknown}; the kinds are {sorted(ALL_KINDS)}")
        self._f: Optional[IO[str]] = _open(self.path, "a")
        self._lock = threading.Lock()

    def emit(self, events: Sequence[TelemetryEvent]) -> None:
        with self._lock:
            f = self._f
            if f is None:
                return
            for e in events:
                if e.kind in self.kinds:
                    f.write(json.dumps({"kind": e.kind, "name": e.name, "start_ns": e.start_ns,
                                        "duration_ns": e.duration_ns, "attributes": dict(e.attributes)},
                                       default=str, separators=(",", ":")) + "\n")
            f.flush()

    def close(self) -> None:
        with self._lock:
            f, self._f = self._f, None
        if f is not None:
            f.close()

    def __repr__(self) -> str:
        return f"JsonLinesSink({self.path!r})"


class ChromeTraceSink(TelemetrySink):
    """A trace in the Chrome trace-event JSON format (opens in Perfetto UI and
    ``chrome://tracing``).

    One process track per proc (named ``<proc> (<host>, pid <pid>)``), one
    thread track per actor (its display name; the client's threads by name),
    spans as complete (``X``) events with their attributes as ``args``, a flow
    arrow from each call's client span to its server span, lifecycle events as
    process-scoped instant (``i``) events on a ``lifecycle`` track.

    While the run goes, batches are kept as they arrive (``marshal``, in an
    anonymous temporary file: a few hundred nanoseconds per span in the
    client); :meth:`close` writes the JSON file (``record_trace``'s end, or the
    client's shutdown).  ``path`` is created at once, so a bad path fails early.
    """

    kinds = frozenset({"span", "lifecycle"})

    def __init__(self, path: str) -> None:
        import tempfile

        self.path = os.fspath(path)
        self._out: Optional[IO[str]] = _open(self.path, "w")
        self._spill: Optional[IO[bytes]] = tempfile.TemporaryFile(prefix="monarch-trace-")
        self._lock = threading.Lock()
        self.spans = 0

    def emit_batches(self, batches: Sequence[dict]) -> None:
        """The hub's fast path: keep the raw batches (``_telemetry._batch``)."""
        with self._lock:
            spill = self._spill
            if spill is None:
                return
            for b in batches:
                spans, events = b.get("spans") or b"", b.get("events") or []
                if spans or events:
                    ident = (b.get("proc"), b.get("proc_name"), b.get("host"), b.get("pid"))
                    offset = int(b.get("clock_offset") or 0)
                    marshal.dump(("b", ident, bytes(spans), offset, events), spill)  # the blob as it came
                    self.spans += int(b.get("nspans") or 0)

    def emit(self, events: Sequence[TelemetryEvent]) -> None:
        with self._lock:
            spill = self._spill
            if spill is None:
                return
            rows = [(e.kind, e.name, e.start_ns, e.duration_ns, _plain(dict(e.attributes))) for e in events
                    if e.kind in self.kinds]
            if rows:
                marshal.dump(("e", rows), spill)

    def close(self) -> None:
        with self._lock:
            out, spill = self._out, self._spill
            self._out = self._spill = None
        if out is None or spill is None:
            return
        try:
            _ChromeWriter(out).write_all(spill)
        finally:
            spill.close()
            out.close()

    def __repr__(self) -> str:
        return f"ChromeTraceSink({self.path!r})"


def _plain(v: Any) -> Any:
    """``v`` with what ``marshal`` cannot hold turned into text."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


class _ChromeWriter:
    """Turns kept batches into the trace-event JSON array."""

    def __init__(self, f: IO[str]) -> None:
        self.f = f
        self.first = True
        self.pids: dict[Any, int] = {}
        self.tids: dict[tuple, int] = {}
        self.per_pid: dict[int, int] = {}

    def write(self, obj: dict) -> None:
        self.f.write(("[\n" if self.first else ",\n") + json.dumps(obj, default=str, separators=(",", ":")))
        self.first = False

    def pid(self, proc: Any, name: Any, host: Any, pid: Any) -> int:
        p = self.pids.get(proc)
        if p is None:
            p = self.pids[proc] = len(self.pids) + 1
            self.write({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                        "args": {"name": f"{name or proc} ({host}, pid {pid})"}})
            self.write({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0, "args": {"sort_index": p}})
        return p

    def tid(self, pid: int, thread: str) -> int:
        key = (pid, thread)
        t = self.tids.get(key)
        if t is None:
            t = self.tids[key] = self.per_pid[pid] = self.per_pid.get(pid, 0) + 1
            self.write({"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": thread}})
        return t

    def span(self, pid: int, name: str, trace: int, span: int, parent: int, start: int, dur: int, kind: str,
             thread: str, attrs: dict) -> None:
        tid = self.tid(pid, str(thread or "main"))
        ts = start / 1000.0
        args = {"trace_id": trace.hex() if isinstance(trace, bytes) else hex_id(trace, 32), "span_id": hex_id(span, 16),
                "parent_id": hex_id(parent, 16),
                **(attrs if isinstance(attrs, dict) else attrs_dict(attrs))}
        self.write({"name": name, "cat": kind, "ph": "X", "ts": ts, "dur": dur / 1000.0, "pid": pid, "tid": tid,
                    "args": args})
        if kind == "client" and span:
            self.write({"name": "call", "cat": "monarch.call", "ph": "s", "id": args["span_id"], "ts": ts,
                        "pid": pid, "tid": tid})
        elif kind == "server" and parent:
            self.write({"name": "call", "cat": "monarch.call", "ph": "f", "bp": "e", "id": args["parent_id"],
                        "ts": ts, "pid": pid, "tid": tid})

    def instant(self, pid: int, name: str, ts: int, attrs: dict) -> None:
        self.write({"name": name, "cat": "lifecycle", "ph": "i", "s": "p", "ts": ts / 1000.0, "pid": pid,
                    "tid": self.tid(pid, "lifecycle"), "args": attrs})

    def write_all(self, spill: IO[bytes]) -> None:
        spill.flush()
        spill.seek(0)
        while True:
            try:
                rec = marshal.load(spill)
            except EOFError:
                break
            if rec[0] == "b":
                _tag, (proc, name, host, opid), spans, offset, events = rec
                pid = self.pid(proc, name, host, opid)
                for sp in records(marshal.loads(spans)) if spans else ():
                    self.span(pid, *decode(sp, offset))
                for ev_name, ts, attrs in events:
                    self.instant(pid, ev_name, ts, attrs)
            else:
                for kind, name, start, dur, a in rec[1]:
                    pid = self.pid(a.get("proc"), a.get("proc_name"), a.get("host"), a.get("pid"))
                    if kind == "span":
                        self.span(pid, name, int(a.get("trace_id") or "0", 16), int(a.get("span_id") or "0", 16),
                                  int(a.get("parent_id") or "0", 16), start, dur, str(a.get("span_kind", "internal")),
                                  str(a.get("thread") or "main"),
                                  {k: v for k, v in a.items() if k not in _IDENT and k not in _IDS})
                    else:
                        self.instant(pid, name, start, {k: v for k, v in a.items() if k not in ("proc_name", "pid")})
        self.f.write("[\n]\n" if self.first else "\n]\n")


_IDENT = ("proc", "proc_name", "host", "pid", "thread")
_IDS = ("trace_id", "span_id", "parent_id", "span_kind")
