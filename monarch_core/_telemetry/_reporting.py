"""What a proc reports to the root client, and the root's side of it.

* starting -- :func:`start_client` / :func:`start_proc`: who this process is
  in what it records (the runtime's builders call them), and, at the root,
  its sinks; :func:`close_client` is the root's final flush;
* shipping -- a proc sends its telemetry batch (:mod:`._batch`) to the
  root once per interval, when it stops, and when the root asks
  (``TelemetryFlush``); the root ingests batches into its hub
  (:func:`on_telemetry`), and :func:`flush` waits for every proc's;
* proc output -- a proc's captured stdout/stderr lines (``_proc._output``) go
  to the root in batches; ``logging_option`` reconfigures them;
* lifecycle and supervision events (``_events.LIFECYCLE``): recorded by
  the functions below that :func:`._runtime.subscribe` makes listeners of
  the runtime's events (``_proc._runtime_events``).

The per-call half (endpoint metrics, spans) is :mod:`._instrument`.
"""

from __future__ import annotations

import logging
import marshal
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from monarch_core._proc import _output, _serial, _state
from monarch_core._proc._future import Cell
from monarch_core._proc._port import GatherReplies, send_to_port
from monarch_core._proc import _control as C
from monarch_core._kernel import _wire as W
from monarch_core._telemetry import _batch, _events
from monarch_core._telemetry._core import configure_process, lifecycle, state
from monarch_core._telemetry._hub import hub
from monarch_core._telemetry._instrument import when_resolved

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.telemetry")


# ------------------------------------------------------------------ shipping (procs -> root)


class Shipper:
    """Sends this proc's batches to the root client."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rt: Any = None

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
                _send(rt, batch)

    def output(self, lines: list) -> None:
        """Captured output lines (the ``monarch-output`` thread), with their proc mesh (``group``)."""
        rt = self.rt
        if rt is not None:
            _send(rt, {"v": _batch.VERSION, **state.identity(), "address": rt.kernel.address, "output": lines,
                       "group": rt.proc_mesh_name, "group_size": rt.point.extent.nelements})


def _send(rt: Any, batch: dict) -> None:
    rt.kernel.send(*rt.root, W.K_CONTROL, 0, C.encode(C.Telemetry()), marshal.dumps(batch), [])


shipper = Shipper()


def start_client(rt: Any) -> None:
    """Telemetry of a new client (the root): who it is, and its sinks (the
    settings', the plugins'): procs ship their telemetry here."""
    configure_process(proc_id=rt.proc_id, name="client", is_root=True)
    hub.start()


def close_client(kernel: Kernel) -> None:
    """The root's shutdown: what the procs shipped before they stopped goes to
    the sinks, which are closed."""
    try:
        loop_barrier(kernel, 1.0)  # the batches delivered so far wait in the loop's queue: let them through
        hub.close()
    except Exception:  # pragma: no cover - best effort at exit
        logger.exception("closing the telemetry sinks failed")


def start_proc(rt: Any, *, host_name: Optional[str], output: str, log_path: Optional[str]) -> None:
    """Telemetry of a new proc (``_launch._proc_main``, before its kernel serves):
    who it is, where its output goes, and the periodic batches to the root."""
    state.read_settings()
    point = rt.point
    label = f"{rt.proc_mesh_name}{point if len(point.extent) else ''}"
    configure_process(proc_id=rt.proc_id, name=label, host=host_name, is_root=False)
    shipper.rt = rt
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
    hub.ingest(batch)


def on_flush(reply: tuple) -> None:
    """The root asks for what this proc has now; answer once it is sent."""
    shipper.ship()
    send_to_port(reply, -1, W.S_VALUE, None)


def on_log_option(reply: tuple, stream: bool, level: int) -> None:
    """``ProcMesh.logging_option`` reached this proc: applied, then answered (its error, if it failed)."""
    try:
        if level >= 0:  # the user's logging (monarch's own loggers keep MONARCH_LOG_LEVEL, see _proc_main)
            logging.getLogger().setLevel(level)
            if logging.lastResort is not None:  # records of a program that configured no handler show at it too
                logging.lastResort.setLevel(level)
        cap = _output.capture
        cap.set_mode(_output.STREAM if stream else cap.quiet_mode())
        if cap.log_file:
            shipper.ship(force=True)  # the root logs where this proc's output goes now
    except Exception as e:  # noqa: BLE001 - reported to the caller
        send_to_port(reply, -1, W.S_ERROR, RuntimeError(f"logging_option failed on {state.name}: {e}"))
        return
    send_to_port(reply, -1, W.S_VALUE, None)


# ------------------------------------------------------------------ the root's flush


def flush(timeout: float = 5.0) -> None:
    """Ask every proc that shipped telemetry here to send what it has, wait for
    them (at most ``timeout`` s), and hand everything to the sinks (root only;
    blocking, not on the kernel's loop)."""
    rt = _state.current_runtime_or_none()
    if rt is not None and not rt.is_client:  # in a proc: what it holds goes to the root now
        shipper.ship()
        return
    if rt is not None:
        answers = []
        for proc_id in [p for p in list(hub.sources) if p not in rt.kernel.dead]:
            try:
                answers.append(_ask(rt, proc_id, hub.sources.get(proc_id), C.TelemetryFlush, forget=True))
            except Exception:  # noqa: BLE001 - a proc that is gone has nothing more to say
                continue
        deadline = time.monotonic() + timeout
        for a in answers:
            a.wait(max(0.0, deadline - time.monotonic()))
        loop_barrier(rt.kernel, max(0.1, deadline - time.monotonic()))
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
    """A proc this process knows ended (the agent's ``on_proc_failed``): the root
    forgets where it was and keeps its figures as stopped meshes' totals."""
    info = procs.pop(proc_id, None)
    if state.is_root:
        hub.proc_ended(proc_id)
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


def supervision_event(failure: Any, report: dict, owner_host: Any, runtime: Any) -> None:
    if not state.enabled:
        return
    if owner_host is not None:
        owner = f"{owner_host.display_name}.__supervise__"
    elif runtime is not None and runtime.is_client:
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

    when_resolved(init.cell, done)


def actor_mesh_stopping(mesh: Any, reason: str, done: Any) -> None:
    """``mesh`` is being stopped; ``actor_mesh.stopped`` follows when ``done`` resolves."""
    if not state.enabled:
        return
    lifecycle("actor_mesh.stopping", mesh=mesh._name, mesh_key=mesh._key, reason=reason)
    when_resolved(done, lifecycle, "actor_mesh.stopped", mesh=mesh._name, mesh_key=mesh._key)


def log_option(mesh: str, slots: list, stream: bool, level: int, window: Optional[float], timeout: float) -> None:
    """``ProcMesh.logging_option`` of proc mesh ``mesh``: its aggregation
    ``window`` in the root's printer; ``LogOption`` sent to the procs of
    ``slots``, and waited for until each applied it."""
    _output.printer.set_window(mesh, window)
    rt = _state.current()
    waits = [(slot, _ask(rt, slot.proc_id, slot.address if slot.ready.is_set() else None,
                         lambda reply: C.LogOption(reply, stream, level)))
             for slot in slots if slot.proc_id not in rt.kernel.dead]
    deadline = time.monotonic() + timeout
    problems = []
    for slot, a in waits:
        if not a.wait(max(0.0, deadline - time.monotonic())):
            rt.kernel.remove_port(a.port_id)
            problems.append(f"{slot.describe or slot.proc_id}: no answer within {timeout:.0f}s")
        elif a.error is not None:
            problems.append(f"{slot.describe or slot.proc_id}: {a.error}")
    if problems:
        raise RuntimeError("logging_option was not applied by every proc: " + "; ".join(problems))


def _ask(rt: Any, proc_id: str, address: Optional[str], message: Any, forget: bool = False) -> _Answer:
    """Send the control message ``message(reply)`` to ``proc_id``; the :class:`_Answer`
    its reply resolves (``forget``: a flush's, whose failure drops the proc from the hub's sources)."""
    a = _Answer(rt.kernel, proc_id if forget else None)
    rt.kernel.send(proc_id, address, W.K_CONTROL, 0, C.encode(message((rt.proc_id, rt.kernel.address, a.port_id))),
                   b"", [], a.port_id)
    return a


class _Answer(Cell):
    """A port whose cell resolves with its one answer, keeping an error's text (or
    the failure's: the proc is gone; a flush's proc ``proc_id`` is not asked again)."""

    def __init__(self, kernel: Kernel, proc_id: Optional[str] = None) -> None:
        Cell.__init__(self)
        self.kernel = kernel
        self.proc_id = proc_id
        self.error: Optional[str] = None
        self.port_id = kernel.add_port(self)

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        self.kernel.remove_port(self.port_id)
        if status != W.S_VALUE:
            try:
                self.error = str(_serial.loads(payload, buffers))
            except Exception as e:  # noqa: BLE001
                self.error = f"an error that could not be decoded ({e})"
        self.set_result(None)

    def fail(self, exc: BaseException, proc_id: Optional[str] = None) -> None:
        if self.proc_id is not None:
            hub.sources.pop(self.proc_id, None)
        self.kernel.remove_port(self.port_id)
        self.error = str(exc)
        self.set_result(None)
