"""Instrumentation glue of the proc runtime: the client side of a call, and shipping.

* :class:`ClientSide` -- what an endpoint of an actor mesh records in the
  caller: the reply collectors of ``call_one``/``choose``/``call``/``stream``
  are timed subclasses (latency from the send to the reply, reply bytes,
  errors), a ``broadcast`` counts its send; and, when the call is traced, the
  client span and the trace context its messages carry.
* shipping -- a proc sends its telemetry batch (``_telemetry._batch``) to the
  root client once per interval, when it stops, and when the root asks
  (``TelemetryFlush``); the root ingests batches into its hub.
* proc output -- a proc's captured stdout/stderr lines go to the root in
  batches (``_telemetry._output``); ``logging_option`` reconfigures them.

Nothing here runs per call when telemetry is off (``MONARCH_TELEMETRY=0``) or
for an ``@endpoint(instrument=False)``: the mesh then uses the plain collectors.
"""

from __future__ import annotations

import logging
import marshal
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from monarch_core import _telemetry
from monarch_core._actor import _state
from monarch_core._actor._port import GatherReplies, OneReply, StreamReplies, send_to_port
from monarch_core._kernel import _control as C
from monarch_core._kernel import _wire as W
from monarch_core._telemetry import _batch, _events, _metrics, _output, _spans
from monarch_core._telemetry._core import lifecycle, state

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.telemetry")

_now = time.perf_counter_ns
_current_span = _spans.current_span
_getrandbits = _spans.getrandbits
_child_context = _spans.child_context
_MAX_SPANS = _spans.MAX_BUFFERED
_S_VALUE = W.S_VALUE
_S_ERROR = W.S_ERROR
_S_BATCH = W.S_BATCH


nbytes = _metrics.nbytes
error_type = _metrics.error_type


# ------------------------------------------------------------------ the client side of calls


class ClientSide:
    """The instrumentation of one endpoint of one actor-mesh view, in the caller."""

    __slots__ = ("mesh_key", "mesh", "endpoint", "_stats", "span_name", "_attrs", "_first")

    def __init__(self, mesh_key: str, mesh: str, endpoint: str) -> None:
        self.mesh_key = mesh_key
        self.mesh = mesh
        self.endpoint = endpoint
        self.span_name = f"{mesh}.{endpoint}"
        self._stats: dict[tuple, _metrics.EndpointStat] = {}
        self._attrs: dict[tuple, tuple] = {}  # (adverb, rank, thread) -> the spans' meta (``_spans.meta``)
        self._first: Optional[_metrics.EndpointStat] = None  # the stat of index 0's call_one: the common case

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
        cur = _current_span.get()
        if cur is None:
            if not state.tracing:
                return None
            ctx, parent = _getrandbits(192).to_bytes(24, "little"), 0  # (``_spans.new_context``)
        else:
            ctx, parent = _child_context(cur), cur[1]
        track = getattr(_spans._local, "track", None)
        return (ctx, parent, track if track is not None else _spans._thread())

    def end_span(self, sp: tuple, adverb: str, rank: Optional[int], error: Optional[str], t0: int, dt: int) -> None:
        k = (adverb, rank, sp[2])
        m = self._attrs.get(k)
        if m is None:
            m = self._attrs[k] = (self.span_name, "client", sp[2],
                                  ("mesh", self.mesh, "endpoint", self.endpoint, "adverb", adverb, "rank", rank))
        spans = state.spans
        if error is None and len(spans) < _MAX_SPANS:  # (``_spans.record``, inlined)
            spans.append((m, sp[0], None, sp[1], t0, dt))
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
        if _current_span.get() is None and not state.tracing:
            return OneReply(kernel, describe, adverb, index, stat, req), None
        sp = self.span()
        h = TimedOneReply(kernel, describe, adverb, index, stat, req)
        h.side, h.sp = self, sp
        return h, None if sp is None else sp[0]

    def gather(self, kernel: Kernel, extent: Any, build: Any, adverb: str, payload: Any, bufs: list,
               describe: Any = "") -> TimedGather:
        h = TimedGather(kernel, extent, describe, build)
        h.stat = self.stat(None, adverb)
        h.req = nbytes(payload, bufs) * h.n
        h.side = self
        h.sp = self.span()
        h.t0 = _now()
        return h

    def stream(self, kernel: Kernel, n: int, payload: Any, bufs: list, describe: Any = "") -> TimedStream:
        h = TimedStream(kernel, n, describe)
        h.stat = self.stat(None, "stream")
        h.req = nbytes(payload, bufs) * n
        h.side = self
        h.sp = self.span()
        h.t0 = _now()
        return h

    def cast(self, adverb: str, n: int, payload: Any, bufs: list) -> Optional[tuple]:
        """A send with no reply to time: counted now; the span (if traced) to end
        after the send (:meth:`end_cast`)."""
        self.stat(None, adverb).record_send(nbytes(payload, bufs) * n)
        sp = self.span()
        return None if sp is None else (*sp, _now())

    def end_cast(self, sp: tuple, adverb: str) -> None:
        now = _now()
        self.end_span(sp, adverb, None, None, sp[3], now - sp[3])


def client_side(ep: Any) -> Any:
    """The :class:`ClientSide` of endpoint ``ep`` (an ``_endpoint.Endpoint``), or
    False when it is not instrumented (telemetry off, ``instrument=False``)."""
    if not state.enabled or not ep._prop._instrument:
        return False
    return ClientSide(ep._mesh._key, ep._mesh._name, ep._name)


def trace_bytes(sp: Optional[tuple]) -> Optional[bytes]:
    """The header prefix of a traced call's messages (None: not traced)."""
    return None if sp is None else sp[0]


class TimedOneReply(OneReply):
    """``OneReply`` of a traced call: it also ends the client span (``sp``, of
    the ``ClientSide`` ``side``) when the reply (or failure) arrives."""

    __slots__ = ("side", "sp")

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        sp = self.sp
        if sp is not None:
            self.sp = None
            self.side.end_span(sp, self.adverb, self.stat.key[4], error_type(payload) if status == _S_ERROR else None,
                               self.t0, _now() - self.t0)
        OneReply.deliver(self, rank, status, payload, buffers)

    def fail(self, exc: BaseException, proc_id: Optional[str] = None) -> None:
        sp = self.sp
        if sp is not None:
            self.sp = None
            self.side.end_span(sp, self.adverb, self.stat.key[4], type(exc).__name__, self.t0, _now() - self.t0)
        OneReply.fail(self, exc, proc_id)


class _RecordsOnce:
    """What ``TimedGather`` and ``TimedStream`` share: the reply bytes and
    first error they collect, and recording the call exactly once (with its
    span, named ``_SPAN``).  Mixed in before the collector class (whose
    ``lock`` it uses)."""

    _SPAN = "call"
    lock: Any

    def _timing_init(self) -> None:
        self.rep = 0
        self.err: Optional[str] = None
        self.recorded = False
        self.stat: Any = None
        self.req = 0
        self.side: Any = None
        self.sp: Optional[tuple] = None
        self.t0 = 0

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

    def __init__(self, kernel: Kernel, extent: Any, describe: Any, build: Any) -> None:
        super().__init__(kernel, extent, describe, build)
        self._timing_init()

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
        with self.lock:
            if self.err is None:
                self.err = type(exc).__name__
        GatherReplies.fail(self, exc, proc_id)

class TimedStream(_RecordsOnce, StreamReplies):
    """``StreamReplies`` that records the call when its last reply arrives."""

    _SPAN = "stream"

    def __init__(self, kernel: Kernel, n: int, describe: Any) -> None:
        super().__init__(kernel, n, describe)
        self._timing_init()

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
        self._record(type(exc).__name__)
        StreamReplies.fail(self, exc, proc_id)


# ------------------------------------------------------------------ the server side (helpers for ActorHost)


def server_stat(host: Any, method: str, prop: Any) -> Any:
    """The server-side stat of ``method`` on actor ``host``, or False when not instrumented."""
    if not state.enabled or (prop is not None and not prop._instrument) or method.startswith("__monarch"):
        return False
    return _metrics.stat_for(_metrics.SERVER, host.key, host.name, method, host.rank.rank, "")


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
    if not state.tracing:
        return None
    return _spans.begin(None)


#: (actor key, endpoint) -> the spans' meta (``_spans.meta``; an actor has a thread of its own)
_server_meta: dict[tuple, tuple] = {}


def end_server_span(sp: tuple, host: Any, method: str, t0: int, dt: int, error: Optional[str]) -> None:
    """Record the server span ``sp`` (from :func:`server_span`) of ``method`` on ``host``."""
    k = (host.key, method)
    m = _server_meta.get(k)
    if m is None:
        if len(_server_meta) > 10000:
            _server_meta.clear()
        m = _server_meta[k] = _spans.meta(f"{host.name}.{method}", "server", (
            "mesh", host.name, "endpoint", method, "rank", host.rank.rank, "actor_id", host.actor_id))
    spans = state.spans
    if error is None and len(spans) < _MAX_SPANS:  # (``_spans.record``, inlined)
        spans.append((m, sp[0], sp[1], sp[2], t0, dt))
    else:
        _spans.record(m, sp[0], sp[1], sp[2], t0, dt, error)


# ------------------------------------------------------------------ shipping (procs -> root)


class Shipper:
    """Sends this proc's batches to the root client."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rt: Any = None
        self.group = ""
        self.group_size = 1
        self.started = False

    def send(self, batch: dict) -> None:
        rt = self.rt
        if rt is None:
            return
        root = rt.root
        rt.kernel.send(root[0], root[1], W.K_CONTROL, 0, C.encode(C.Telemetry()), _batch.encode(batch), [])

    def ship(self, force: bool = False) -> None:
        """Send one batch now, if there is anything in it (any thread)."""
        rt = self.rt
        if rt is None:
            return
        with self.lock:
            batch = _batch.collect(force=force, address=rt.kernel.address)
            if batch is not None:
                if _output.capture.log_file:
                    batch["log_file"] = _output.capture.log_file
                self.send(batch)

    def output(self, lines: list) -> None:
        """Captured output lines (the ``monarch-output`` thread)."""
        rt = self.rt
        if rt is None:
            return
        self.send({"v": _batch.VERSION, **state.identity(), "address": rt.kernel.address, "output": lines,
                   "group": self.group, "group_size": self.group_size})


shipper = Shipper()


def start_proc(rt: Any, *, host_name: Optional[str], output: str, log_path: Optional[str]) -> None:
    """Telemetry of a new proc (``_launch._proc_main``, before its kernel serves):
    who it is, where its output goes, and the periodic batches to the root."""
    state.read_settings()
    point = rt.point
    label = f"{rt.proc_mesh_name}{point if len(point.extent) else ''}"
    _telemetry.configure_process(proc_id=rt.proc_id, name=label, host=host_name, is_root=False)
    shipper.rt = rt
    shipper.group = rt.proc_mesh_name
    shipper.group_size = point.extent.nelements
    _output.capture.configure(label=label, send=shipper.output, log_path=log_path)
    try:
        _output.capture.set_mode(output)
    except (OSError, ValueError) as e:
        logger.warning("proc output stays where it was: %s", e)


async def ship_loop(kernel: Kernel) -> None:
    """Every ``MONARCH_TELEMETRY_INTERVAL`` s, ship what changed (a proc's kernel task)."""
    import trio

    shipper.ship(force=True)  # the root learns of this proc (and where its output file is)
    while True:
        await trio.sleep(state.interval)
        shipper.ship()


def final_flush() -> None:
    """A stopping proc: its output and its last batch go out before it ends."""
    try:
        _output.capture.drain()
    except Exception:  # noqa: BLE001 - best effort
        logger.debug("draining proc output failed", exc_info=True)
    shipper.ship()


# ------------------------------------------------------------------ control messages


def on_telemetry(payload: Any, sender: str) -> None:
    """A batch from a proc reached this (root) process."""
    # (no ``check_marshal`` walk, which costs ~10 µs a span: a batch comes from a proc of this
    # program, as trusted as the actor payloads this process unpickles; its size is bounded by
    # the kernel's message limits)
    try:
        batch = marshal.loads(payload)
    except Exception as e:  # noqa: BLE001 - a malformed batch is dropped, not fatal
        logger.warning("malformed telemetry batch from %s dropped: %s", sender, e)
        return
    if not isinstance(batch, dict):
        logger.warning("malformed telemetry batch from %s dropped", sender)
        return
    from monarch_core._telemetry._hub import hub

    hub.ingest(batch)


def on_flush(reply: tuple) -> None:
    """The root asks for what this proc has now; answer once it is sent."""
    shipper.ship()
    send_to_port(reply, -1, W.S_VALUE, None)


def on_log_option(reply: tuple, stream: bool, level: int) -> None:
    """``ProcMesh.logging_option`` reached this proc."""
    err: Optional[BaseException] = None
    try:
        if level >= 0:
            logging.getLogger().setLevel(level)
        cap = _output.capture
        cap.set_mode(_output.STREAM if stream else cap.quiet_mode())
        if cap.log_file:
            shipper.ship(force=True)  # the root logs where this proc's output goes now
    except Exception as e:  # noqa: BLE001 - reported to the caller
        err = e
    if err is None:
        send_to_port(reply, -1, W.S_VALUE, None)
    else:
        send_to_port(reply, -1, W.S_ERROR, RuntimeError(f"logging_option failed on {state.name}: {err}"))


# ------------------------------------------------------------------ the root's flush


def flush(timeout: float = 5.0) -> None:
    """Ask every proc that shipped telemetry here to send what it has, wait for
    them (at most ``timeout`` s), and hand everything to the sinks (root only;
    blocking, not on the kernel's loop)."""
    from monarch_core._actor._future import Cell
    from monarch_core._telemetry._hub import hub

    rt = _state.current_runtime_or_none()
    if rt is not None and not rt.is_client:  # in a proc: what it holds goes to the root now
        shipper.ship()
        return
    if rt is not None:
        kernel = rt.kernel
        targets = [p for p in list(hub.sources) if p not in kernel.dead]
        cells = []
        for proc_id in targets:
            c = Cell()
            once = _Once(kernel, c, proc_id)
            port = once.port_id = kernel.add_port(once)
            try:
                kernel.send(proc_id, hub.sources.get(proc_id), W.K_CONTROL, 0,
                            C.encode(C.TelemetryFlush((rt.proc_id, kernel.address, port))), b"", [], port)
            except Exception:  # noqa: BLE001 - a proc that is gone has nothing more to say
                continue
            cells.append(c)
        deadline = time.monotonic() + timeout
        for c in cells:
            c.wait(max(0.0, deadline - time.monotonic()))
        loop_barrier(kernel, max(0.1, deadline - time.monotonic()))
    hub.tick()


def loop_barrier(kernel: Kernel, timeout: float) -> None:
    """Wait until the kernel's loop ran what was queued for it before now (the
    batches delivered so far are handled on the loop)."""
    if kernel.in_loop():
        return
    done = threading.Event()
    try:
        kernel.call_soon(done.set)
    except Exception:  # noqa: BLE001 - the loop is gone
        return
    done.wait(timeout)


class _Once:
    """A port that resolves a cell with the first answer (or failure: the proc
    is gone, and is not asked again)."""

    def __init__(self, kernel: Kernel, cell: Any, proc_id: str) -> None:
        self.kernel = kernel
        self.cell = cell
        self.proc_id = proc_id
        self.port_id = 0

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        self.kernel.remove_port(self.port_id)
        self.cell.set_result(None)

    def fail(self, exc: BaseException, proc_id: Optional[str] = None) -> None:
        from monarch_core._telemetry._hub import hub

        hub.sources.pop(self.proc_id, None)
        self.kernel.remove_port(self.port_id)
        self.cell.set_result(None)


# ------------------------------------------------------------------ lifecycle events


#: proc id -> (proc mesh name, rank, coords, host name): the procs this process spawned
procs: dict[str, tuple] = {}


def register_procs(mesh: str, slots: list, extent: Any, host_mesh: str) -> None:
    """A proc mesh was spawned by this process (``ProcMesh`` of ``spawn_procs``)."""
    if not state.enabled:
        return
    from monarch_core._mesh._shape import Point

    hosts = []
    for rank, slot in enumerate(slots):
        coords = str(Point(rank, extent)) if len(extent) else "{}"
        procs[slot.proc_id] = (mesh, rank, coords, slot.host_name or state.host)
        if slot.host_name and slot.host_name not in hosts:
            hosts.append(slot.host_name)
    lifecycle("proc_mesh.spawned", mesh=mesh, host_mesh=host_mesh, extent=dict(zip(extent.labels, extent.sizes)),
              hosts=hosts)


def proc_ready(proc_id: str, pid: Any, last: bool) -> None:
    """A proc this process spawned reported ready (``last``: the mesh's last one)."""
    info = procs.get(proc_id)
    if info is not None:
        lifecycle("proc.ready", mesh=info[0], proc_id=proc_id, rank=info[1], coords=info[2], host_name=info[3],
                  os_pid=pid)
        if last:
            lifecycle("proc_mesh.ready", mesh=info[0])


def proc_ended(proc_id: str, reason: str, stopped: bool) -> None:
    """A proc this process knows ended (the agent's ``on_proc_failed``)."""
    info = procs.pop(proc_id, None)
    if info is None or not state.enabled:
        return
    if stopped:
        lifecycle("proc.stopped", mesh=info[0], proc_id=proc_id, rank=info[1], host_name=info[3], reason=reason)
        return
    code, sig = _events.exit_status(reason)
    lifecycle("proc.failed", mesh=info[0], proc_id=proc_id, rank=info[1], host_name=info[3], exit_code=code,
              signal=sig, reason=reason)


def actor_failed(host: Any, cause: str, category: str) -> None:
    cur = host._current_reply
    text = cause.strip()
    lifecycle("actor.failed", mesh=host.name, mesh_key=host.key, actor=host.display_name, actor_id=host.actor_id,
              rank=host.rank.rank, coords=str(host.rank), class_name=host.class_name,
              endpoint=cur[2] if cur else None, category=category, cause=text.splitlines()[-1] if text else "")


def supervision_event(failure: Any, report: dict, owner_host: Any, rt: Any) -> None:
    if not state.enabled:
        return
    if owner_host is not None:
        owner = f"{owner_host.display_name}.__supervise__"
    elif rt is not None and rt.is_client:
        owner = "unhandled_fault_hook"
    else:
        owner = "its proc (which exits)"
    events = failure.events
    lifecycle("supervision.event", mesh=failure.mesh_name, mesh_key=report.get("mesh_key"), ranks=list(failure.ranks),
              category=failure.category, owner=owner, root_cause=_events.root_cause(events),
              chain=[e.get("actor") for e in events])


def supervision_handled(mesh: str, handled_by: str, handled: bool) -> None:
    lifecycle("supervision.handled", mesh=mesh, handled_by=handled_by, handled=bool(handled))


def actor_mesh_spawned(mesh: Any, proc_mesh: str, init: GatherReplies) -> None:
    """``ProcMesh.spawn`` sent the actors of ``mesh``; ``actor_mesh.ready``
    follows once every ``__init__`` returned (``init`` collects their answers)."""
    if not state.enabled:
        return
    region = mesh._region_
    lifecycle("actor_mesh.spawned", mesh=mesh._name, mesh_key=mesh._key, class_name=mesh._class.__qualname__,
              proc_mesh=proc_mesh, extent=dict(zip(region.labels, region.sizes)))

    def done() -> None:
        if init.count == init.n:  # every answer a success (an error resolves it early)
            lifecycle("actor_mesh.ready", mesh=mesh._name, mesh_key=mesh._key)

    if not init.cell.add_callback(done):
        done()


def actor_mesh_stopping(mesh: Any, reason: str, cell: Any) -> Any:
    """``mesh`` is being stopped; ``actor_mesh.stopped`` follows when ``cell`` resolves (returned)."""
    if not state.enabled:
        return cell
    lifecycle("actor_mesh.stopping", mesh=mesh._name, mesh_key=mesh._key, reason=reason)

    def done() -> None:
        lifecycle("actor_mesh.stopped", mesh=mesh._name, mesh_key=mesh._key)

    if not cell.add_callback(done):
        done()
    return cell


async def after_procs_stopped(kernel: Kernel, mesh: str) -> None:
    """The procs of ``mesh`` are gone (the kernel's loop, in ``ProcMesh.stop``):
    what they shipped last is handled and printed before ``stop()`` returns."""
    import trio

    # Their last batches were delivered before they ended, and wait in the
    # loop's queue: a callback queued now runs after them.
    done = trio.Event()
    token = trio.lowlevel.current_trio_token()
    token.run_sync_soon(done.set)
    with trio.move_on_after(1.0):
        await done.wait()
    _output.printer.flush(mesh or None)
    if mesh:
        lifecycle("proc_mesh.stopped", mesh=mesh)


def log_option(slots: list, stream: bool, level: int, timeout: float) -> None:
    """Send ``LogOption`` to the procs of ``slots`` and wait until each applied it."""
    from monarch_core._actor._future import Cell

    rt = _state.runtime()
    kernel = rt.kernel
    waits = []
    for slot in slots:
        if slot.proc_id in kernel.dead:
            continue
        c = Cell()
        once = _Answer(kernel, c)
        port = once.port_id = kernel.add_port(once)
        kernel.send(slot.proc_id, slot.address if slot.ready.is_set() else None, W.K_CONTROL, 0,
                    C.encode(C.LogOption((rt.proc_id, kernel.address, port), stream, level)), b"", [], port)
        waits.append((slot, c, once))
    deadline = time.monotonic() + timeout
    problems = []
    for slot, c, once in waits:
        if not c.wait(max(0.0, deadline - time.monotonic())):
            kernel.remove_port(once.port_id)
            problems.append(f"{slot.describe or slot.proc_id}: no answer within {timeout:.0f}s")
        elif once.error is not None:
            problems.append(f"{slot.describe or slot.proc_id}: {once.error}")
    if problems:
        raise RuntimeError("logging_option was not applied by every proc: " + "; ".join(problems))


class _Answer:
    """A port that resolves a cell with one answer, keeping an error's text."""

    def __init__(self, kernel: Kernel, cell: Any) -> None:
        self.kernel = kernel
        self.cell = cell
        self.port_id = 0
        self.error: Optional[str] = None

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        self.kernel.remove_port(self.port_id)
        if status != W.S_VALUE:
            from monarch_core._actor import _serial

            try:
                self.error = str(_serial.loads(payload, buffers))
            except Exception as e:  # noqa: BLE001
                self.error = f"an error that could not be decoded ({e})"
        self.cell.set_result(None)

    def fail(self, exc: BaseException, proc_id: Optional[str] = None) -> None:
        self.kernel.remove_port(self.port_id)
        self.error = str(exc)
        self.cell.set_result(None)
