"""``monarch_core.runtime``: what a plugin may use of this process's runtime
(the seam ``monarch-transport-rdma``'s ``RDMABuffer`` is built on, and where
``monarch-spmd`` and ``monarch-tensor-engine`` find a rendezvous address).

Plugins import hookspecs, errors, streams, settings and the public API; a
plugin that moves bytes between procs beside the actor messages also needs
the proc's ports, and one that hosts a rendezvous (``torch.distributed``)
the address its peers reach it at.  This façade is that part of the runtime,
and nothing else:

* **ports** -- :class:`PortHandler` (``deliver(rank, status, payload,
  buffers)`` and ``fail(exc, proc_id)``, called from any thread: hand the
  work over, never block), :func:`open_port`, :func:`close_port`,
  :func:`send_to_port` (a port message: ``payload`` bytes plus out-of-band
  ``buffers``, FIFO per sending thread, acknowledged and retransmitted like
  every message of the proc's sessions; with ``reply_port`` the port hears
  ``fail(SupervisionError)`` if the destination proc dies first);
* **who** -- :func:`start` (this process's runtime, starting a client's on
  first use), :func:`started`, :func:`local_ref` (``(proc_id, address)``),
  :func:`process_name`, :func:`current_actor` (``(key, display name)`` of the
  running actor, or ``None``), :func:`proc_devices` (the device
  ``spawn_procs`` gave this proc: :class:`ProcDevices`);
* **failures and lifecycle** -- :func:`proc_death` (why a proc is known dead),
  :func:`on_proc_failed`, :func:`subscribe` (the lifecycle events:
  ``actor_stopped(actor_key, actor_name, why)``, ``proc_stopping(why)``,
  ``proc_stopped(why)``, ``endpoint_raised(...)``);
* **payloads** -- :func:`dumps` (an object pickled as actor messages are,
  in one ``bytes``: for a payload pickled once and sent to many procs);
* **futures** -- :class:`Cell` (a thread-safe one-shot result),
  :func:`future_of` and :func:`resolved` (the public ``Future`` over one);
  :func:`format_duration` (seconds for messages, as the core writes them:
  ``"300 s"``, ``"5.0 s"``, ``"50 ms"``);
* **rendezvous addresses** -- :func:`host_address` (the address other procs
  reach this process at, for a rendezvous it hosts: a ``TCPStore``, gloo's
  devices), :func:`master_address` (the same for any listen address),
  :func:`transport_host`, :func:`free_port` and :class:`AddrType` (which
  address family), what ``monarch-spmd`` and the tensor engine build on.

Nothing here goes through pluggy; each call is a plain function call on the
per-message path.  Importing this module starts nothing.
"""

from __future__ import annotations

from typing import Any, Callable

from monarch_core._actor import _mesh  # noqa: F401 - a client runtime started from here has the mesh API's hooks
from monarch_core._launch import _devices, _start
from monarch_core._launch._devices import ProcDevices
from monarch_core._proc import _lifecycle, _state
from monarch_core._proc._address import AddrType, free_port, master_address, transport_host
from monarch_core._proc._future import Cell, Future, format_duration
from monarch_core._proc._port import PortHandler, send_raw_to_port
from monarch_core._status import publish_url, withdraw_url

__all__ = [
    "AddrType", "Cell", "Future", "PortHandler", "ProcDevices", "close_port", "current_actor", "dumps",
    "format_duration", "free_port",
    "future_of", "host_address", "local_ref", "master_address", "on_proc_failed", "open_port", "proc_death",
    "proc_devices", "process_name", "publish_url",
    "rdma_backend_specs", "resolved", "send_to_port", "start", "started", "subscribe", "transport_host",
    "withdraw_url",
]


def start() -> None:
    """This process's runtime: a proc's own, or the client's (started now if
    it was not: its kernel, its agent, its listener)."""
    _start.ensure_runtime()


def started() -> bool:
    """True when this process has a runtime (nothing is started to find out)."""
    return _state.current_runtime_or_none() is not None


def local_ref() -> tuple[str, str]:
    """``(proc_id, address)`` of this process, as other procs reach it."""
    _start.ensure_runtime()
    rt = _state.current()
    address = rt.kernel.address
    assert address is not None  # (a runtime's kernel listens from its start)
    return rt.proc_id, address


def host_address(use_ipaddr: AddrType | None = None) -> str:
    """The address other procs of the mesh reach this process at: the host of
    the address its transport listens on (``tcp://10.0.0.7:4123`` ->
    ``10.0.0.7``; ``127.0.0.1`` for a transport local to the machine, such as
    ``ipc``), for code that hosts its own rendezvous (a ``TCPStore``) in a
    proc; what ``SPMDActor.get_host_port`` answers with.  ``use_ipaddr``
    (:class:`AddrType`) asks for an IP address of that family instead of the
    transport's host name.  Starts this process's runtime if it was not (see
    :func:`start`).  Raises ``ValueError`` when no such address exists (see
    :func:`master_address`)."""
    return master_address(local_ref()[1], use_ipaddr)


def process_name() -> str:
    """This process's name, as messages name it (``"client"``, a proc's name)."""
    _start.ensure_runtime()
    return str(_state.current().name)


def current_actor() -> tuple[str, str] | None:
    """``(key, display name)`` of the actor whose code runs now, or ``None``
    outside any actor.  The key is what ``actor_stopped`` events carry."""
    host = _state.current_actor.get()
    return None if host is None else (host.key, str(host.display_name))


def proc_devices() -> ProcDevices | None:
    """The device ``spawn_procs`` gave this proc (docs/configuration.md,
    "Devices of procs"): ``dim`` and ``index`` (its device index on its host,
    along that per-host dimension; ``dim`` ``None``: its position among its
    host's procs), ``visible`` (the ``CUDA_VISIBLE_DEVICES`` it got; ``""``:
    none, past its host's devices) and ``host_visible`` (its host's own
    ``CUDA_VISIBLE_DEVICES``; ``None``: unset, all devices).  ``None`` in a
    client, in a proc of a spawn without per-host dimensions or with
    ``MONARCH_PROC_DEVICES=0``, and in one whose ``BootstrapCommand`` or a
    ``monarch_proc_env`` hook set ``CUDA_VISIBLE_DEVICES`` itself."""
    return _devices.current()


def open_port(handler: PortHandler) -> int:
    """Register ``handler`` for messages to a new port of this process; its id."""
    _start.ensure_runtime()
    return int(_state.current().kernel.add_port(handler))


def close_port(port_id: int, peer: str | None = None) -> None:
    """Unregister ``port_id``; ``peer``: the proc it waited on replies from
    (``send_to_port(..., reply_port=port_id)``), which stops watching it."""
    _start.ensure_runtime()
    kernel = _state.current().kernel
    kernel.remove_port(port_id)
    if peer is not None:
        kernel.reply_done(peer, port_id)


def send_to_port(proc_id: str, address: str | None, port_id: int, payload: bytes, buffers: list | None = None, *,
                 rank: int = 0, status: int = 0, reply_port: int | None = None) -> None:
    """Send one port message to ``port_id`` of proc ``proc_id`` at
    ``address`` (any thread; see the module docstring)."""
    _start.ensure_runtime()
    send_raw_to_port((proc_id, address, port_id), rank, status, payload, buffers or [], None, reply_port)


def proc_death(proc_id: str) -> str | None:
    """Why ``proc_id`` is known to be gone (the report's text), or ``None``."""
    rt = _state.current_runtime_or_none()
    return rt.kernel.dead.get(proc_id) if rt is not None else None


def on_proc_failed(fn: Callable[[str, str, bool], None]) -> None:
    """Call ``fn(proc_id, reason, stopped)`` when this process learns a proc
    failed or stopped (on the kernel's thread: return quickly).  Nothing
    happens when no runtime runs here."""
    rt = _state.current_runtime_or_none()
    if rt is not None:
        rt.kernel.events.subscribe("proc_failed", fn)


def subscribe(event: str, fn: Callable[..., Any]) -> None:
    """Call ``fn`` at each lifecycle ``event`` of this process (idempotent per function)."""
    _lifecycle.subscribe(event, fn)


def dumps(obj: Any) -> bytes:
    """``obj`` pickled as actor messages pickle their arguments (cloudpickle,
    protocol 5; a function defined in ``__main__`` or a notebook keeps its
    file name, for tracebacks and pdb), in one ``bytes`` with no
    out-of-band buffers; ``pickle.loads`` reads it back in any proc.  The
    same bytes as the messages' pickler writes, a third faster for many small
    objects (the tensor engine's batches of commands): its dispatch table is
    one dict, looked up in C, instead of cloudpickle's ``ChainMap``."""
    import io

    f = io.BytesIO()
    _payload_pickler()(f, _dispatch_table()).dump(obj)
    return f.getvalue()


#: (copyreg's dispatch table when flattened, the pickler's dispatch table flattened): see ``_dispatch_table``
_flat_table: tuple[dict, dict] | None = None
_payload_class: Any = None


def _dispatch_table() -> dict:
    """The messages' pickler's dispatch table (cloudpickle's reductions, then
    copyreg's) as one dict, made again whenever copyreg's changed."""
    global _flat_table
    import copyreg

    from monarch_core._proc import _serial

    flat = _flat_table
    if flat is None or flat[0] != copyreg.dispatch_table:
        flat = _flat_table = (dict(copyreg.dispatch_table), dict(_serial._Pickler.dispatch_table))
    return flat[1]


def _payload_pickler() -> Any:
    """The messages' pickler, taking its dispatch table at construction."""
    global _payload_class
    if _payload_class is None:
        from monarch_core._proc import _serial

        class _PayloadPickler(_serial._Pickler):
            def __init__(self, f: Any, table: dict) -> None:
                self.dispatch_table = table  # read by the C pickler's __init__
                super().__init__(f, protocol=5)

        _payload_class = _PayloadPickler
    return _payload_class


def future_of(cell: Cell) -> Future[Any]:
    """The public ``Future`` that resolves with ``cell``."""
    return Future._of(cell)


def resolved(value: Any) -> Future[Any]:
    """A ``Future`` already resolved with ``value``."""
    return Future._resolved(value)


def rdma_backend_specs() -> list[Any]:
    """Every ``RDMABackendSpec`` the installed plugins' ``monarch_rdma_backends``
    hooks give, in the order pluggy calls them (loads the plugin registry;
    call it once and keep the result)."""
    from monarch_core._plugins import registry

    return [spec for batch in registry().pm.hook.monarch_rdma_backends() for spec in batch or ()]
