"""What the dashboard shows, folded from the telemetry a sink receives.

:class:`JobModel` is plain data behind one lock: the tree of host meshes,
hosts, procs and actor meshes (from lifecycle events), the latest endpoint
totals (from metric events: cumulative per process, so the latest one of a
key supersedes the earlier), the failures and supervision events in time
order, the proc output lines the client printed, and the spans of the last
recording.  Every change bumps :attr:`JobModel.version` and calls the
listeners (the server wakes its live pages); nothing here runs per endpoint
call -- the telemetry thread calls :meth:`JobModel.ingest` about once per
``MONARCH_TELEMETRY_INTERVAL``.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Optional

#: lifecycle events listed on the failures page
FAILURE_EVENTS = ("proc.failed", "actor.failed", "supervision.event", "supervision.handled", "host_mesh.lost_host")
#: logging levels recognised in an output line (else the line is a plain print, shown as INFO)
LEVELS = {"DEBUG": 10, "INFO": 20, "WARNING": 30, "WARN": 30, "ERROR": 40, "CRITICAL": 50}
_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\b")
_COORD = re.compile(r"'?(\w+)'?\s*:\s*(\d+)\s*/\s*(\d+)")
#: ``[<actor or proc> <host>] text``: the prefix the client's printer gives streamed proc output
_PREFIXED = re.compile(r"^\[(?P<who>[^\s\[\]{}]+(?:\{[^}]*\})?) (?P<host>[^\s\]]+)\] ?(?P<text>.*)$")
_SIMILAR = re.compile(r"^\[(?P<n>\d+) similar lines\] ?(?P<text>.*)$")
RATE_WINDOW_S = 60.0


def coords_rank(coords: Any) -> Optional[int]:
    """The row-major rank of coordinates written ``{'hosts': 0/2, 'procs': 3/4}``."""
    found = _COORD.findall(str(coords or ""))
    if not found:
        return None
    rank = 0
    for _name, i, n in found:
        rank = rank * int(n) + int(i)
    return rank


def bucket_bounds(i: int) -> tuple[int, int]:
    """``[low, high)`` ns of endpoint-histogram bucket ``i``: exact below 16 ns,
    then 8 buckets per power of two (``monarch_core.telemetry.Latency``)."""
    if i < 16:
        return i, i + 1
    b = (i >> 3) + 3
    lo = (8 + (i & 7)) << (b - 4)
    return lo, lo + (1 << (b - 4))


def percentile(buckets: Mapping[int, int], count: int, q: float, lo_ns: int, hi_ns: int) -> Optional[float]:
    """The ``q``-th percentile in ns of a histogram (None without samples)."""
    if count <= 0:
        return None
    rank = q / 100.0 * count
    seen = 0
    for i in sorted(buckets):
        c = buckets[i]
        if c and seen + c >= rank:
            lo, hi = bucket_bounds(i)
            v = lo + (hi - lo) * (max(0.0, rank - seen) / c)
            return float(min(max(v, lo_ns), hi_ns))
        seen += c
    return float(hi_ns)


@dataclasses.dataclass
class Proc:
    proc_id: str
    mesh: str
    rank: Optional[int]
    coords: str
    host_name: str
    os_pid: Optional[int]
    state: str = "running"
    ready_ns: int = 0
    end_ns: int = 0
    reason: str = ""
    first_failure: str = ""


@dataclasses.dataclass
class ActorMesh:
    key: str
    mesh: str
    class_name: str
    proc_mesh: str
    extent: dict
    state: str = "starting"
    #: rank -> (what failed, the first event of its cascade)
    failed: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class LogLine:
    id: int
    time_ns: int
    stream: str
    who: str
    host: str
    mesh: str
    rank: Optional[int]
    level: str
    text: str
    count: int = 1

    @property
    def prefix(self) -> str:
        if self.count > 1:
            return f"[{self.count} similar lines]"
        return f"[{self.who} {self.host}]" if self.host else f"[{self.who}]"


@dataclasses.dataclass
class EndpointRow:
    """One mesh/endpoint (or one rank of it) summed over the procs that report it."""

    mesh: str
    endpoint: str
    rank: Optional[int] = None
    calls: int = 0
    errors: dict = dataclasses.field(default_factory=dict)
    count: int = 0
    sum_ns: int = 0
    min_ns: int = 0
    max_ns: int = 0
    buckets: dict = dataclasses.field(default_factory=dict)
    request_bytes: int = 0
    reply_bytes: int = 0
    client_p50_ns: Optional[float] = None
    client_p99_ns: Optional[float] = None
    rate: float = 0.0
    ranks: list = dataclasses.field(default_factory=list)

    def add(self, a: Mapping[str, Any]) -> None:
        self.calls += int(a.get("calls") or 0)
        for k, v in dict(a.get("errors") or {}).items():
            self.errors[k] = self.errors.get(k, 0) + int(v)
        n = int(a.get("latency_count") or 0)
        if n:
            lo, hi = int(a.get("latency_min_ns") or 0), int(a.get("latency_max_ns") or 0)
            self.min_ns = lo if not self.count else min(self.min_ns, lo)
            self.max_ns = hi if not self.count else max(self.max_ns, hi)
            self.count += n
            self.sum_ns += int(a.get("latency_sum_ns") or 0)
            for i, c in dict(a.get("latency_buckets") or {}).items():
                self.buckets[int(i)] = self.buckets.get(int(i), 0) + int(c)
        self.request_bytes += int(a.get("request_bytes") or 0)
        self.reply_bytes += int(a.get("reply_bytes") or 0)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def p(self, q: float) -> Optional[float]:
        return percentile(self.buckets, self.count, q, self.min_ns, self.max_ns)


class JobModel:
    """The dashboard's picture of the job (see the module docstring)."""

    def __init__(self, *, max_logs: int = 5000, max_failures: int = 2000, max_spans: int = 5000) -> None:
        self.lock = threading.RLock()
        self.version = 0
        self.started_ns = time.time_ns()
        self.client: dict[str, Any] = {}
        self.host_meshes: dict[str, dict[str, Any]] = {}
        self.proc_meshes: dict[str, dict[str, Any]] = {}
        self.procs: dict[str, Proc] = {}
        self.actor_meshes: dict[str, ActorMesh] = {}
        self.failures: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_failures)
        self.metrics: dict[tuple, dict[str, Any]] = {}
        self._history: dict[tuple[str, str], collections.deque[tuple[float, int]]] = {}
        self.logs: collections.deque[LogLine] = collections.deque(maxlen=max_logs)
        self._log_id = 0
        self.spans: collections.deque[tuple[str, int, int, dict]] = collections.deque(maxlen=max_spans)
        self.recording: dict[str, Any] = {}
        self._listeners: list[Callable[[], None]] = []

    # -------------------------------------------------------------- change
    def listen(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (no lock held) after every change."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        self.version += 1

    def _notify(self) -> None:
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:  # noqa: BLE001 - a listener going away must not stop telemetry
                pass

    # -------------------------------------------------------------- telemetry
    def ingest(self, events: Sequence[Any]) -> None:
        """A batch of ``TelemetryEvent`` s (the telemetry thread)."""
        if not events:
            return
        with self.lock:
            metrics = False
            for e in events:
                a = e.attributes
                if not self.client and a.get("proc_name") == "client":
                    self.client = {"host": a.get("host"), "pid": a.get("pid"), "proc": a.get("proc")}
                if e.kind == "metric":
                    key = (a.get("side"), a.get("mesh_key") or a.get("mesh"), a.get("endpoint"), a.get("rank"),
                           a.get("adverb"), a.get("proc"))
                    self.metrics[key] = dict(a)
                    metrics = True
                elif e.kind == "lifecycle":
                    self._lifecycle(e.name, e.start_ns, a)
                elif e.kind == "span":
                    self.spans.append((e.name, e.start_ns, e.duration_ns, dict(a)))
            if metrics:
                self._sample_rates()
            self._changed()
        self._notify()

    def _lifecycle(self, name: str, ts: int, a: Mapping[str, Any]) -> None:
        mesh = str(a.get("mesh", ""))
        if name == "host_mesh.spawned":
            self.host_meshes[mesh] = {"name": mesh, "hosts": list(a.get("hosts") or ()),
                                      "scheduler": a.get("scheduler"), "state": "running", "t": ts, "lost": {}}
        elif name in ("host_mesh.stopping", "host_mesh.stopped"):
            hm = self.host_meshes.get(mesh)
            if hm is not None:
                hm["state"] = name.split(".")[1]
        elif name == "host_mesh.lost_host":
            hm = self.host_meshes.get(mesh)
            if hm is not None:
                hm["lost"][str(a.get("host_name"))] = str(a.get("reason", ""))
        elif name == "proc_mesh.spawned":
            self.proc_meshes[mesh] = {"name": mesh, "host_mesh": a.get("host_mesh"), "extent": dict(a.get("extent") or {}),
                                      "hosts": list(a.get("hosts") or ()), "state": "starting", "t": ts}
        elif name in ("proc_mesh.ready", "proc_mesh.stopping", "proc_mesh.stopped"):
            pm = self.proc_meshes.get(mesh)
            if pm is not None:
                pm["state"] = {"ready": "running"}.get(name.split(".")[1], name.split(".")[1])
            if name != "proc_mesh.ready":
                for p in self.procs.values():
                    if p.mesh == mesh and p.state in ("starting", "running", "stopping"):
                        p.state = "stopping" if name == "proc_mesh.stopping" else "stopped"
                        if p.state == "stopped":
                            p.end_ns = p.end_ns or ts
        elif name == "proc.ready":
            pid = str(a.get("proc_id"))
            self.procs[pid] = Proc(pid, mesh, a.get("rank"), str(a.get("coords", "")), str(a.get("host_name", "")),
                                   a.get("os_pid"), "running", ts)
        elif name in ("proc.stopped", "proc.failed"):
            p = self.procs.get(str(a.get("proc_id")))
            if p is not None:
                p.state = "stopped" if name == "proc.stopped" else "failed"
                p.end_ns = ts
                p.reason = str(a.get("reason", ""))
        elif name == "actor_mesh.spawned":
            key = str(a.get("mesh_key") or mesh)
            self.actor_meshes[key] = ActorMesh(key, mesh, str(a.get("class_name", "")), str(a.get("proc_mesh", "")),
                                               dict(a.get("extent") or {}))
        elif name.startswith("actor_mesh."):
            am = self.actor_meshes.get(str(a.get("mesh_key") or mesh))
            if am is not None:
                am.state = {"ready": "running"}.get(name.split(".")[1], name.split(".")[1])
        elif name == "actor.failed":
            am = self.actor_meshes.get(str(a.get("mesh_key") or mesh))
            if am is not None and a.get("rank") is not None:
                am.failed.setdefault(int(a["rank"]), (str(a.get("category", "")), str(a.get("cause", "")).strip()))
        elif name == "supervision.event":
            self._supervision(a)
        if name in FAILURE_EVENTS:
            self.failures.append({"name": name, "time_ns": ts, **a})

    def _supervision(self, a: Mapping[str, Any]) -> None:
        root = dict(a.get("root_cause") or {})
        first = f"{root.get('actor') or '?'} [{root.get('category') or a.get('category')}]: {root.get('cause', '')}"
        am = self.actor_meshes.get(str(a.get("mesh_key") or a.get("mesh")))
        for coords in a.get("ranks") or ():
            r = coords_rank(coords)
            if am is not None and r is not None:
                am.failed[r] = (str(a.get("category", "")), first)  # the cascade's first event says most
                for p in self.procs.values():
                    if p.mesh == am.proc_mesh and p.rank == r and not p.first_failure:
                        p.first_failure = first

    def _sample_rates(self) -> None:
        now = time.monotonic()
        totals: dict[tuple[str, str], int] = collections.defaultdict(int)
        has_server: set[tuple[str, str]] = set()
        for (side, _k, _e, _r, _ad, _p), a in self.metrics.items():
            if side == "server":
                has_server.add((str(a.get("mesh")), str(a.get("endpoint"))))
        for (side, _k, _e, _r, _ad, _p), a in self.metrics.items():
            key = (str(a.get("mesh")), str(a.get("endpoint")))
            if side == ("server" if key in has_server else "client"):
                totals[key] += int(a.get("calls") or 0)
        for key, total in totals.items():
            h = self._history.setdefault(key, collections.deque())
            h.append((now, total))
            while len(h) > 2 and now - h[1][0] >= RATE_WINDOW_S:
                h.popleft()

    # -------------------------------------------------------------- output
    def add_output(self, stream: str, lines: Iterable[str]) -> None:
        """Lines the client printed (its stdout/stderr; streamed proc output among them)."""
        with self.lock:
            now = time.time_ns()
            for line in lines:
                count = 1
                m = _PREFIXED.match(line)
                if m:
                    who, host, text = m.group("who"), m.group("host"), m.group("text")
                else:
                    s = _SIMILAR.match(line)
                    if s:
                        who, host, text, count = "", "", s.group("text"), int(s.group("n"))
                    else:
                        who, host, text = "client", "", line
                mesh = who.split("{", 1)[0]
                lv = _LEVEL.search(text[:120])
                level = "WARNING" if lv and lv.group(1) == "WARN" else (lv.group(1) if lv else "INFO")
                self._log_id += 1
                self.logs.append(LogLine(self._log_id, now, stream, who, host, mesh, coords_rank(who), level, text, count))
            self._changed()
        self._notify()

    def log_view(self, *, mesh: str = "", rank: Optional[int] = None, level: str = "", limit: int = 500) -> list[LogLine]:
        """The last ``limit`` lines that pass the filters (``level``: that level and above)."""
        floor = LEVELS.get(level.upper(), 0) if level else 0
        with self.lock:
            out = [ln for ln in self.logs
                   if (not mesh or ln.mesh == mesh) and (rank is None or ln.rank == rank)
                   and LEVELS.get(ln.level, 20) >= floor]
        return out[-limit:]

    def log_meshes(self) -> list[str]:
        with self.lock:
            return sorted({ln.mesh for ln in self.logs if ln.mesh})

    # -------------------------------------------------------------- views
    def endpoint_rows(self) -> list[EndpointRow]:
        """One row per mesh/endpoint (server-side figures where the actors report, else
        the client's), each with its per-rank rows and its calls/s over the last minute."""
        with self.lock:
            items = list(self.metrics.values())
            history = {k: list(v) for k, v in self._history.items()}
        server: dict[tuple[str, str], EndpointRow] = {}
        client: dict[tuple[str, str], EndpointRow] = {}
        per_rank: dict[tuple[str, str], dict[int, EndpointRow]] = collections.defaultdict(dict)
        for a in items:
            key = (str(a.get("mesh")), str(a.get("endpoint")))
            target = server if a.get("side") == "server" else client
            row = target.setdefault(key, EndpointRow(*key))
            row.add(a)
            if a.get("side") == "server" and a.get("rank") is not None:
                r = int(a["rank"])
                per_rank[key].setdefault(r, EndpointRow(key[0], key[1], r)).add(a)
        rows = []
        for key in sorted(set(server) | set(client)):
            row = server.get(key) or client[key]
            c = client.get(key)
            if c is not None and c.count:
                row.client_p50_ns, row.client_p99_ns = c.p(50), c.p(99)
            row.ranks = [per_rank[key][r] for r in sorted(per_rank.get(key, {}))]
            h = history.get(key) or []
            if len(h) >= 2 and h[-1][0] > h[0][0]:
                row.rate = max(0, h[-1][1] - h[0][1]) / max(1.0, h[-1][0] - h[0][0])
            rows.append(row)
        return rows

    def tree(self) -> list[dict[str, Any]]:
        """Host meshes -> hosts -> procs (by proc mesh) -> actor meshes, each with its state."""
        with self.lock:
            now = time.time_ns()
            out = []
            placed: set[str] = set()
            host_meshes = list(self.host_meshes.values())
            if any(pm.get("host_mesh") not in self.host_meshes for pm in self.proc_meshes.values()):
                host_meshes.append({"name": "(other host meshes)", "hosts": [], "scheduler": None, "state": "running",
                                    "lost": {}, "t": 0})
            for hm in host_meshes:
                hosts = []
                names = list(hm["hosts"])
                pms = [pm for pm in self.proc_meshes.values()
                       if pm.get("host_mesh") == hm["name"]
                       or (hm["name"] == "(other host meshes)" and pm.get("host_mesh") not in self.host_meshes)]
                for pm in pms:
                    for h in pm["hosts"]:
                        if h not in names:
                            names.append(h)
                for hname in names:
                    groups = []
                    for pm in pms:
                        procs = sorted((p for p in self.procs.values() if p.mesh == pm["name"] and p.host_name == hname),
                                       key=lambda p: (p.rank is None, p.rank))
                        if not procs and hname not in pm["hosts"]:
                            continue
                        placed.update(p.proc_id for p in procs)
                        actor_meshes = [am for am in self.actor_meshes.values() if am.proc_mesh == pm["name"]]
                        groups.append({"mesh": pm["name"], "state": pm["state"], "procs": [
                            self._proc_view(p, actor_meshes, now) for p in procs]})
                    lost = hm["lost"].get(hname)
                    state = "failed" if lost else ("stopped" if hm["state"] == "stopped" else "running")
                    hosts.append({"name": hname, "state": state, "lost": lost, "proc_meshes": groups})
                out.append({"name": hm["name"], "scheduler": hm["scheduler"], "state": hm["state"], "hosts": hosts})
            return out

    def _proc_view(self, p: Proc, actor_meshes: list[ActorMesh], now: int) -> dict[str, Any]:
        actors = []
        for am in actor_meshes:
            failed = am.failed.get(p.rank) if p.rank is not None else None
            state = "failed" if failed or p.state == "failed" else (p.state if p.state in ("stopped", "stopping") else am.state)
            actors.append({"mesh": am.mesh, "class_name": am.class_name, "state": state,
                           "failure": failed[1] if failed else ""})
        end = p.end_ns or now
        return {"proc_id": p.proc_id, "rank": p.rank, "coords": p.coords, "pid": p.os_pid, "state": p.state,
                "uptime_s": max(0.0, (end - p.ready_ns) / 1e9), "reason": p.reason,
                "first_failure": p.first_failure, "actors": actors}

    def failure_view(self) -> list[dict[str, Any]]:
        with self.lock:
            return sorted(self.failures, key=lambda f: f["time_ns"])

    def span_view(self, limit: int = 600) -> list[tuple[str, int, int, dict]]:
        with self.lock:
            return list(self.spans)[-limit:]

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {"procs": len(self.procs), "failed": sum(p.state == "failed" for p in self.procs.values()),
                    "failures": len(self.failures), "logs": len(self.logs), "endpoints": len({
                        (a.get("mesh"), a.get("endpoint")) for a in self.metrics.values()})}
