"""Control messages: the named types of what ``K_CONTROL`` frames carry.

A control message asks a proc's agent (``_proc._agent.ProcAgent``, or a
worker loop's ``_launch._worker.WorkerLoopAgent``) to do something: spawn or
stop an actor, run the proc's bootstrap, stop the proc, answer a heartbeat...
On the wire its header is the ``marshal`` of a tuple, the op name first and
then the fields in the order the classes below declare them; the payload and
buffers (when an op has any) are the cloudpickle of what its docstring says.

:func:`encode` gives those header bytes; :func:`decode` turns a decoded
header back into a message, checking the number and the types of its fields
(:class:`~monarch_core.errors.ProtocolError` when they are wrong, or when the
op is unknown).  Only plain data lives here, so every sender and receiver
(kernel, proc runtime, launch, meshes) can import it.
"""

from __future__ import annotations

import marshal
from typing import Any, Callable, NamedTuple, Optional, Union

from monarch_core.errors import ProtocolError

#: ``(proc_id, address, port_id)``: where a reply goes (``address`` ``None``: look it up).
PortRef = tuple
#: ``(proc_id, address)``.
ProcRef = tuple


# ---------------------------------------------------------------- to a proc's agent


class Spawn(NamedTuple):
    """Start actor ``key`` (rank ``rank`` of mesh ``mesh_name`` over ``labels``/``sizes``) on this proc; payload: ``_serial.dumps_spawn(Class, args, kwargs)``."""

    key: str
    mesh_name: str
    rank: int
    labels: tuple
    sizes: tuple
    init_reply: Optional[PortRef]  # hears of the end of ``__init__``
    class_name: str
    owner: Optional[tuple]  # (proc_id, address, owning actor's key or "")
    trace: Optional[bytes] = None  # the trace context of a traced spawn (``__init__`` records under it)


class StopActor(NamedTuple):
    """Stop actor ``key`` after what is queued for it, then answer ``reply`` (if any)."""

    key: str
    reply: Optional[PortRef]
    reason: str


class Init(NamedTuple):
    """Run this new proc's bootstrap (payload: the callable or ``None``) and report ready (or the error) to ``reply``."""

    reply: PortRef
    rank: int


class StopProc(NamedTuple):
    """Stop every actor of this proc (``grace`` seconds for their cleanup), then the proc itself."""

    reason: str
    grace: float


class Controller(NamedTuple):
    """Answer ``reply`` with controller ``name``, spawning it here first (payload: ``_serial.dumps_spawn(Class, args, kwargs)``)."""

    name: str
    reply: PortRef


class Supervise(NamedTuple):
    """An actor of a mesh this process owns failed; payload: the failure report."""


class RegisterOwner(NamedTuple):
    """Tell ``owner`` (too) when child proc ``proc_id`` ends."""

    proc_id: str
    owner: ProcRef


class ProcStopping(NamedTuple):
    """Proc ``proc_id`` is stopping on purpose: its end is no failure."""

    proc_id: str


class ProcDied(NamedTuple):
    """Proc ``proc_id`` ended (``stopped``: it was asked to)."""

    proc_id: str
    reason: str
    stopped: bool


class Ping(NamedTuple):
    """Heartbeat: answer ``reply`` with this proc's id."""

    reply: PortRef


class Telemetry(NamedTuple):
    """A proc's telemetry batch, to the root client; payload: its ``marshal`` (``monarch_core._telemetry._batch``)."""


class TelemetryFlush(NamedTuple):
    """Send the root what telemetry this proc holds now, then answer ``reply``."""

    reply: PortRef


class LogOption(NamedTuple):
    """``ProcMesh.logging_option``: stream this proc's output to the root client or not, set its root logger's level (-1: leave it), answer ``reply``."""

    reply: PortRef
    stream: bool
    level: int


class Reload(NamedTuple):
    """``sync_workspace(auto_reload=True)``: the files ``paths`` (this host's copies) changed; reload the modules loaded from them (``_proc._reload``), answer ``reply`` with ``[reloaded names, errors]``."""

    reply: PortRef
    paths: tuple


# ---------------------------------------------------------------- to a worker loop


class HostHello(NamedTuple):
    """Readiness: answer ``reply`` with this worker loop's hostname, pid and address."""

    reply: PortRef


class HostSpawn(NamedTuple):
    """Start procs for the sender; payload: their list of ``ProcSpec`` s."""


class ChildHello(NamedTuple):
    """A proc this worker loop started listens at ``address``."""

    proc_id: str
    address: str


class HostKill(NamedTuple):
    """Send ``sig_name`` (``"terminate"`` or ``"kill"``) to the procs ``proc_ids`` this worker loop started."""

    proc_ids: tuple
    sig_name: str


class HostShutdown(NamedTuple):
    """Kill every proc this worker loop started, and exit."""


Message = Union[
    Spawn, StopActor, Init, StopProc, Controller, Supervise, RegisterOwner, ProcStopping, ProcDied, Ping,
    Telemetry, TelemetryFlush, LogOption, Reload, HostHello, HostSpawn, ChildHello, HostKill, HostShutdown,
]


# ---------------------------------------------------------------- field checks


def _str(v: Any) -> Any:
    if not isinstance(v, str):
        raise TypeError(f"expected a str, got {type(v).__name__}")
    return v


def _int(v: Any) -> Any:
    if type(v) is not int:
        raise TypeError(f"expected an int, got {type(v).__name__}")
    return v


def _number(v: Any) -> Any:
    if type(v) not in (int, float):
        raise TypeError(f"expected a number, got {type(v).__name__}")
    return float(v)


def _flag(v: Any) -> Any:
    if type(v) not in (bool, int):
        raise TypeError(f"expected a bool, got {type(v).__name__}")
    return bool(v)


def _seq(item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not isinstance(v, (tuple, list)):
            raise TypeError(f"expected a sequence, got {type(v).__name__}")
        return tuple(item(x) for x in v)

    return check


def _opt_str(v: Any) -> Any:
    return v if v is None else _str(v)


def _record(*items: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if not isinstance(v, (tuple, list)) or len(v) != len(items):
            raise TypeError(f"expected {len(items)} fields, got {v!r:.80}")
        return tuple(f(x) for f, x in zip(items, v))

    return check


def _optional(f: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        return None if not v else f(v)  # the receivers have always read an empty one as none

    return check


def _opt_context(v: Any) -> Any:
    if v is None:
        return None
    if type(v) is not bytes or len(v) != 24:
        raise TypeError(f"expected a 24-byte trace context, got {v!r:.80}")
    return v


_port_ref = _record(_str, _opt_str, _int)
_proc_ref = _record(_str, _opt_str)

#: op name -> (message type, a check per field, in order).
_SPEC: dict[str, tuple[type, tuple]] = {
    "spawn": (Spawn, (_str, _str, _int, _seq(_str), _seq(_int), _optional(_port_ref), _str,
                      _optional(_record(_str, _opt_str, _str)), _opt_context)),
    "stop_actor": (StopActor, (_str, _optional(_port_ref), _str)),
    "init": (Init, (_port_ref, _int)),
    "stop_proc": (StopProc, (_str, _number)),
    "controller": (Controller, (_str, _port_ref)),
    "supervise": (Supervise, ()),
    "register_owner": (RegisterOwner, (_str, _proc_ref)),
    "proc_stopping": (ProcStopping, (_str,)),
    "proc_died": (ProcDied, (_str, _str, _flag)),
    "ping": (Ping, (_port_ref,)),
    "telemetry": (Telemetry, ()),
    "telemetry_flush": (TelemetryFlush, (_port_ref,)),
    "log_option": (LogOption, (_port_ref, _flag, _int)),
    "reload": (Reload, (_port_ref, _seq(_str))),
    "host_hello": (HostHello, (_port_ref,)),
    "host_spawn": (HostSpawn, ()),
    "child_hello": (ChildHello, (_str, _str)),
    "host_kill": (HostKill, (_seq(_str), _str)),
    "host_shutdown": (HostShutdown, ()),
}
#: message type -> its op name (the first element on the wire).
OP: dict[type, str] = {cls: op for op, (cls, _checks) in _SPEC.items()}


def op_type(op: Any) -> type | None:
    """The message type of op name ``op`` (``None``: no such op)."""
    spec = _SPEC.get(op) if isinstance(op, str) else None
    return spec[0] if spec is not None else None


def encode(msg: Message) -> bytes:
    """The header bytes of ``msg``: ``marshal`` of ``(op, *fields)``."""
    return marshal.dumps((OP[type(msg)], *msg))


def decode(h: tuple) -> Message:
    """The message of a decoded control header ``h`` (``(op, *fields)``).

    :class:`ProtocolError` when the op is unknown or a field is missing,
    extra or of the wrong type.  Sequences come back as tuples, a number
    of seconds as a float.
    """
    if not isinstance(h, tuple) or not h:
        raise ProtocolError(f"malformed control message header {h!r:.80}")
    op = h[0]
    spec = _SPEC.get(op) if isinstance(op, str) else None
    if spec is None:
        raise ProtocolError(f"unknown control op {op!r:.80}")
    cls, checks = spec
    if len(h) - 1 != len(checks):
        n = len(checks)
        raise ProtocolError(f"control op {op!r} takes {n} field{'' if n == 1 else 's'}, got {len(h) - 1}")
    try:
        return cls(*[check(v) for check, v in zip(checks, h[1:])])  # type: ignore[no-any-return]
    except (TypeError, ValueError) as e:
        raise ProtocolError(f"control op {op!r}: {e}") from None
