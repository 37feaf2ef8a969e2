"""The plugin contract of monarch-core: pluggy hookspecs for four seams.

This module, together with the public types it names, is the *only* thing a
plugin imports from monarch-core.  Four families of hooks:

* **transport** -- :func:`monarch_transports` yields :class:`TransportSpec`
  descriptions of byte-stream channels (``ipc``, ``tcp``, ``tls`` ...).
* **allocator** -- :func:`monarch_schedulers` yields :class:`SchedulerSpec`
  descriptions of host schedulers (``local``, ``ssh``, ``slurm`` ...).
* **bootstrap** -- :func:`monarch_proc_env` adjusts the environment of a proc
  about to start; :func:`monarch_proc_setup` runs inside each new proc before
  any actor.
* **telemetry** -- :func:`monarch_telemetry_sinks` yields sinks that receive
  batches of :class:`TelemetryEvent`.

Hooks are plain synchronous functions that *describe* or *decide*; they are
called once (when a transport is enabled, a host mesh is allocated, a proc
starts, or the kernel starts), never per message.  The objects they return do
the asynchronous work on the kernel's trio loop.

A plugin is a module with functions decorated by :data:`hookimpl`, declared in
its distribution's ``pyproject.toml``::

    [project.entry-points.monarch]
    mytransport = "my_package.plugin"

``monarch plugins`` lists what is installed.  ``MONARCH_DISABLED_PLUGINS=a,b``
blocks plugins by entry-point name.  A plugin that fails to import becomes a
warning naming it; the rest keep working.

Errors: objects returned by plugins must raise only exceptions from
:mod:`monarch_core.errors` (``ConnectError``, ``ConnectionClosed``,
``ProtocolError``, ``TransportError``, ``ConfigError`` ...).  Map ``OSError``,
``trio`` and library exceptions at the plugin boundary.

See ``docs/plugin-authors.md`` for a walk-through and
:mod:`monarch_core.testing` for the conformance checks every transport should
pass.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import pluggy

__all__ = [
    "PROJECT_NAME",
    "Allocation",
    "AllocationRequest",
    "HostHandle",
    "Listener",
    "Scheduler",
    "SchedulerSpec",
    "Stream",
    "TelemetryEvent",
    "TelemetrySink",
    "Transport",
    "TransportSpec",
    "hookimpl",
    "hookspec",
    "monarch_proc_env",
    "monarch_proc_setup",
    "monarch_schedulers",
    "monarch_telemetry_sinks",
    "monarch_transports",
]

PROJECT_NAME = "monarch"

#: Decorator for hook *specifications* (used by this module only).
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Decorator for hook *implementations*: plugins mark their functions with it.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# --------------------------------------------------------------------------
# transport types


class Stream(abc.ABC):
    """A reliable, ordered, bidirectional byte stream (one connection).

    The kernel puts framing, sequence numbers, acknowledgements and
    retransmission on top; a stream only moves bytes.  All methods are called
    from the kernel's trio loop.  Errors must be mapped to
    :class:`~monarch_core.errors.ConnectionClosed` (peer gone / broken) or
    :class:`~monarch_core.errors.TransportError`.
    """

    #: Human-readable description of the peer, for error messages and logs.
    peer: str = "?"

    #: True when the transport has established who the peer is (TLS with
    #: client certificates): the kernel then receives its large messages at
    #: their announced size from the first.  Otherwise (None: undeclared) the
    #: peer is proven by delivering a message, and until then the kernel's
    #: unproven-peer limits apply (``MONARCH_UNPROVEN_*``; a Unix socket whose
    #: peer runs as this user counts as authenticated).
    authenticated: bool | None = None

    @abc.abstractmethod
    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send every byte of ``data`` or raise ``ConnectionClosed``."""

    @abc.abstractmethod
    async def receive_some(self, max_bytes: int = 65536) -> bytes | bytearray:
        """Return at least one byte, or ``b""`` at end of stream."""

    async def receive_into(self, buffer: memoryview) -> int:
        """Fill a prefix of ``buffer``; return the count (0 at end of stream).

        Optional: the default copies from :meth:`receive_some`.  Transports
        that can read straight into ``buffer`` (``recv_into``) should override
        it so that large tensors are received without an extra copy.
        """
        data = await self.receive_some(len(buffer))
        n = len(data)
        buffer[:n] = data
        return n

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the stream.  Idempotent; never raises."""


class Listener(abc.ABC):
    """Accepts incoming :class:`Stream` s on one bound address."""

    #: The URL other processes should dial to reach this listener.  For a bind
    #: spec with port 0 this holds the port actually bound.
    address: str = ""

    @abc.abstractmethod
    async def accept(self) -> Stream:
        """Wait for and return the next incoming connection.

        A connection that fails during accept-time work (a TLS handshake with a
        bad certificate, say) is logged and skipped, not raised: only a closed
        or broken listener raises (``TransportError``).
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop listening.  Idempotent; never raises."""


class Transport(abc.ABC):
    """One kind of channel, resolved once and then called directly.

    A transport knows how to parse and format its addresses, bind a listener
    and dial an address.  ``listen`` and ``connect`` run on the kernel's trio
    loop.
    """

    #: Canonical name, e.g. ``"ipc"``.
    name: str = ""

    @abc.abstractmethod
    def default_bind_spec(self) -> str:
        """A bind spec for a new proc when the user gave no explicit address,
        e.g. ``"ipc://@monarch-<random>"`` or ``"tcp://myhost:0"``."""

    def normalize(self, url: str) -> str:
        """Validate ``url`` (one of this transport's schemes) and return its
        canonical form; raise ``ValueError`` naming the accepted forms."""
        return url

    def child_bind_spec(self, parent_address: str) -> str:
        """The bind spec for a proc spawned by a process that listens at
        ``parent_address`` (default: :meth:`default_bind_spec`).  TCP uses it
        so that child procs advertise the same routable host as their parent."""
        return self.default_bind_spec()

    @abc.abstractmethod
    async def listen(self, bind_spec: str) -> Listener:
        """Bind ``bind_spec`` and return a listener (``TransportError`` on failure)."""

    @abc.abstractmethod
    async def connect(self, address: str) -> Stream:
        """Dial ``address`` (``ConnectError`` naming it on failure)."""


@dataclasses.dataclass(frozen=True)
class TransportSpec:
    """What :func:`monarch_transports` returns: a transport's description.

    ``factory`` is either a zero-argument callable returning a
    :class:`Transport`, or a ``"module:attribute"`` string imported only when
    the transport is first used, so that listing plugins stays cheap.
    """

    name: str
    schemes: tuple[str, ...]
    factory: Callable[[], Transport] | str
    description: str = ""
    #: Other names accepted by ``enable_transport`` (``"unix"`` for ``"ipc"``).
    aliases: tuple[str, ...] = ()

    def load(self) -> Transport:
        """Import (if needed) and call the factory."""
        return _call_factory(self.factory)


# --------------------------------------------------------------------------
# allocator types


@dataclasses.dataclass(frozen=True)
class HostHandle:
    """One allocated host.

    ``address is None`` means "this machine, spawn procs as children of the
    calling process".  Otherwise ``address`` is the URL of a monarch worker
    loop (``python -m monarch_core.worker``) running on that host, which spawns
    procs on request.
    """

    name: str
    address: str | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AllocationRequest:
    """What a scheduler is asked for.

    ``params`` are the scheduler's own parameters from the configuration entry
    (``monarch.toml``) or from explicit arguments; ``source`` says where they
    came from (a file path and table) so errors can name it.
    """

    name: str
    params: Mapping[str, Any]
    source: str = "<arguments>"


class Allocation(abc.ABC):
    """Hosts handed out by a scheduler, and how to give them back."""

    hosts: Sequence[HostHandle] = ()
    #: Dimension label of the host mesh built from this allocation.
    dim: str = "hosts"

    async def release(self) -> None:
        """Give the hosts back (stop worker loops, cancel the job).  Idempotent."""


class Scheduler(abc.ABC):
    """Turns an :class:`AllocationRequest` into running hosts."""

    name: str = ""

    def validate(self, request: AllocationRequest) -> None:
        """Raise :class:`~monarch_core.errors.ConfigError` naming
        ``request.source`` when the parameters are wrong.  Called before
        :meth:`allocate`."""

    @abc.abstractmethod
    async def allocate(self, request: AllocationRequest) -> Allocation:
        """Allocate hosts (runs on the kernel's trio loop)."""


@dataclasses.dataclass(frozen=True)
class SchedulerSpec:
    """What :func:`monarch_schedulers` returns.  ``factory`` as in
    :class:`TransportSpec`: a callable or a lazily imported ``"module:attr"``."""

    name: str
    factory: Callable[[], Scheduler] | str
    description: str = ""

    def load(self) -> Scheduler:
        """Import (if needed) and call the factory."""
        return _call_factory(self.factory)


# --------------------------------------------------------------------------
# telemetry types


@dataclasses.dataclass(frozen=True)
class TelemetryEvent:
    """One telemetry record.

    ``kind`` is ``"span"`` (a ``@traced`` function or an endpoint invocation:
    ``name``, ``start_ns``, ``duration_ns``), ``"lifecycle"`` (proc/actor
    spawned, stopped, failed: ``name`` is the event, ``attributes`` the
    subject) or ``"metric"``.
    """

    kind: str
    name: str
    start_ns: int
    duration_ns: int = 0
    attributes: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class TelemetrySink(abc.ABC):
    """Receives telemetry in batches, from a background task, never per event."""

    @abc.abstractmethod
    def emit(self, events: Sequence[TelemetryEvent]) -> None:
        """Handle a batch.  Must not block for long; exceptions are logged and
        the sink is kept."""

    def close(self) -> None:
        """Flush and release resources at shutdown."""


def _call_factory(factory: Callable[[], Any] | str) -> Any:
    if isinstance(factory, str):
        factory = _import_object(factory)
    return factory()


def _import_object(spec: str) -> Any:
    import importlib

    module_name, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------
# hook specifications


@hookspec
def monarch_transports() -> Sequence[TransportSpec]:
    """Describe the transports this plugin provides.

    Called once, the first time a transport is resolved (``enable_transport``,
    the first mesh, ``monarch plugins``).  Return a sequence of
    :class:`TransportSpec`; every plugin's results are collected.  A scheme
    claimed by two plugins goes to the one registered first (built-ins first,
    then entry points in name order), and the clash is logged.

    Complete example -- a transport over Unix socket pairs in a directory::

        # my_transport/plugin.py
        import trio
        from monarch_core.hookspecs import (
            Listener, Stream, Transport, TransportSpec, hookimpl)
        from monarch_core.errors import ConnectError, ConnectionClosed

        class _S(Stream):
            def __init__(self, s): self._s, self.peer = s, "dir"
            async def send_all(self, data):
                try: await self._s.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
                    raise ConnectionClosed(str(e)) from None
            async def receive_some(self, max_bytes=65536):
                try: return await self._s.receive_some(max_bytes)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
                    raise ConnectionClosed(str(e)) from None
            async def aclose(self): await self._s.aclose()

        class _L(Listener):
            def __init__(self, lst, address): self._l, self.address = lst, address
            async def accept(self): return _S(await self._l.accept())
            async def aclose(self): await self._l.aclose()

        class DirTransport(Transport):
            name = "dir"
            def default_bind_spec(self):
                import uuid; return f"dir:///tmp/monarch-{uuid.uuid4().hex}"
            async def listen(self, spec):
                path = spec[len("dir://"):]
                sock = trio.socket.socket(trio.socket.AF_UNIX)
                await sock.bind(path); sock.listen()
                return _L(trio.SocketListener(sock), spec)
            async def connect(self, address):
                try: return _S(await trio.open_unix_socket(address[len("dir://"):]))
                except OSError as e: raise ConnectError(f"{address}: {e}") from None

        @hookimpl
        def monarch_transports():
            return [TransportSpec(name="dir", schemes=("dir",),
                                  factory="my_transport.plugin:DirTransport",
                                  description="Unix sockets in a directory")]

    and in ``pyproject.toml``::

        [project.entry-points.monarch]
        dir = "my_transport.plugin"

    after which ``enable_transport("dir")`` and ``enable_transport("dir:///tmp/x")``
    select it.
    """


@hookspec
def monarch_schedulers() -> Sequence[SchedulerSpec]:
    """Describe the host schedulers (allocators) this plugin provides.

    Called once, when ``hosts_from_config(name)`` first needs a scheduler or
    ``monarch plugins`` lists them.  Return a sequence of
    :class:`SchedulerSpec`; every plugin's results are collected and the first
    registration of a name wins.  The configuration entry's ``scheduler = "..."``
    picks one by name.

    Complete example -- a scheduler that hands out N hosts on this machine,
    each running its own worker loop::

        # my_sched/plugin.py
        import sys, trio
        from monarch_core.hookspecs import (
            Allocation, HostHandle, Scheduler, SchedulerSpec, hookimpl)
        from monarch_core.errors import ConfigError

        class _Alloc(Allocation):
            def __init__(self, procs, hosts): self._procs, self.hosts = procs, hosts
            async def release(self):
                for p in self._procs: p.kill()

        class LoopbackWorkers(Scheduler):
            name = "loopback"
            def validate(self, request):
                n = request.params.get("hosts")
                if not isinstance(n, int) or n < 1:
                    raise ConfigError(f"{request.source}: 'hosts' must be an int >= 1")
            async def allocate(self, request):
                procs, hosts = [], []
                for i in range(request.params["hosts"]):
                    addr = f"tcp://127.0.0.1:{29500 + i}"
                    procs.append(await trio.lowlevel.open_process(
                        [sys.executable, "-m", "monarch_core.worker", "--address", addr]))
                    hosts.append(HostHandle(name=f"host{i}", address=addr))
                return _Alloc(procs, hosts)

        @hookimpl
        def monarch_schedulers():
            return [SchedulerSpec("loopback", "my_sched.plugin:LoopbackWorkers",
                                  "N worker loops on this machine")]

    with ``[project.entry-points.monarch] loopback = "my_sched.plugin"``, a
    ``monarch.toml`` entry ``[hosts.dev] scheduler = "loopback"  hosts = 2``
    makes ``hosts_from_config("dev")`` return a two-host mesh.
    """


@hookspec
def monarch_proc_env(proc_name: str, rank: int, coords: Mapping[str, int]) -> Mapping[str, str | None] | None:
    """Adjust the environment of a proc about to be started.

    Called once per proc, in the process that spawns it, just before the OS
    process starts.  Return a mapping of variables to set (``None`` removes a
    variable) or ``None`` for no change.  Results of all plugins are applied
    in registration order, after the user's ``BootstrapCommand`` env.

    Complete example -- pin each proc of a ``gpus`` dimension to its GPU::

        from monarch_core.hookspecs import hookimpl

        @hookimpl
        def monarch_proc_env(proc_name, rank, coords):
            if "gpus" in coords:
                return {"CUDA_VISIBLE_DEVICES": str(coords["gpus"])}
            return None
    """


@hookspec
def monarch_proc_setup(proc_name: str, rank: int) -> None:
    """Run setup inside a new proc, before any actor and before the user's
    ``bootstrap=`` callable.

    Called once in each new proc's process, on its main thread, after the
    proc's kernel is listening.  An exception fails the proc's start, and the
    error (with the plugin's name) is reported to whoever spawned it.

    Complete example -- seed every proc's random generator from its rank::

        import random
        from monarch_core.hookspecs import hookimpl

        @hookimpl
        def monarch_proc_setup(proc_name, rank):
            random.seed(1234 + rank)
    """


@hookspec
def monarch_telemetry_sinks() -> Sequence[TelemetrySink]:
    """Return sinks that receive telemetry events in batches.

    Called once per process when its kernel starts.  When no plugin returns
    a sink, telemetry costs nothing: no event is even recorded.  Events are
    buffered and handed to every sink's :meth:`TelemetrySink.emit` from a
    background task about once a second (and at shutdown).

    Complete example -- write spans as JSON lines::

        import json
        from monarch_core.hookspecs import TelemetrySink, hookimpl

        class JsonLines(TelemetrySink):
            def __init__(self): self._f = open("/tmp/monarch-spans.jsonl", "a")
            def emit(self, events):
                for e in events:
                    self._f.write(json.dumps({"kind": e.kind, "name": e.name,
                        "start_ns": e.start_ns, "duration_ns": e.duration_ns,
                        **dict(e.attributes)}) + "\\n")
                self._f.flush()
            def close(self): self._f.close()

        @hookimpl
        def monarch_telemetry_sinks():
            return [JsonLines()]
    """
