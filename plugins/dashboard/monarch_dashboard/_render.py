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

from monarch_dashboard._model import JobModel, LogLine, bucket_bounds

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


def timeline_svg(spans: list, width: int = 1100) -> dict[str, Any]:
    """Lanes (one per process and thread) of the recorded spans, on one time axis."""
    if not spans:
        return {"lanes": [], "rects": [], "width": width, "height": 0, "span_ms": "0"}
    t0 = min(s[1] for s in spans)
    t1 = max(s[1] + s[2] for s in spans)
    total = max(1, t1 - t0)
    lanes: dict[str, int] = {}
    for _n, _s, _d, a in spans:
        lanes.setdefault(f"{a.get('proc_name', '?')} · {a.get('thread', '')}", len(lanes))
    left, lane_h = 360, 18
    rects = []
    for name, start, dur, a in spans:
        lane = lanes[f"{a.get('proc_name', '?')} · {a.get('thread', '')}"]
        x = left + (start - t0) / total * (width - left - 10)
        w = max(1.0, dur / total * (width - left - 10))
        rects.append({"x": round(x, 1), "y": lane * lane_h + 2, "w": round(w, 1), "h": lane_h - 4, "name": name,
                      "kind": a.get("span_kind", ""), "error": a.get("error"),
                      "title": f"{name} ({a.get('span_kind', '')}) {ms(dur)} ms on {a.get('proc_name', '?')}"})
    return {"lanes": [{"name": n, "y": i * lane_h + lane_h - 5} for n, i in lanes.items()], "rects": rects,
            "width": width, "height": len(lanes) * lane_h + 4, "span_ms": ms(total)}


def _context(model: JobModel, page: str, q: dict[str, str]) -> dict[str, Any]:
    ctx: dict[str, Any] = {"page": page, "title": TITLES[page], "pages": [(p, TITLES[p]) for p in PAGES],
                           "counts": model.counts(), "client": model.client, "version": model.version, "q": q,
                           "ms": ms, "size": size, "duration": duration, "clock": clock}
    if page == "job":
        ctx["tree"] = model.tree()
    elif page == "endpoints":
        rows = model.endpoint_rows()
        ctx["rows"] = rows
        ctx["hist"] = {(r.mesh, r.endpoint): histogram_svg(r.buckets) for r in rows}
    elif page == "failures":
        ctx["failures"] = model.failure_view()
        ctx["fields"] = FAILURE_FIELDS
    elif page == "logs":
        rank: Optional[int] = int(q["rank"]) if q.get("rank", "").isdigit() else None
        lines: list[LogLine] = model.log_view(mesh=q.get("mesh", ""), rank=rank, level=q.get("level", ""))
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
