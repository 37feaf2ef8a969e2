"""Endpoint metrics: counted in the process that sees the call, shipped in batches.

An :class:`EndpointStat` aggregates one (side, actor mesh, endpoint, rank,
adverb) in one process: calls, errors by exception type, a latency histogram
and the request / reply bytes.  The client side counts in the caller's process
when the reply arrives; the server side in the actor's process when the
endpoint returns.  Recording a successful call costs one small tuple appended
to a deque (folded into the totals in batches); never a lock, a message or a
pluggy call per call.

The histogram has 8 buckets per power of two of nanoseconds (exact below 16
ns): a percentile read from it is within 6.25 % of the true sample, and lies
between the recorded minimum and maximum.  Samples reach it in folds (see
:class:`EndpointStat`); a fold of more than :data:`HIST_SAMPLES` samples -- a
pipelined burst -- adds every k-th of them with weight k, so the bucket counts
still sum to the number of calls and ranks merge without bias, at a sampling
error far below the bucket width at that rate.

In the root client, :func:`merge` keeps the latest cumulative snapshot each
proc sent; :func:`endpoint_metrics` reads local and shipped ones together.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from monarch_core import settings
from monarch_core._telemetry._core import state

NBUCKETS = 512
_INDICES = range(NBUCKETS)
_NO_MIN = 1 << 62
CLIENT = "client"
SERVER = "server"


def error_type(payload: Any) -> str:
    """The type of the exception an error reply carries, read from the
    pickle's opcodes (nothing is unpickled, no code runs): ``ActorError``,
    ``SupervisionError`` ...; ``"Exception"`` when it cannot be told."""
    import io
    import pickletools

    try:
        data = bytes(memoryview(payload)[:4096])
        strings: list[str] = []
        for op, arg, _pos in pickletools.genops(io.BytesIO(data)):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE") and isinstance(arg, str):
                strings.append(arg)
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                name = strings[-1]
                return "ActorError" if name == "_rebuild_actor_error" else name
            elif op.name == "GLOBAL":
                name = str(arg).split(" ")[-1]
                return "ActorError" if name == "_rebuild_actor_error" else name
    except Exception:  # noqa: BLE001 - a truncated or odd pickle: say what we can
        pass
    return "Exception"


#: Pending items of one stat (3 a sample) at which its recorder folds them (bounds their memory).
FOLD_AT = 768
#: Most samples one fold puts into the histogram one by one; a bigger fold
#: takes every k-th with weight k (calls, sums, min, max and bytes stay exact).
HIST_SAMPLES = 32

def bucket_of(ns: int) -> int:
    """The histogram bucket of a duration of ``ns`` nanoseconds."""
    b = ns.bit_length()
    return ns if b <= 4 else ((b - 3) << 3) | ((ns >> (b - 4)) & 7)


def bucket_bounds(i: int) -> tuple[int, int]:
    """``[low, high)`` of bucket ``i``, in nanoseconds."""
    if i < 16:
        return i, i + 1
    b = (i >> 3) + 3
    lo = (8 + (i & 7)) << (b - 4)
    return lo, lo + (1 << (b - 4))


class EndpointStat:
    """The running totals of one endpoint as seen from one side in this process.

    The hot path (:attr:`add`, a successful call) is one ``deque.extend`` of
    three ints -- atomic, so any thread may record without a lock, and the
    buffered samples are no objects for the garbage collector; they are folded
    into the totals under the lock every 256 samples (:data:`FOLD_AT` items) and whenever
    the totals are read (:meth:`snapshot`)."""

    __slots__ = ("key", "lock", "calls", "errors", "count", "sum", "min", "max", "buckets", "req", "rep", "sent",
                 "pending", "add", "raised")
    FOLD_AT = FOLD_AT
    error_type = staticmethod(error_type)

    def __init__(self, key: tuple) -> None:
        self.key = key
        self.lock = threading.Lock()
        self.calls = 0
        self.errors: dict[str, int] = {}
        self.count = 0  # latency samples (a broadcast has none)
        self.sum = 0
        self.min = _NO_MIN
        self.max = 0
        self.buckets = [0] * NBUCKETS
        self.req = 0
        self.rep = 0
        self.sent = 0  # ``calls`` when the last batch took a snapshot
        self.pending: collections.deque[int] = collections.deque()  # dt, req, rep, dt, req, rep, ...
        #: ``add((dt, req, rep))``: one successful call that took ``dt`` ns, with
        #: ``req`` request and ``rep`` reply bytes (the bound ``extend``, which never
        #: folds: :meth:`record` adds and folds every :data:`FOLD_AT` items).
        self.add = self.pending.extend
        self.raised: Optional[list] = None  # ``_raised``'s window: [start, events, skipped]

    def record(self, dt: int, req: int, rep: int, err: Optional[str] = None) -> None:
        """One call that took ``dt`` ns, with ``req`` request and ``rep`` reply
        bytes; ``err``: the exception type's name if it failed (server side,
        recorded inside the ``except`` that caught it: also its message and
        traceback, as an ``endpoint.raised`` event -- ``_raised``)."""
        if err is None:
            self.add((dt, req, rep))
            if len(self.pending) >= FOLD_AT:
                self.fold()
            return
        with self.lock:  # folded with the pending samples, at once
            self.add((dt, req, rep))
            self._fold_locked()
            self.errors[err] = self.errors.get(err, 0) + 1
        if self.key[0] == SERVER:  # the exception being handled, if it is this one: ``endpoint.raised``
            from monarch_core._telemetry import _raised

            _raised.note(self, err)

    def fold(self) -> None:
        """Fold the pending samples into the totals."""
        with self.lock:
            self._fold_locked()

    def _fold_locked(self) -> None:
        pending = self.pending
        k = len(pending)  # (a multiple of 3: ``extend`` is atomic); samples added meanwhile wait
        if not k:
            return
        items = list(itertools.islice(pending, k))
        pop = pending.popleft
        for _ in itertools.repeat(None, k):
            pop()
        dts, reqs, reps = items[0::3], items[1::3], items[2::3]
        n = len(dts)
        self.calls += n
        self.count += n
        self.sum += sum(dts)
        self.req += sum(reqs)
        self.rep += sum(reps)
        hi, lo = max(dts), min(dts)
        if hi > self.max:
            self.max = hi
        if lo < self.min:
            self.min = lo
        # the histogram: every sample of a small fold; of a big one (a pipelined
        # burst) every ``step``-th, weighted ``step`` (the last takes the rest)
        step = n // HIST_SAMPLES or 1
        buckets = self.buckets
        picked = dts[::step] if step > 1 else dts
        for dt in picked:  # (``bucket_of``, inlined)
            b = dt.bit_length()
            buckets[dt if b <= 4 else ((b - 3) << 3) | ((dt >> (b - 4)) & 7)] += step
        if step > 1:
            buckets[bucket_of(picked[-1])] += n - step * len(picked)

    def record_send(self, req: int) -> None:
        """A call with no reply to wait for (``broadcast``): counted, no latency."""
        with self.lock:
            self.calls += 1
            self.req += req

    def record_refused(self, err: str) -> None:
        """A call that failed at the caller before anything was sent (its view
        already had a failed rank): one call and one ``err``, no latency sample,
        no bytes.  Only the refusal path calls it."""
        with self.lock:
            self.calls += 1
            self.errors[err] = self.errors.get(err, 0) + 1

    def changed(self) -> bool:
        """Whether anything was recorded since the last batch's snapshot."""
        return self.calls != self.sent or bool(self.pending)

    def snapshot(self) -> tuple:
        """The cumulative totals as plain data (what a batch carries)."""
        with self.lock:
            self._fold_locked()
            b = self.buckets  # the non-zero buckets, found by C loops (a proc's stop snapshots thousands)
            buckets = dict(zip(itertools.compress(_INDICES, b), filter(None, b)))
            return (self.key, self.calls, dict(self.errors), self.count, self.sum, self.min if self.count else 0,
                    self.max, buckets, self.req, self.rep)


_stats: dict[tuple, EndpointStat] = {}
_stats_lock = threading.Lock()
#: mesh key -> the keys of its stats in :data:`_stats` (what :func:`retire` takes out).
_by_mesh: dict[str, list[tuple]] = {}
#: Final snapshots of retired stats, ``(class name, snapshot)``, for the next batch (``"retired"``).
_outgoing: list[tuple[str, tuple]] = []


def stat_for(side: str, mesh_key: str, mesh: str, endpoint: str, rank: Optional[int], adverb: str = "") -> EndpointStat:
    """The stat of this key in this process (made on first use)."""
    key = (side, mesh_key, mesh, endpoint, rank, adverb)
    s = _stats.get(key)
    if s is None:
        with _stats_lock:
            s = _stats.get(key)
            if s is None:
                s = _stats[key] = EndpointStat(key)
                _by_mesh.setdefault(mesh_key, []).append(key)
    return s


def retire(mesh_key: str, class_name: str, side: Optional[str] = None, rank: Optional[int] = None) -> None:
    """Actor mesh ``mesh_key`` (of class ``class_name``) stopped: take its stats
    (of ``side`` only, and of ``rank`` only, if given) out of this process.  Their final totals go out
    with the next batch (``"retired"``: the root keeps them by the rule of
    :class:`Stopped`); in the root they go to :data:`stopped` at once.  A
    recorder still holding one of them records into a stat nobody reads."""
    with _stats_lock:
        keys = _by_mesh.pop(mesh_key, None)
        if not keys:
            return
        if side is not None or rank is not None:
            mine = [k for k in keys if (side is None or k[0] == side) and (rank is None or k[4] == rank)]
            if len(mine) != len(keys):
                _by_mesh[mesh_key] = [k for k in keys if k not in mine]
            keys = mine
        taken = [s for s in (_stats.pop(k, None) for k in keys) if s is not None]
    snaps = [s.snapshot() for s in taken]
    if state.is_root:
        stopped.add(mesh_key, [(snap, state.proc_id, state.host, class_name) for snap in snaps])
        if not state.sinks_active:  # (nobody cuts the root's batches then)
            return
    with _stats_lock:
        _outgoing.extend((class_name, snap) for snap in snaps)


def take_retired() -> list[tuple[str, tuple]]:
    """The retired stats' final snapshots since the last call (for a batch)."""
    global _outgoing
    if not _outgoing:
        return []
    with _stats_lock:
        out, _outgoing = _outgoing, []
    return out


def changed_snapshots() -> list[tuple]:
    """Snapshots of the stats that changed since the last call (for a batch)."""
    out = []
    for s in list(_stats.values()):
        if s.changed():
            snap = s.snapshot()
            s.sent = snap[1]
            out.append(snap)
    return out


# ------------------------------------------------------------------ the root's view

#: (proc id, key) -> (snapshot, host): the latest totals each proc shipped.
_remote: dict[tuple, tuple] = {}
_remote_lock = threading.Lock()


#: Procs that ended recently (what they still ship is kept as stopped): a bounded window.
_ended: collections.OrderedDict[str, None] = collections.OrderedDict()
_ENDED_KEPT = 1024


def merge(proc: str, host: str, snapshots: Iterable[tuple], retired: Iterable[tuple] = ()) -> None:
    """Keep the snapshots ``proc`` shipped (they are cumulative: the latest wins);
    ``retired``: ``(class name, final snapshot)`` of stats of its stopped meshes
    (moved to :data:`stopped`, with what ``proc`` shipped of them before)."""
    moved: dict[str, list[tuple]] = {}
    with _remote_lock:
        if proc in _ended:  # a late batch of a proc that ended: nothing of it is live any more,
            # its snapshots go to ``stopped`` like the retired ones (no class name)
            retired = [*(("", snap) for snap in snapshots), *retired]
        else:
            for snap in snapshots:
                _remote[(proc, tuple(snap[0]))] = (snap, host)
        for class_name, snap in retired:
            key = tuple(snap[0])
            _remote.pop((proc, key), None)
            moved.setdefault(key[1], []).append((snap, proc, host, str(class_name)))
    for mesh_key, rows in moved.items():
        stopped.add(mesh_key, rows)


def proc_ended(proc: str) -> None:
    """``proc`` is gone (the root saw it end): what it shipped is kept as stopped
    meshes' totals, and so is what it still sends."""
    moved: dict[str, list[tuple]] = {}
    with _remote_lock:
        _ended[proc] = None
        while len(_ended) > _ENDED_KEPT:
            _ended.popitem(last=False)
        for k in [k for k in _remote if k[0] == proc]:
            snap, host = _remote.pop(k)
            moved.setdefault(k[1][1], []).append((snap, proc, host, ""))
    for mesh_key, rows in moved.items():
        stopped.add(mesh_key, rows)


class _Folded:
    """The running sum of the rows :class:`Stopped` folded into one (side,
    class, endpoint): plain fields added in place, made into an
    :class:`EndpointMetrics` only when read (:meth:`metrics`) -- folding the
    rows of 20,000 stopped actors one dataclass at a time cost their client
    seconds.  ``mesh``/``adverb``/``proc``/``host`` stay while the rows agree,
    else ``"*"``; min and max are over the rows with samples."""

    __slots__ = ("side", "mesh", "endpoint", "adverb", "proc", "host", "calls", "errors", "count", "sum", "min",
                 "max", "buckets", "req", "rep")

    def __init__(self, snap: tuple, proc: str, host: str) -> None:
        (side, _mk, mesh, endpoint, _rank, adverb), calls, errors, count, sm, mn, mx, buckets, req, rep = snap
        self.side, self.mesh, self.endpoint, self.adverb, self.proc, self.host = side, mesh, endpoint, adverb, proc, host
        self.calls, self.errors, self.count, self.sum, self.min, self.max = calls, dict(errors), count, sm, mn, mx
        self.buckets: dict[int, int] = dict(buckets)
        self.req, self.rep = req, rep

    def add(self, snap: tuple, proc: str, host: str) -> None:
        (_side, _mk, mesh, _endpoint, _rank, adverb), calls, errors, count, sm, mn, mx, buckets, req, rep = snap
        if mesh != self.mesh:
            self.mesh = "*"
        if adverb != self.adverb:
            self.adverb = "*"
        if proc != self.proc:
            self.proc = "*"
        if host != self.host:
            self.host = "*"
        self.calls += calls
        for t, n in errors.items():
            self.errors[t] = self.errors.get(t, 0) + n
        if not self.count:  # (a min/max without samples means nothing: as ``Latency.merged``)
            self.min, self.max = mn, mx
        elif count:
            self.min, self.max = min(self.min, mn), max(self.max, mx)
        self.count += count
        self.sum += sm
        b = self.buckets
        for i, c in buckets.items():
            b[i] = b.get(i, 0) + c
        self.req += req
        self.rep += rep

    def metrics(self) -> EndpointMetrics:
        return EndpointMetrics(self.side, self.mesh, self.endpoint, None, self.adverb, self.proc, self.host,
                               self.calls, dict(self.errors),
                               Latency(self.count, self.sum, self.min, self.max, dict(self.buckets)),
                               self.req, self.rep, "*")


#: Folded meshes :class:`Stopped` remembers (for rows of theirs that come late).
_GONE_KEPT = 4096


class Stopped:
    """The root's record of stopped actor meshes' metrics (the documented rule,
    ``docs/observability.md``): the rows of the last :attr:`keep` stopped meshes
    (``MONARCH_METRICS_KEEP_STOPPED``) are kept as they were; an older mesh's rows
    are folded into one row per (side, actor class, endpoint) -- ``mesh`` the
    meshes' name if they all had one, else ``"*"``; ``rank`` ``None``; ``adverb``,
    ``proc`` and ``host`` kept where they agree, else ``"*"``; ``mesh_key``
    ``"*"`` -- so totals over the whole run stay while memory is bounded by the
    program's classes and endpoints, not by how many meshes it ran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: stopped meshes whose rows are kept as they were (``MONARCH_METRICS_KEEP_STOPPED``)
        self.keep: int = settings.get("MONARCH_METRICS_KEEP_STOPPED")
        self.meshes: collections.OrderedDict[str, dict[tuple, tuple]] = collections.OrderedDict()
        self.folded: dict[tuple, _Folded] = {}
        #: mesh key -> class name of the meshes folded lately: rows of theirs that arrive late
        #: (a proc's last batch) are folded at once instead of displacing a newer mesh
        self.gone: collections.OrderedDict[str, str] = collections.OrderedDict()

    def add(self, mesh_key: str, rows: list[tuple]) -> None:
        """``rows``: ``(snapshot, proc, host, class name)`` of stopped mesh ``mesh_key``."""
        with self.lock:
            late = self.gone.get(mesh_key)
            if late is not None:
                for snap, proc, host, class_name in rows:
                    self._fold(snap, proc, host, class_name or late)
                return
            m = self.meshes.setdefault(mesh_key, {})
            for snap, proc, host, class_name in rows:
                k = (proc, tuple(snap[0]))
                old = m.get(k)
                m[k] = (snap, host, class_name or (old[2] if old is not None else ""))
            while len(self.meshes) > self.keep:
                key, oldest = self.meshes.popitem(last=False)
                names = [c for _s, _h, c in oldest.values() if c]
                cls = names[0] if names else ""
                for (proc, _k), (snap, host, class_name) in oldest.items():
                    self._fold(snap, proc, host, class_name or cls)
                self.gone[key] = cls
                while len(self.gone) > _GONE_KEPT:
                    self.gone.popitem(last=False)

    def _fold(self, snap: tuple, proc: str, host: str, class_name: str) -> None:
        side, endpoint = snap[0][0], snap[0][3]
        k = (side, class_name, endpoint)
        g = self.folded.get(k)
        if g is None:
            self.folded[k] = _Folded(snap, proc, host)
        else:
            g.add(snap, proc, host)

    def rows(self) -> list[EndpointMetrics]:
        with self.lock:
            kept = [(proc, snap, host) for m in self.meshes.values() for (proc, _k), (snap, host, _c) in m.items()]
            folded = [f.metrics() for f in self.folded.values()]
        return [from_snapshot(snap, proc, host) for proc, snap, host in kept] + folded

    def clear(self) -> None:
        with self.lock:
            self.meshes.clear()
            self.folded.clear()
            self.gone.clear()


#: The root's stopped meshes' metrics.
stopped = Stopped()


def forget() -> None:
    """Drop every stat, local and shipped (``monarch_core.telemetry.reset_metrics``)."""
    with _stats_lock:
        _stats.clear()
        _by_mesh.clear()
        _outgoing.clear()
    with _remote_lock:
        _remote.clear()
    stopped.clear()


@dataclasses.dataclass(frozen=True)
class Latency:
    """A latency distribution: ``count`` samples, their sum, min and max, and the
    histogram (bucket index -> count; see :func:`bucket_bounds`), all in ns."""

    count: int
    sum_ns: int
    min_ns: int
    max_ns: int
    buckets: Mapping[int, int]

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0-100) in nanoseconds, from the histogram
        (within 6.25 %, clamped to [min, max]); NaN without samples."""
        if not self.count:
            return float("nan")
        rank = q / 100.0 * self.count
        seen = 0
        for i in sorted(self.buckets):
            c = self.buckets[i]
            if seen + c >= rank:
                lo, hi = bucket_bounds(i)
                v = lo + (hi - lo) * (max(0.0, rank - seen) / c)
                return float(min(max(v, self.min_ns), self.max_ns))
            seen += c
        return float(self.max_ns)

    @property
    def p50_ms(self) -> float:
        return self.percentile(50) / 1e6

    @property
    def p99_ms(self) -> float:
        return self.percentile(99) / 1e6

    @property
    def mean_ms(self) -> float:
        return self.sum_ns / self.count / 1e6 if self.count else float("nan")

    @property
    def total_ms(self) -> float:
        return self.sum_ns / 1e6

    def merged(self, other: Latency) -> Latency:
        b = dict(self.buckets)
        for i, c in other.buckets.items():
            b[i] = b.get(i, 0) + c
        sampled = [x for x in (self, other) if x.count] or [other]  # (a min/max without samples means nothing)
        lo, hi = min(x.min_ns for x in sampled), max(x.max_ns for x in sampled)
        return Latency(self.count + other.count, self.sum_ns + other.sum_ns, lo, hi, b)


@dataclasses.dataclass(frozen=True)
class EndpointMetrics:
    """The totals of one endpoint, from one side, since its process started.

    ``side`` is ``"client"`` (measured by the caller: latency from the send to
    the reply, errors as the caller sees them -- ``ActorError``,
    ``SupervisionError`` ...) or ``"server"`` (measured in the actor's proc:
    the time the endpoint ran, errors by the type the endpoint raised).
    ``rank`` is the actor's rank in its mesh on the server side; on the client
    side the destination's rank for ``call_one``/``choose`` and ``None`` for
    ``call``/``stream``/``broadcast`` (one call reaching every rank).  ``adverb``
    is the client-side adverb (``""`` on the server side).  ``request_bytes``
    counts the pickled arguments once per actor reached, ``reply_bytes`` the
    pickled results (0 for explicit-response-port endpoints on the server
    side).  ``calls`` counts broadcasts too; ``latency`` only calls with a reply.
    """

    side: str
    mesh: str
    endpoint: str
    rank: Optional[int]
    adverb: str
    proc: str
    host: str
    calls: int
    errors: Mapping[str, int]
    latency: Latency
    request_bytes: int
    reply_bytes: int
    mesh_key: str = ""

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def p50_ms(self) -> float:
        return self.latency.p50_ms

    @property
    def p99_ms(self) -> float:
        return self.latency.p99_ms

    def as_dict(self) -> dict[str, Any]:
        """Plain data (what the JSON-lines sink writes for a ``metric`` event)."""
        lat = self.latency
        return {
            "side": self.side, "mesh": self.mesh, "mesh_key": self.mesh_key, "endpoint": self.endpoint,
            "rank": self.rank, "adverb": self.adverb, "proc": self.proc, "host": self.host, "calls": self.calls,
            "errors": dict(self.errors), "request_bytes": self.request_bytes, "reply_bytes": self.reply_bytes,
            "latency_count": lat.count, "latency_sum_ns": lat.sum_ns, "latency_min_ns": lat.min_ns,
            "latency_max_ns": lat.max_ns, "latency_p50_ns": _num(lat.percentile(50)),
            "latency_p99_ns": _num(lat.percentile(99)),
            "latency_buckets": {str(i): c for i, c in sorted(lat.buckets.items())},
        }


def _num(v: float) -> float | None:
    return None if v != v else round(v, 1)


def from_snapshot(snap: tuple, proc: str, host: str) -> EndpointMetrics:
    (side, mesh_key, mesh, endpoint, rank, adverb), calls, errors, count, sm, mn, mx, buckets, req, rep = snap
    return EndpointMetrics(side, mesh, endpoint, rank, adverb, proc, host, calls, dict(errors),
                           Latency(count, sm, mn, mx, dict(buckets)), req, rep, mesh_key)


def from_dict(d: Mapping[str, Any]) -> EndpointMetrics:
    """The inverse of :meth:`EndpointMetrics.as_dict` (``monarch summary`` reads files with it)."""
    lat = Latency(int(d.get("latency_count", 0)), int(d.get("latency_sum_ns", 0)), int(d.get("latency_min_ns", 0)),
                  int(d.get("latency_max_ns", 0)),
                  {int(i): int(c) for i, c in dict(d.get("latency_buckets") or {}).items()})
    return EndpointMetrics(str(d["side"]), str(d["mesh"]), str(d["endpoint"]), d.get("rank"), str(d.get("adverb", "")),
                           str(d.get("proc", "")), str(d.get("host", "")), int(d.get("calls", 0)),
                           dict(d.get("errors") or {}), lat, int(d.get("request_bytes", 0)),
                           int(d.get("reply_bytes", 0)), str(d.get("mesh_key", "")))


def all_metrics() -> list[EndpointMetrics]:
    """This process's own stats and (in the root) every shipped one."""
    out = [from_snapshot(s.snapshot(), state.proc_id, state.host) for s in list(_stats.values())]
    with _remote_lock:
        items = list(_remote.items())
    out.extend(from_snapshot(snap, proc, host) for (proc, _key), (snap, host) in items)
    out.extend(stopped.rows())
    return out


def combine(rows: Iterable[EndpointMetrics], by: tuple[str, ...] = ("side", "mesh", "endpoint")) -> list[EndpointMetrics]:
    """Sum ``rows`` that agree on the fields ``by`` (the others become
    ``None``/``""``/``"*"``): e.g. every rank of an endpoint into one row."""
    groups: dict[tuple, EndpointMetrics] = {}
    for r in rows:
        k = tuple(getattr(r, f) for f in by)
        g = groups.get(k)
        if g is None:
            groups[k] = r
            continue
        errors = dict(g.errors)
        for t, n in r.errors.items():
            errors[t] = errors.get(t, 0) + n
        groups[k] = EndpointMetrics(
            g.side if "side" in by else "*", g.mesh, g.endpoint,
            g.rank if "rank" in by or g.rank == r.rank else None,
            g.adverb if g.adverb == r.adverb else "*",
            g.proc if g.proc == r.proc else "*", g.host if g.host == r.host else "*",
            g.calls + r.calls, errors, g.latency.merged(r.latency), g.request_bytes + r.request_bytes,
            g.reply_bytes + r.reply_bytes, g.mesh_key if g.mesh_key == r.mesh_key else "*",
        )
    return list(groups.values())
