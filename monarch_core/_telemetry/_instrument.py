"""Per-call instrumentation: the client and server side of a call (the runtime's ``Instrumentation``).

* :class:`ClientSide` -- what an endpoint of an actor mesh records in the
  caller: ``call_one``/``choose`` count in ``OneReply`` itself, the reply
  collectors of ``call``/``stream`` and traced calls are timed subclasses
  (latency from the send to the reply, reply bytes, errors), a ``broadcast``
  counts its send; and, when the call is traced, the client span and the
  trace context its messages carry.
* the server side -- the endpoint stat and span helpers ``ActorHost`` uses.

The runtime calls these through its instrumentation (:class:`._runtime.Telemetry`),
except :func:`retire_when_stopped` and :func:`retire_server`, which listen to
the runtime's events (``actor_mesh_released``, ``actor_finished``:
:func:`._runtime.subscribe`).  What a proc then reports to the root (batches, output, lifecycle events) is
:mod:`._reporting`.

Nothing here runs per call when telemetry is off (``MONARCH_TELEMETRY=0``) or
for an ``@endpoint(instrument=False)``: the mesh then uses the plain collectors.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Optional

from monarch_core._proc import _serial
from monarch_core._proc._port import GatherReplies, OneReply, StreamReplies
from monarch_core._kernel import _wire as W
from monarch_core._telemetry import _metrics, _spans
from monarch_core._telemetry._core import state

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

_now = time.perf_counter_ns
_current_span = _spans.current_span
_getrandbits = _spans.getrandbits
_child_context = _spans.child_context
_MAX_FLAT = _spans.MAX_FLAT
_S_VALUE = W.S_VALUE
_S_ERROR = W.S_ERROR
_S_BATCH = W.S_BATCH


nbytes = _serial.nbytes
error_type = _metrics.error_type


# ------------------------------------------------------------------ the client side of calls


class ClientSide:
    """The instrumentation of one endpoint of one actor-mesh view, in the caller."""

    __slots__ = ("mesh_key", "mesh", "endpoint", "_stats", "span_name", "_attrs", "_first", "_first_meta")

    def __init__(self, mesh_key: str, mesh: str, endpoint: str) -> None:
        self.mesh_key = mesh_key
        self.mesh = mesh
        self.endpoint = endpoint
        self.span_name = f"{mesh}.{endpoint}"
        self._stats: dict[tuple, _metrics.EndpointStat] = {}
        self._attrs: dict[tuple, tuple] = {}  # (adverb, rank, thread) -> the spans' meta (``_spans.meta``)
        self._first: Optional[_metrics.EndpointStat] = None  # the stat of index 0's call_one: the common case
        self._first_meta: Optional[tuple] = None  # its spans' meta (for the thread it names)

    def stat(self, rank: Optional[int], adverb: str) -> _metrics.EndpointStat:
        k = (rank, adverb)
        s = self._stats.get(k)
        if s is None:
            s = self._stats[k] = _metrics.stat_for(_metrics.CLIENT, self.mesh_key, self.mesh, self.endpoint, rank,
                                                   adverb)
        return s

    def stat_at(self, region: Any, index: int, adverb: str) -> _metrics.EndpointStat:
        """The stat of a call to index ``index`` of ``region`` (keyed by its rank in the whole mesh)."""
        k = (index, adverb, None)
        s = self._stats.get(k)
        if s is None:
            s = self._stats[k] = self.stat(region.root_rank(index), adverb)
        return s

    def span(self) -> Optional[tuple]:
        """The client span of a call about to be sent, ``(context, parent_id,
        thread)`` (None: not traced): ``context`` is what its messages carry
        (trace id and this span's id), ``thread`` the caller's track."""
        c = client_context()
        if c is None:
            return None
        return (c[0], c[1], _spans._thread())

    def meta(self, adverb: str, rank: Optional[int], track: str) -> tuple:
        """The spans' meta (``_spans.meta``) of this endpoint's calls by ``adverb``
        to ``rank`` from the thread ``track``."""
        k = (adverb, rank, track)
        m = self._attrs.get(k)
        if m is None:
            m = self._attrs[k] = (self.span_name, "client", track,
                                  ("mesh", self.mesh, "endpoint", self.endpoint, "adverb", adverb, "rank", rank))
        return m

    def end_span(self, sp: tuple, adverb: str, rank: Optional[int], error: Optional[str], t0: int, dt: int) -> None:
        m = self.meta(adverb, rank, sp[2])
        spans = state.spans
        if len(spans) < _MAX_FLAT:  # (``_spans.record``, inlined)
            spans.extend((m, sp[0], None, sp[1], t0, dt, error))
        else:
            _spans.record(m, sp[0], None, sp[1], t0, dt, error)

    def one(self, kernel: Kernel, region: Any, index: int, adverb: str, payload: Any, bufs: list,
            describe: Any = "") -> tuple[OneReply, Optional[bytes]]:
        """The reply collector of a ``call_one``/``choose`` to index ``index``
        of ``region``, and the trace context its message carries (None: not traced)."""
        if index == 0 and adverb == "call_one":
            stat = self._first
            if stat is None:
                stat = self._first = self.stat_at(region, 0, adverb)
        else:
            stat = self.stat_at(region, index, adverb)
        req = len(payload) if not bufs else nbytes(payload, bufs)
        cur = _current_span.get()
        if cur is None:
            if not state.tracing:
                return OneReply(kernel, describe, adverb, index, stat, req), None
            ctx, parent = _getrandbits(192).to_bytes(24, "little"), 0  # (``client_context``, inlined)
        else:
            ctx, parent = _child_context(cur), cur[1]
        track = _spans._thread()
        m = self._first_meta
        if m is None or m[2] is not track or stat is not self._first:
            m = self.meta(adverb, stat.key[4], track)
            if stat is self._first:
                self._first_meta = m
        h = TimedOneReply(kernel, describe, adverb, index, stat, req)
        h.ctx, h.parent, h.m = ctx, parent, m
        return h, ctx

    def gather(self, kernel: Kernel, extent: Any, build: Any, adverb: str, payload: Any, bufs: list,
               describe: Any = "") -> TimedGather:
        h = TimedGather(kernel, extent, describe, build)
        h._timing_init(self, adverb, nbytes(payload, bufs) * h.n)
        return h

    def stream(self, kernel: Kernel, n: int, payload: Any, bufs: list, describe: Any = "") -> TimedStream:
        h = TimedStream(kernel, n, describe)
        h._timing_init(self, "stream", nbytes(payload, bufs) * n)
        return h

    def cast(self, adverb: str, n: int, payload: Any, bufs: list) -> Optional[tuple]:
        """A send with no reply to time: counted now; the span (if traced) to end
        after the send (:meth:`end_cast`)."""
        self.stat(None, adverb).record_send(nbytes(payload, bufs) * n)
        sp = self.span()
        return None if sp is None else (*sp, _now())

    def refused(self, region: Any, index: Optional[int], adverb: str, err: str) -> None:
        """Count a call by ``adverb`` that the caller refused before sending it
        (a rank of the view had already failed) as a failed call of type
        ``err``: on the stat of index ``index`` of ``region`` (``call_one``,
        ``choose``), or of the whole view (``index`` None).  Not timed."""
        stat = self.stat(None, adverb) if index is None else self.stat_at(region, index, adverb)
        stat.record_refused(err)

    def end_cast(self, sp: tuple, adverb: str) -> None:
        now = _now()
        self.end_span(sp, adverb, None, None, sp[3], now - sp[3])

    @staticmethod
    def trace_bytes(sp: Optional[tuple]) -> Optional[bytes]:
        """The trace context a traced call's messages carry (None: not traced), from its span ``sp``."""
        return None if sp is None else sp[0]


def client_context() -> Optional[tuple[bytes, int]]:
    """The trace context of a client span about to start and its parent's
    span id (0: a new trace), or None when the caller is not traced (neither
    inside a traced span nor in a process that traces everything)."""
    cur = _current_span.get()
    if cur is None:
        return (_spans.new_context(), 0) if state.tracing else None
    return _child_context(cur), cur[1]


def client_side(ep: Any) -> Any:
    """The :class:`ClientSide` of endpoint ``ep`` (an ``_endpoint.Endpoint``), or
    False when it is not instrumented (telemetry off, ``instrument=False``)."""
    if not state.enabled or not ep._prop._instrument:
        return False
    return ClientSide(ep._mesh._key, ep._mesh._name, ep._name)


class TimedOneReply(OneReply):
    """``OneReply`` of a traced call: it also records the client span (its
    context ``ctx``, ``parent`` and meta ``m``) when the reply (or failure) arrives."""

    __slots__ = ("ctx", "parent", "m")
    ctx: bytes  # the call's trace context
    parent: int  # its parent span's id (0: none)
    m: Optional[tuple]  # the client span's meta (``_spans.meta``); None once recorded

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        m = self.m
        if m is not None:
            self.m = None
            t0 = self.t0
            dt = _now() - t0
            spans = state.spans
            if status == _S_VALUE and len(spans) < _MAX_FLAT:  # (``_spans.record``, inlined)
                spans.extend((m, self.ctx, None, self.parent, t0, dt, None))
            else:
                _spans.record(m, self.ctx, None, self.parent, t0, dt,
                              error_type(payload) if status == _S_ERROR else None)
        OneReply.deliver(self, rank, status, payload, buffers)

    def fail(self, exc: BaseException, proc_id: Optional[str] = None) -> None:
        m = self.m
        if m is not None:
            self.m = None
            _spans.record(m, self.ctx, None, self.parent, self.t0, _now() - self.t0, type(exc).__name__)
        OneReply.fail(self, exc, proc_id)


class _RecordsOnce:
    """What ``TimedGather`` and ``TimedStream`` share: the reply bytes and
    first error they collect, and recording the call exactly once (with its
    span, named ``_SPAN``).  Mixed in before the collector class (whose
    ``lock`` it uses)."""

    _SPAN = "call"
    lock: Any

    def _timing_init(self, side: ClientSide, adverb: str, req: int) -> None:
        """Time the call from now: ``side`` made it by ``adverb`` with ``req`` request bytes."""
        self.rep = 0
        self.err: Optional[str] = None
        self.recorded = False
        self.stat = side.stat(None, adverb)
        self.req = req
        self.side = side
        self.sp: Optional[tuple] = side.span()
        self.t0 = _now()

    def _record(self, err: Optional[str]) -> None:
        with self.lock:
            if self.recorded:
                return
            self.recorded = True
            err = self.err or err
        dt = _now() - self.t0
        self.stat.record(dt, self.req, self.rep, err)
        if self.sp is not None:
            self.side.end_span(self.sp, self._SPAN, None, err, self.t0, dt)


class TimedGather(_RecordsOnce, GatherReplies):
    """``GatherReplies`` (``call``) that records the call once every reply (or the first error) is in."""

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        if status != _S_BATCH:
            n = nbytes(payload, buffers)
            with self.lock:
                self.rep += n
                if status != _S_VALUE and self.err is None:
                    self.err = error_type(payload)
        GatherReplies.deliver(self, rank, status, payload, buffers)

    def _done(self) -> None:
        # (GatherReplies calls it when the call completes, just before the result is set:
        # recorded first, a caller that then reads the metrics finds the call)
        self._record(None)
        GatherReplies._done(self)

    def fail(self, exc: BaseException, proc_id: Optional[str] = None) -> None:
        if not self.concerns(proc_id):  # (a proc that had answered ended: not a failure of the call)
            return
        with self.lock:
            if self.err is None:
                self.err = type(exc).__name__
        GatherReplies.fail(self, exc, proc_id)

class TimedStream(_RecordsOnce, StreamReplies):
    """``StreamReplies`` that records the call when its last reply arrives."""

    _SPAN = "stream"

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        n = nbytes(payload, buffers)
        with self.lock:
            self.rep += n
            if status != _S_VALUE and self.err is None:
                self.err = error_type(payload)
            last = self.next + 1 >= self.n
        if last:  # recorded before the last reply is handed out
            self._record(None)
        StreamReplies.deliver(self, rank, status, payload, buffers)
        if self.next >= self.n:
            self._record(None)

    def fail(self, exc: BaseException, proc_id: Optional[str] = None) -> None:
        if not self.concerns(proc_id):  # (a proc that had answered ended: not a failure of the call)
            return
        self._record(type(exc).__name__)
        StreamReplies.fail(self, exc, proc_id)


def retire_when_stopped(mesh_key: str, class_name: str, done: Any) -> None:
    """Once ``done`` (an actor mesh's stop) resolves, this process's client-side
    stats of the mesh are retired (``_metrics.retire``: nothing of it is kept here)."""
    if state.enabled:
        when_resolved(done, _metrics.retire, mesh_key, class_name, _metrics.CLIENT)


def when_resolved(cell: Any, fn: Any, *args: Any, **kwargs: Any) -> None:
    """Call ``fn(*args, **kwargs)`` once ``cell`` (a ``_future.Cell``) resolves; now if it has."""
    done = functools.partial(fn, *args, **kwargs)
    if not cell.add_callback(done):
        done()


# ------------------------------------------------------------------ the server side (helpers for ActorHost)


def server_stat(host: Any, method: str, prop: Any) -> Any:
    """The server-side stat of ``method`` on actor ``host``, or False when not instrumented."""
    if not state.enabled or (prop is not None and not prop._instrument) or method.startswith("__monarch"):
        return False
    return _metrics.stat_for(_metrics.SERVER, host.key, host.name, method, host.rank.rank, "")


def retire_server(host: Any) -> None:
    """Actor ``host`` stopped: its server-side stats leave this process (their
    final totals go to the root with the next batch)."""
    host._stats.clear()
    if state.enabled:
        _metrics.retire(host.key, host.class_name, _metrics.SERVER, host.rank.rank)


def server_span(h: tuple) -> Optional[tuple]:
    """The server span of an endpoint message (its header ``h``), or None when
    not traced: ``(trace, span_id, parent)`` as the record keeps them -- a
    traced message's context is kept whole as ``trace`` with parent None
    (split at the root, ``_spans.decode``); the first two are what
    ``current_span`` holds for the spans inside the endpoint."""
    if len(h) > 9:
        ctx = h[9]
        if type(ctx) is not bytes or len(ctx) != _spans.CONTEXT_SIZE or not state.enabled:
            return None  # a malformed context: the call runs untraced
        return (ctx, _getrandbits(64) or 1, None)
    return _spans.begin(None) if state.tracing else None  # (a new trace when this process traces everything)


def spawn_trace(mesh: str) -> tuple[Optional[bytes], Any]:
    """The trace context a spawn of actor mesh ``mesh`` carries, and the
    callback that records its client span ``<mesh>.__init__`` when every
    ``__init__`` has returned (``(None, None)``: the spawn is not traced)."""
    c = client_context() if state.enabled else None
    if c is None:
        return None, None
    ctx, parent = c
    m = _spans.meta(f"{mesh}.__init__", "client", ("mesh", mesh, "endpoint", "__init__", "adverb", "spawn",
                                                   "rank", None))
    t0 = _now()

    def end() -> None:
        _spans.record(m, ctx, None, parent, t0, _now() - t0)

    return ctx, end


def init_span(ctx: Optional[bytes]) -> Optional[tuple]:
    """The server span of an actor's ``__init__`` (as :func:`server_span`
    gives one): under the spawn's trace context ``ctx``, or a new trace when
    this process traces everything; None when not traced."""
    if not state.enabled:
        return None
    if ctx is not None:
        return (ctx, _getrandbits(64) or 1, None)
    return _spans.begin(None)  # (None unless this process traces everything)


def run_init(host: Any, sp: tuple, init: Any, args: tuple, kwargs: dict) -> None:
    """Run ``init(*args, **kwargs)`` (an actor's ``__init__``) inside its span
    ``sp`` (from :func:`init_span`), so that ``@traced`` code in it records
    under the spawn's trace; the span is recorded, with the error if it raised."""
    token = _current_span.set(sp)
    t0 = _now()
    err: Optional[str] = None
    try:
        init(*args, **kwargs)
    except BaseException as e:
        err = type(e).__name__
        raise
    finally:
        _current_span.reset(token)
        end_server_span(sp, host, "__init__", t0, _now() - t0, err)


def end_server_span(sp: tuple, host: Any, method: str, t0: int, dt: int, error: Optional[str]) -> None:
    """Record the server span ``sp`` (from :func:`server_span`) of ``method`` on ``host``."""
    m = host.span_metas.get(method)
    if m is None:  # the spans' meta of ``method``, kept by the host (an actor has a thread of its own)
        m = host.span_metas[method] = _spans.meta(f"{host.name}.{method}", "server", (
            "mesh", host.name, "endpoint", method, "rank", host.rank.rank, "actor_id", host.actor_id))
    spans = state.spans
    if len(spans) < _MAX_FLAT:  # (``_spans.record``, inlined)
        spans.extend((m, sp[0], sp[1], sp[2], t0, dt, error))
    else:
        _spans.record(m, sp[0], sp[1], sp[2], t0, dt, error)


