"""Batches: what a process ships to the root client, and the sink events made of them.

:func:`collect` cuts one batch from this process's buffers -- the spans and
lifecycle events recorded since the last one, a snapshot of each endpoint
stat that changed, and the final snapshots of stats whose actor mesh stopped
(``"retired"``, with the mesh's class) -- as plain data (``marshal``-able: no user object, no code
runs when it is read).  A proc sends it to the root in one control message per
interval (and when it stops, or the root asks); the root turns batches into
:class:`~monarch_core.hookspecs.TelemetryEvent` s for its sinks with
:func:`events_of`.
"""

from __future__ import annotations

import marshal
import time
from typing import Any, Optional

from monarch_core._telemetry import _metrics
from monarch_core._telemetry._core import state
from monarch_core._telemetry._core import SPAN_FIELDS
from monarch_core._telemetry._spans import attrs_dict, clock_offset, decode, records

VERSION = 1
#: The kinds of sink events (``TelemetryEvent.kind``).
ALL_KINDS = frozenset({"span", "metric", "lifecycle"})


def drain(dq: Any) -> list:
    """What ``dq`` holds, taken out (any thread may append meanwhile)."""
    out = []
    pop = dq.popleft
    while dq:
        try:
            out.append(pop())
        except IndexError:
            break
    return out


def collect(*, force: bool = False, address: Optional[str] = None) -> Optional[dict]:
    """The next batch of this process, or None when nothing happened since the
    last one (``force``: a batch even then, e.g. to announce this proc)."""
    metrics = _metrics.changed_snapshots()
    retired = _metrics.take_retired()  # (after ``metrics``: a stat retired meanwhile is in one of them)
    taken = state.take_spans() if state.spans or state._retired else []
    # one ``bytes`` blob: the root keeps it as it is for the trace file (unpacking tens of
    # thousands of tuples per second there would cost the client its garbage collector's time)
    spans = marshal.dumps(taken) if taken else b""
    events = drain(state.events) if state.events else []
    dropped, state.dropped = state.dropped, 0
    if not (metrics or retired or taken or events or dropped or force):
        return None
    return {
        "v": VERSION, **state.identity(), "address": address, "time_ns": time.time_ns(),
        "metrics": metrics, "retired": retired, "spans": spans, "nspans": len(taken) // SPAN_FIELDS, "clock_offset": clock_offset(),
        "events": events, "dropped": dropped,
    }


def hex_id(v: int, width: int) -> Optional[str]:
    """``v`` as ``width`` hex digits, None for 0 (no such id)."""
    return f"{v:0{width}x}" if v else None


def events_of(batch: dict, kinds: frozenset[str]) -> list[Any]:
    """The sink events of one batch (only the ``kinds`` someone wants)."""
    from monarch_core.hookspecs import TelemetryEvent

    ident = {"proc": batch.get("proc"), "proc_name": batch.get("proc_name"), "host": batch.get("host"),
             "pid": batch.get("pid")}
    out: list[Any] = []
    if "span" in kinds and batch.get("spans"):
        offset = int(batch.get("clock_offset") or 0)
        for rec in records(marshal.loads(batch["spans"])):
            name, trace, span, parent, start, dur, kind, thread, attrs = decode(rec, offset)
            a = {**ident, "thread": thread, "trace_id": trace.hex(), "span_id": hex_id(span, 16),
                 "parent_id": hex_id(parent, 16), "span_kind": kind, **attrs_dict(attrs)}
            out.append(TelemetryEvent("span", name, start, dur, a))
    if "lifecycle" in kinds:
        for name, ts, attrs in batch.get("events", ()):
            out.append(TelemetryEvent("lifecycle", name, ts, 0, {**ident, **attrs}))
    if "metric" in kinds:
        ts = batch.get("time_ns") or time.time_ns()
        snaps = list(batch.get("metrics", ()))
        snaps.extend(snap for _class, snap in batch.get("retired", ()))  # a stopped mesh's final totals
        for snap in snaps:
            m = _metrics.from_snapshot(snap, str(batch.get("proc")), str(batch.get("host")))
            out.append(TelemetryEvent("metric", "endpoint", ts, 0, {**ident, **m.as_dict()}))
    return out
