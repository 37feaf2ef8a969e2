"""Summary tables: top endpoints by total time, with p50/p99 and errors.

:func:`table` formats :class:`~._metrics.EndpointMetrics` rows;
:func:`read` reads a recorded file -- a Chrome trace (``record_trace``,
``MONARCH_TRACE_FILE``) or a JSON-lines file (``MONARCH_TELEMETRY_JSONL``) --
into such rows: from its endpoint metrics when it has them (the latest
snapshot of each), otherwise from its endpoint spans.  ``monarch summary FILE``
prints it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from monarch_core._telemetry._batch import ALL_KINDS as _KINDS
from monarch_core._telemetry._metrics import EndpointMetrics, EndpointStat, combine, from_dict, from_snapshot


def _fmt_ms(v: float) -> str:
    return "-" if v != v else f"{v:.3f}"


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def table(rows: Iterable[EndpointMetrics], top: int = 20, per_rank: bool = False) -> str:
    """A text table of ``rows`` summed per (side, mesh, endpoint) (per rank too
    with ``per_rank``), the ``top`` with the most total time first."""
    rows = combine(rows, ("side", "mesh", "endpoint", "rank") if per_rank else ("side", "mesh", "endpoint"))
    rows.sort(key=lambda r: (-r.latency.sum_ns, -r.calls, r.side, r.mesh, r.endpoint))
    head = ["side", "endpoint", "calls", "errors", "total ms", "p50 ms", "p99 ms", "mean ms", "request", "reply"]
    if per_rank:
        head.insert(2, "rank")
    lines = []
    for r in rows[:top] if top else rows:
        errs = ", ".join(f"{t} {n}" for t, n in sorted(r.errors.items())) or "0"
        cells = [r.side, f"{r.mesh}.{r.endpoint}", str(r.calls), errs, _fmt_ms(r.latency.total_ms),
                 _fmt_ms(r.p50_ms), _fmt_ms(r.p99_ms), _fmt_ms(r.latency.mean_ms), _fmt_bytes(r.request_bytes),
                 _fmt_bytes(r.reply_bytes)]
        if per_rank:
            cells.insert(2, "-" if r.rank is None else str(r.rank))
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(head)]
    right = {i for i, h in enumerate(head) if h not in ("side", "endpoint", "errors")}

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in lines]
    if not lines:
        out.append("(no endpoint calls recorded)")
    return "\n".join(out)


def _from_spans(spans: list[tuple[str, str, str, str, int, str | None, Any]]) -> list[EndpointMetrics]:
    """Rows from endpoint spans ``(side, mesh, endpoint, proc, duration_ns, error, rank)``."""
    stats: dict[tuple, EndpointStat] = {}
    for side, mesh, endpoint, proc, dur, err, rank in spans:
        key = (side, mesh, mesh, endpoint, rank if side == "server" else None, "")
        s = stats.get((proc, key))
        if s is None:
            s = stats[(proc, key)] = EndpointStat(key)
        s.record(int(dur), 0, 0, err)
    return [from_snapshot(s.snapshot(), proc, "") for (proc, _k), s in stats.items()]


def read(path: str) -> list[EndpointMetrics]:
    """The endpoint rows of a recorded trace or JSON-lines file (``ValueError``
    when it is neither)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such file: {path!r}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    events: list[dict] = []
    whole: Any = None
    if stripped.startswith("{"):
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None  # one JSON object per line (or not JSON at all: below)
    if stripped.startswith("[") or (isinstance(whole, dict) and "traceEvents" in whole):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            try:
                data = json.loads(stripped.rstrip().rstrip(",") + "]")  # a trace cut short (no closing bracket)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not JSON ({e}); expected a Chrome trace (a JSON array of events) or a "
                                 f"JSON-lines telemetry file") from None
        trace = data["traceEvents"] if isinstance(data, dict) else data
        bad = next((i for i, e in enumerate(trace) if not isinstance(e, dict) or "ph" not in e), None) \
            if isinstance(trace, list) else -1
        if bad is not None:
            where = "its traceEvents are not a list" if bad < 0 else f"event {bad} is {str(trace[bad])[:80]}"
            raise ValueError(
                f"{path}: a JSON file that is not a Chrome trace: {where}, not an event object with a 'ph' field "
                f"(monarch summary reads what record_trace / MONARCH_TRACE_FILE or record_events / "
                f"MONARCH_TELEMETRY_JSONL wrote)")
        spans = []
        for ev in trace:
            args = ev.get("args") or {}
            if ev.get("ph") == "X" and ev.get("cat") in ("client", "server") and "endpoint" in args:
                spans.append((ev["cat"], str(args.get("mesh")), str(args["endpoint"]), str(ev.get("pid")),
                              int(float(ev.get("dur", 0)) * 1000), args.get("error"), args.get("rank")))
        return _from_spans(spans)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{n}: not a Chrome trace (a JSON array) nor a JSON-lines telemetry file ({e})"
            ) from None
        if not isinstance(ev, dict) or ev.get("kind") not in _KINDS:
            raise ValueError(
                f"{path}:{n}: not a telemetry event: {line.strip()[:80]} (a JSON-lines telemetry file has one "
                f"object per line with a 'kind' of {sorted(_KINDS)}; a Chrome trace is a JSON array of events) "
                f"-- monarch summary reads what record_trace / MONARCH_TRACE_FILE or record_events / "
                f"MONARCH_TELEMETRY_JSONL wrote")
        events.append(ev)
    latest: dict[tuple, dict] = {}
    spans = []
    for ev in events:
        a = ev.get("attributes") or {}
        if ev.get("kind") == "metric":
            key = (a.get("proc"), a.get("side"), a.get("mesh_key"), a.get("endpoint"), a.get("rank"), a.get("adverb"))
            latest[key] = a  # cumulative: the last one wins
        elif ev.get("kind") == "span" and a.get("span_kind") in ("client", "server") and "endpoint" in a:
            spans.append((a["span_kind"], str(a.get("mesh")), str(a["endpoint"]), str(a.get("proc")),
                          int(ev.get("duration_ns", 0)), a.get("error"), a.get("rank")))
    if latest:
        return [from_dict(a) for a in latest.values()]
    return _from_spans(spans)
