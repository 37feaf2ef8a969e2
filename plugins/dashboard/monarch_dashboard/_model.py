"""What the dashboard shows, folded from the telemetry a sink receives.

:class:`JobModel` is plain data behind one lock: the tree of host meshes,
hosts, procs and actor meshes (from lifecycle events), the latest endpoint
totals (from metric events: cumulative per process, so the latest one of a
key supersedes the earlier), the failures and supervision events in time
order, the proc output lines the client printed, and the spans of the last
recording, and the last exceptions each endpoint raised (``endpoint.raised``
events: the last :data:`MAX_RAISED_PER_ENDPOINT` per endpoint and the last
:data:`MAX_RAISED_PER_RANK` per endpoint and rank, so memory stays bounded
however often an endpoint raises).  Every change bumps :attr:`JobModel.version` and calls the
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

from monarch_dashboard import _analysis

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
#: exceptions kept per mesh/endpoint (the newest), with message and traceback
MAX_RAISED_PER_ENDPOINT = 20
#: exceptions kept per mesh/endpoint/rank (the newest)
MAX_RAISED_PER_RANK = 3
#: client-side error types that mean the endpoint itself raised (already counted by the actor's side)
ENDPOINT_RAISED_TYPES = frozenset({"ActorError"})


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
    #: failures the caller saw that the endpoint did not raise (``SupervisionError`` ...: its actor
    #: or proc died, the call was refused): type -> count, from the client side
    caller_errors: dict = dataclasses.field(default_factory=dict)
    #: the newest exceptions it raised (``endpoint.raised``), newest first
    raised: list = dataclasses.field(default_factory=list)
    #: (per-rank rows) an outlier by :func:`_analysis.stragglers`
    slow: bool = False

    @property
    def mean_ns(self) -> Optional[float]:
        return self.sum_ns / self.count if self.count else None

    @property
    def caller_error_count(self) -> int:
        return sum(self.caller_errors.values())

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
        self.raised: dict[tuple[str, str], collections.deque[dict[str, Any]]] = {}
        self.raised_by_rank: dict[tuple[str, str, int], collections.deque[dict[str, Any]]] = {}
        #: when the client's runtime shut down (the job ended): 0 while it runs
        self.ended_ns = 0
        self._listeners: list[Callable[[], None]] = []

    # -------------------------------------------------------------- change
    def listen(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (no lock held) after every change."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        self.version += 1

    def end(self) -> None:
        """The job ended (the client's runtime shut down): what is here stays as it is."""
        with self.lock:
            if not self.ended_ns:
                self.ended_ns = time.time_ns()
            self._changed()
        self._notify()

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
            ended = self.procs.get(str(a.get("proc_id")))
            if ended is not None:
                ended.state = "stopped" if name == "proc.stopped" else "failed"
                ended.end_ns = ts
                ended.reason = str(a.get("reason", ""))
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
        elif name == "endpoint.raised":
            self._raised(ts, a)
        if name in FAILURE_EVENTS:
            self.failures.append({"name": name, "time_ns": ts, **a})

    def _raised(self, ts: int, a: Mapping[str, Any]) -> None:
        mesh, endpoint = str(a.get("mesh")), str(a.get("endpoint"))
        rank = a.get("rank")
        e = {"time_ns": ts, "rank": rank, "error_type": str(a.get("error_type", "")),
             "message": str(a.get("message", "")), "traceback": str(a.get("traceback", "")),
             "skipped": int(a.get("skipped") or 0), "where": self.host_display(str(a.get("host", "")))}
        self.raised.setdefault((mesh, endpoint), collections.deque(maxlen=MAX_RAISED_PER_ENDPOINT)).append(e)
        if rank is not None:
            self.raised_by_rank.setdefault((mesh, endpoint, int(rank)),
                                           collections.deque(maxlen=MAX_RAISED_PER_RANK)).append(e)

    def host_display(self, host: str) -> str:
        """The one name the dashboard gives a host: its name in its host mesh, except
        ``localhost`` (``this_host()``: the client's own machine), and the client's
        machine itself, which are both called by the client's machine name."""
        machine = str(self.client.get("host") or "")
        if machine and host == "localhost":
            return machine
        return host

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
                    who, host, text = m.group("who"), self.host_display(m.group("host")), m.group("text")
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

    def log_view(self, *, mesh: str = "", rank: Optional[int] = None, level: str = "", search: str = "",
                 limit: int = 500) -> list[LogLine]:
        """The last ``limit`` lines that pass the filters (``level``: that level and above;
        ``search``: the text, prefix included, contains it, ignoring case)."""
        floor = LEVELS.get(level.upper(), 0) if level else 0
        needle = search.casefold()
        with self.lock:
            out = [ln for ln in self.logs
                   if (not mesh or ln.mesh == mesh) and (rank is None or ln.rank == rank)
                   and LEVELS.get(ln.level, 20) >= floor
                   and (not needle or needle in ln.text.casefold() or needle in ln.prefix.casefold())]
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
        caller_rank: dict[tuple[str, str, int], dict[str, int]] = collections.defaultdict(dict)
        for a in items:
            if a.get("side") != "server" and a.get("rank") is not None:
                d = caller_rank[(str(a.get("mesh")), str(a.get("endpoint")), int(a["rank"]))]
                for t, n in dict(a.get("errors") or {}).items():
                    if t not in ENDPOINT_RAISED_TYPES:
                        d[t] = d.get(t, 0) + int(n)
        with self.lock:
            raised = {k: list(v) for k, v in self.raised.items()}
            raised_rank = {k: list(v) for k, v in self.raised_by_rank.items()}
        rows = []
        for key in sorted(set(server) | set(client)):
            row = server.get(key) or client[key]
            c = client.get(key)
            if c is not None and c.count:
                row.client_p50_ns, row.client_p99_ns = c.p(50), c.p(99)
            if c is not None and row is not c:  # what the caller saw fail that the actors did not count
                row.caller_errors = {t: n for t, n in c.errors.items() if t not in ENDPOINT_RAISED_TYPES and n}
            row.raised = list(reversed(raised.get(key, [])))
            ranks = dict(per_rank.get(key, {}))
            for (m, e, r), errs in caller_rank.items():
                if (m, e) == key and errs:
                    ranks.setdefault(r, EndpointRow(m, e, r)).caller_errors = errs
            row.ranks = [ranks[r] for r in sorted(ranks)]
            for k in row.ranks:
                k.raised = list(reversed(raised_rank.get((key[0], key[1], k.rank), [])))
            slow = _analysis.stragglers({k.rank: k.mean_ns for k in row.ranks})
            for k in row.ranks:
                k.slow = k.rank in slow
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
                    nprocs = sum(len(g["procs"]) for g in groups)
                    nfailed = sum(p["state"] == "failed" for g in groups for p in g["procs"])
                    nrunning = sum(p["state"] == "running" for g in groups for p in g["procs"])
                    hosts.append({"name": self.host_display(hname), "state": state, "lost": lost, "proc_meshes": groups,
                                  "nprocs": nprocs, "nfailed": nfailed, "nrunning": nrunning})
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

    def mesh_summaries(self) -> list[dict[str, Any]]:
        """One line per proc mesh -- procs by state (those not ready yet count as
        starting), its actor meshes, its hosts -- and its rank grid: one cell per
        rank, in rank order, with its state (what the Job page shows first, so a
        256-proc job reads in one screen)."""
        with self.lock:
            out = []
            for pm in self.proc_meshes.values():
                total = 1
                for n in dict(pm.get("extent") or {}).values():
                    total *= int(n)
                procs = {p.rank: p for p in self.procs.values() if p.mesh == pm["name"] and p.rank is not None}
                total = max(total, len(procs))
                actor_meshes = [am for am in self.actor_meshes.values() if am.proc_mesh == pm["name"]]
                grid = []
                for r in range(total):
                    p = procs.get(r)
                    state = p.state if p is not None else ("starting" if pm["state"] in ("starting", "running") else pm["state"])
                    if p is not None and state == "running" and any(r in am.failed for am in actor_meshes):
                        state = "failed"  # its proc runs, an actor of it died
                    title = (f"rank {r} {p.coords} on {self.host_display(p.host_name)} · pid {p.os_pid} · {state}"
                             + (f": {p.reason}" if p.reason and state == "failed" else "")) if p is not None \
                        else f"rank {r} · {state}"
                    grid.append({"rank": r, "state": state, "title": title,
                                 "proc_id": p.proc_id if p is not None else ""})
                states = collections.Counter(c["state"] for c in grid)
                out.append({"name": pm["name"], "host_mesh": pm.get("host_mesh"), "state": pm["state"], "total": total,
                            "states": dict(states), "running": states.get("running", 0),
                            "failed": states.get("failed", 0), "hosts": len(pm.get("hosts") or ()),
                            "actor_meshes": [f"{am.mesh} ({am.class_name})" for am in actor_meshes], "grid": grid})
            return out

    def failure_view(self) -> list[dict[str, Any]]:
        with self.lock:
            return sorted(self.failures, key=lambda f: f["time_ns"])

    def proc_label(self, proc_id: str) -> str:
        """``<proc mesh><coords>`` of a proc (what failure texts call it), else its id."""
        p = self.procs.get(proc_id)
        return f"{p.mesh}{p.coords}" if p is not None else proc_id

    def failure_groups(self) -> list[dict[str, Any]]:
        """The failure events grouped by root cause, newest group first
        (:func:`_analysis.group_failures`)."""
        with self.lock:
            return _analysis.group_failures(list(self.failures), self.proc_label)

    def span_view(self, limit: int = 600) -> list[tuple[str, int, int, dict]]:
        with self.lock:
            return list(self.spans)[-limit:]

    def counts(self) -> dict[str, int]:
        with self.lock:
            return {"procs": len(self.procs), "failed": sum(p.state == "failed" for p in self.procs.values()),
                    "failures": len(_analysis.group_failures(list(self.failures), self.proc_label)),
                    "failure_events": len(self.failures), "logs": len(self.logs), "endpoints": len({
                        (a.get("mesh"), a.get("endpoint")) for a in self.metrics.values()})}
