"""The pages, rendered on the server: Jinja2 templates shipped in the package,
charts as inline SVG (no JavaScript library, no CDN).

:func:`page` renders a whole page, :func:`live` the part of it that the live
stream replaces (``<div id="live">``); both read the model under its lock.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

import jinja2

from monarch_dashboard import _analysis
from monarch_dashboard._model import JobModel, LogLine, bucket_bounds, coords_rank

#: the Job page opens every host of a job with at most this many procs (larger: the hosts with a failure)
OPEN_HOSTS_UP_TO = 16
PAGES = ("job", "endpoints", "failures", "logs", "timeline")
TITLES = {"job": "Job", "endpoints": "Endpoints", "failures": "Failures", "logs": "Logs", "timeline": "Timeline"}
FAILURE_FIELDS = ("category", "actor", "endpoint", "mesh", "rank", "ranks", "host_name", "owner", "exit_code",
                  "signal", "handled_by")

_env = jinja2.Environment(loader=jinja2.PackageLoader("monarch_dashboard", "templates"),
                          autoescape=jinja2.select_autoescape(default=True, default_for_string=True),
                          trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)


def ms(ns: Optional[float]) -> str:
    """``ns`` as milliseconds, 3 significant digits (``-`` for none)."""
    if ns is None or ns != ns:
        return "-"
    v = ns / 1e6
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}" if v >= 0.001 else f"{v:.2g}"


def size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def hms(ns: int) -> str:
    """``HH:MM:SS`` (local time) of a wall-clock time in ns."""
    return time.strftime("%H:%M:%S", time.localtime(ns / 1e9))


def clock(ns: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ns / 1e9)) + f".{(ns // 1_000_000) % 1000:03d}"


def histogram_svg(buckets: dict, width: int = 260, height: int = 56) -> dict[str, Any]:
    """Bars of a latency histogram, one per power of two of ns (its 8 buckets summed)."""
    octaves: dict[int, int] = {}
    for i, c in buckets.items():
        lo, _hi = bucket_bounds(int(i))
        o = max(0, int(lo).bit_length() - 1)
        octaves[o] = octaves.get(o, 0) + int(c)
    if not octaves:
        return {"bars": [], "width": width, "height": height, "lo": "", "hi": ""}
    first, last = min(octaves), max(octaves)
    n = last - first + 1
    peak = max(octaves.values())
    bw = width / n
    bars = []
    for k in range(n):
        c = octaves.get(first + k, 0)
        h = 0 if not c else max(2.0, (height - 14) * math.sqrt(c / peak))
        lo_ns = 1 << (first + k)
        bars.append({"x": round(k * bw + 1, 1), "w": round(max(1.0, bw - 2), 1), "y": round(height - 12 - h, 1),
                     "h": round(h, 1), "count": c, "range": f"{ms(lo_ns)}-{ms(lo_ns * 2)} ms"})
    return {"bars": bars, "width": width, "height": height, "lo": ms(1 << first) + " ms",
            "hi": ms(1 << (last + 1)) + " ms", "label_y": height - 1}


def nice_step(total_ms: float, target: int = 8) -> float:
    """A round tick step (1, 2 or 5 x 10^k ms) giving about ``target`` ticks over ``total_ms``."""
    if total_ms <= 0:
        return 1.0
    raw = total_ms / target
    k = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * k >= raw:
            return float(m * k)
    return float(10 * k)


def lane_order(name: str) -> tuple:
    """Sort key of a timeline lane ``<proc name> · <thread>``: the client first, then
    by proc mesh and rank (numerically: 2 before 10), then thread."""
    proc, _, thread = name.partition(" · ")
    if proc == "client":
        return (0, "", -1, thread)
    r = coords_rank(proc)
    return (1, proc.split("{", 1)[0], -1 if r is None else r, thread)


#: most characters of a lane's label (the whole name is its tooltip)
LANE_CHARS = 46


def lane_label(name: str) -> str:
    """A lane's label: ``<proc> · <thread>``, the thread's coordinates left out where
    they repeat the proc's (an actor's thread is named after the actor), cut to
    :data:`LANE_CHARS` characters."""
    proc, sep, thread = name.partition(" · ")
    if "{" in proc and "{" in thread and thread[thread.index("{"):] == proc[proc.index("{"):]:
        thread = thread[: thread.index("{")]
    label = proc + sep + thread
    return label if len(label) <= LANE_CHARS else label[: LANE_CHARS - 1] + "…"


#: px per character of a span label (10 px font), for "does the label fit"
CHAR_PX = 6.2


def timeline_svg(spans: list, width: int = 1100) -> dict[str, Any]:
    """Lanes (one per process and thread, sorted by :func:`lane_order`) of the recorded
    spans under a time axis with round ticks (ms from the first span); a span's
    name is written in it where it fits, and in its tooltip always."""
    if not spans:
        return {"lanes": [], "rects": [], "ticks": [], "width": width, "height": 0, "span_ms": "0"}
    t0 = min(s[1] for s in spans)
    t1 = max(s[1] + s[2] for s in spans)
    total = max(1, t1 - t0)
    names = {f"{a.get('proc_name', '?')} · {a.get('thread', '')}" for _n, _s, _d, a in spans}
    lanes = {n: i for i, n in enumerate(sorted(names, key=lane_order))}
    left, lane_h, top = 300, 20, 24
    plot = width - left - 10
    rects = []
    for name, start, dur, a in spans:
        lane = lanes[f"{a.get('proc_name', '?')} · {a.get('thread', '')}"]
        x = left + (start - t0) / total * plot
        w = max(1.0, dur / total * plot)
        label = name if w >= len(name) * CHAR_PX + 6 else ""
        rects.append({"x": round(x, 1), "y": top + lane * lane_h + 2, "w": round(w, 1), "h": lane_h - 4, "name": name,
                      "kind": a.get("span_kind", ""), "error": a.get("error"), "label": label,
                      "title": f"{name} ({a.get('span_kind', '')}) {ms(dur)} ms at +{ms(start - t0)} ms "
                               f"on {a.get('proc_name', '?')}" + (f", failed: {a.get('error')}" if a.get("error") else "")})
    total_ms = total / 1e6
    step = nice_step(total_ms)
    height = top + len(lanes) * lane_h + 4
    ticks = []
    k = 0
    while k * step <= total_ms + 1e-9:
        v = k * step
        ticks.append({"x": round(left + v / total_ms * plot, 1), "label": f"{v:g} ms"})
        k += 1
    return {"lanes": [{"name": n, "label": lane_label(n), "y": top + i * lane_h + lane_h - 6} for n, i in lanes.items()],
            "rects": rects,
            "ticks": ticks, "axis_y": top - 6, "top": top, "left": left, "width": width, "height": height,
            "span_ms": ms(total)}


def _context(model: JobModel, page: str, q: dict[str, str]) -> dict[str, Any]:
    ctx: dict[str, Any] = {"page": page, "title": TITLES[page], "pages": [(p, TITLES[p]) for p in PAGES],
                           "counts": model.counts(), "client": model.client, "version": model.version, "q": q,
                           "ms": ms, "size": size, "duration": duration, "clock": clock, "hms": hms,
                           "ended_ns": model.ended_ns, "host": model.host_display,
                           "straggler_rule": _analysis.STRAGGLER_RULE}
    if page == "job":
        ctx["tree"] = model.tree()
        ctx["summaries"] = model.mesh_summaries()
        ctx["open_hosts"] = ctx["counts"]["procs"] <= OPEN_HOSTS_UP_TO
    elif page == "endpoints":
        rows = model.endpoint_rows()
        ctx["rows"] = rows
        ctx["hist"] = {(r.mesh, r.endpoint): histogram_svg(r.buckets) for r in rows}
    elif page == "failures":
        ctx["groups"] = model.failure_groups()
        ctx["label"] = model.proc_label
        ctx["fields"] = FAILURE_FIELDS
    elif page == "logs":
        rank: Optional[int] = int(q["rank"]) if q.get("rank", "").isdigit() else None
        lines: list[LogLine] = model.log_view(mesh=q.get("mesh", ""), rank=rank, level=q.get("level", ""),
                                              search=q.get("search", ""))
        ctx["lines"] = lines
        ctx["meshes"] = model.log_meshes()
    elif page == "timeline":
        spans = model.span_view()
        ctx["svg"] = timeline_svg(spans)
        ctx["nspans"] = len(spans)
        ctx["recording"] = dict(model.recording)
    return ctx


def page(model: JobModel, name: str, q: dict[str, str]) -> str:
    """The whole page ``name`` (one of :data:`PAGES`)."""
    return _env.get_template("page.html").render(**_context(model, name, q))


def live(model: JobModel, name: str, q: dict[str, str]) -> str:
    """The live part of page ``name``: what the stream replaces on each change."""
    return _env.get_template(f"{name}.html").render(**_context(model, name, q))
