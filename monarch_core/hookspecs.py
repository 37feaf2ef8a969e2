"""The plugin contract of monarch-core: pluggy hookspecs for five seams.

This module, together with the public types it names, is the *only* thing a
plugin imports from monarch-core.  Five families of hooks:

* **transport** -- :func:`monarch_transports` yields :class:`TransportSpec`
  descriptions of byte-stream channels (``ipc``, ``tcp``, ``tls`` ...).
* **allocator** -- :func:`monarch_schedulers` yields :class:`SchedulerSpec`
  descriptions of host schedulers (``local``, ``ssh``, ``slurm`` ...); a
  :class:`Scheduler` starts worker loops as :class:`WorkerLaunch` says and
  returns an :class:`Allocation`; ``monarch_core.testing.check_scheduler``
  is its conformance kit.
* **bootstrap** -- :func:`monarch_proc_env` adjusts the environment of a proc
  about to start; :func:`monarch_proc_setup` runs inside each new proc before
  any actor.
* **telemetry** -- :func:`monarch_telemetry_sinks` yields sinks that receive,
  in the client, batches of :class:`TelemetryEvent` (spans, endpoint metrics,
  lifecycle events) recorded in every process of the program.
* **data plane** -- :func:`monarch_rdma_backends` yields :class:`RDMABackendSpec`
  descriptions of one-sided memory transfer paths (``ibverbs``,
  ``process_vm`` ...) behind ``monarch_core.rdma.RDMABuffer``; an
  :class:`RDMABackend` is resolved once per process, its
  :class:`RDMAConnection` once per peer proc.

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
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import pluggy

from monarch_core._workspace import Workspace

__all__ = [
    "PROJECT_NAME",
    "Allocation",
    "MemoryRegion",
    "RDMABackend",
    "RDMABackendSpec",
    "RDMAConnection",
    "RDMAPeer",
    "RemoteRegion",
    "AllocationRequest",
    "HostHandle",
    "Listener",
    "SESSION_CREDENTIALS",
    "Scheduler",
    "SchedulerSpec",
    "Stream",
    "TelemetryEvent",
    "TRUST_ALL",
    "TelemetrySink",
    "Transport",
    "TransportSpec",
    "WORKER_READY_PREFIX",
    "WorkerLaunch",
    "Workspace",
    "hookimpl",
    "hookspec",
    "monarch_proc_env",
    "monarch_proc_setup",
    "monarch_rdma_backends",
    "monarch_schedulers",
    "monarch_telemetry_sinks",
    "monarch_transports",
    "wait_worker_address",
]

PROJECT_NAME = "monarch"

#: Decorator for hook *specifications* (used by this module only).
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
#: Decorator for hook *implementations*: plugins mark their functions with it.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

#: The ``ca=`` value that means "authenticate nobody" (the reference API's);
#: :meth:`Transport.set_credentials` of a transport without authentication
#: accepts it, one that authenticates refuses it.
TRUST_ALL = "trust_all_connections"

#: The ``ca=`` value that asks an authenticating transport for *session*
#: credentials, unless the user configured credentials of their own: a
#: short-lived CA in this process's memory that signs this process's
#: certificate and, through :meth:`Transport.worker_credentials`, one for each
#: worker loop a scheduler starts.  The core passes it before the client's
#: runtime starts when a scheduler that declares :attr:`Scheduler.transport`
#: allocates hosts.  A transport without authentication ignores it.
SESSION_CREDENTIALS = "session"


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

    def raw_socket(self) -> socket.socket | None:
        """The connected, non-blocking stdlib socket under this stream, for
        the kernel's fast path -- or ``None`` (the default).

        Optional.  Return a socket only when the bytes on it *are* the
        stream's bytes (no framing, compression or encryption of the
        stream's own) and the kernel may therefore read and write it
        directly, from other threads, bypassing :meth:`send_all` and
        :meth:`receive_into` for large messages.  Called once per
        connection, after the handshake.  A TLS or compressing stream
        returns ``None``.
        """
        return None


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
        """Dial ``address`` (``ConnectError`` naming it on failure).

        When the peer's machine answers that nothing listens there
        (``ECONNREFUSED``, a missing Unix socket), raise
        ``ConnectError(..., refused=True)``: a few refusals after a
        connection broke tell the kernel that the proc is gone, not merely
        unreachable (which retries until the delivery timeout)."""

    def set_credentials(self, *, ca: str | None = None, cert: str | None = None, key: str | None = None) -> None:
        """Use these credentials in this process (optional).

        The core calls it with what the user passed to
        ``attach_to_workers(ca=, private_key=, cert=)`` or
        ``run_worker_loop_forever(...)`` (``--ca/--key/--cert``), before the
        transport listens or dials; each value is a file path or inline PEM,
        or ``None`` (not given: keep the transport's own default source,
        e.g. environment variables).  Raise ``ValueError``/``TypeError``/
        ``FileNotFoundError`` naming the bad argument.  The default accepts
        no credentials: it allows only ``ca="trust_all_connections"`` (the
        reference API's "no authentication") and ``ca=SESSION_CREDENTIALS``
        (nothing to make), and raises ``ValueError`` otherwise.

        ``ca=SESSION_CREDENTIALS`` (:data:`SESSION_CREDENTIALS`): make
        credentials for this session if none are configured (``tls`` does,
        see ``docs/transports.md``); configured ones win.
        """
        if cert is None and key is None and ca in (None, TRUST_ALL, SESSION_CREDENTIALS):
            return
        raise ValueError(
            f"the {self.name or type(self).__name__} transport takes no credentials (ca=, private_key=, cert=); "
            "use a transport that authenticates, such as tls://"
        )

    def child_env(self, *, portable: bool = False) -> Mapping[str, str]:
        """Environment variables a process started by this one needs to use
        this transport as this process does, e.g. its credentials (optional;
        default: none).

        The core adds them to the environment of every proc this process
        starts (under the ``BootstrapCommand`` overrides and the
        ``monarch_proc_env`` results) and, with ``portable=True``, puts them
        in :attr:`WorkerLaunch.credentials` for the worker loops a scheduler
        starts, possibly on other hosts: then no value may name a file of
        this host (inline PEM instead).  The values hold secrets: never log
        them.
        """
        return {}

    def worker_credentials(self, host: str) -> Mapping[str, str]:
        """Environment variables for one worker loop that will listen on
        ``host`` (the name or address passed to :meth:`WorkerLaunch.command`),
        possibly on another machine: what it needs to accept this process
        and be accepted by it (optional).

        The default is ``child_env(portable=True)``: every worker gets this
        process's own credentials.  ``tls`` with session credentials
        (:data:`SESSION_CREDENTIALS`) instead issues a key and certificate
        for that worker alone, valid for ``host``.  Schedulers call it through
        :meth:`WorkerLaunch.credentials_for`.  The values hold secrets: pass
        them over the scheduler's own channel (an SSH session's stdin, a file
        only the job's user can read), never on a command line.
        """
        return self.child_env(portable=True)


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

    ``address`` is the URL of the monarch worker loop
    (``python -m monarch_core.worker``) running on that host, which starts
    procs on request; it must use the client's transport (see
    :attr:`WorkerLaunch.scheme`).  ``name`` (unique within an allocation) and
    ``labels`` (e.g. ``{"rack": "r1", "node": "gpu-017"}``) appear in
    ``HostMesh.to_table()``, ``ProcMesh.to_table()`` and in failure reports.

    ``address=None`` (legacy) means "this machine, procs as children of the
    calling process"; it skips the readiness step.  New schedulers always
    start worker loops.
    """

    name: str
    address: str | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AllocationRequest:
    """What a scheduler is asked for.

    ``params`` are the scheduler's own parameters from the configuration entry
    (``monarch.toml``) or from explicit arguments; ``source`` says where they
    came from (a file path and table) so errors can name it.  When the
    scheduler declares :attr:`Scheduler.params`, ``params`` holds only those
    keys (see ``docs/configuration.md`` for the ``[defaults]`` policy).
    """

    name: str
    params: Mapping[str, Any]
    source: str = "<arguments>"


#: The line a worker loop prints on its standard output once it listens,
#: followed by the URL clients dial (with the port it bound when asked for
#: port 0): ``monarch worker loop listening on tcp://10.0.0.5:41237``.  It is
#: the handshake a scheduler reads to learn a worker's address
#: (:func:`wait_worker_address`); nothing else on that stream is part of the
#: contract.
WORKER_READY_PREFIX = "monarch worker loop listening on "


@dataclasses.dataclass(frozen=True)
class WorkerLaunch:
    """What the core hands :meth:`Scheduler.allocate`: how to start worker
    loops for this client, and how to report on them.

    The scheduler starts one worker loop per host *by its own means* (a local
    subprocess, an SSH exec, a Slurm step), running exactly
    :meth:`command` with the worker's credentials (:meth:`credentials_for`
    ``(host)``, or :meth:`environment` ``(host=...)``) in its environment, reads each worker's address from its readiness line
    (:func:`wait_worker_address`) and returns them in an :class:`Allocation`.
    The core then waits until every worker answers (the readiness step: the
    scheduler does not have to), and fails naming the hosts that did not.
    """

    #: Name of the client's enabled transport (``"ipc"``, ``"tcp"``, ``"tls"`` ...).
    transport: str
    #: URL scheme every worker address must use (the client's transport).
    scheme: str
    #: The client's Python; the default interpreter of :meth:`command`.
    python: str
    #: Environment variables that must reach every worker loop: the client
    #: transport's :meth:`Transport.child_env` ``(portable=True)`` (for
    #: ``tls``: ``MONARCH_TLS_CA``, ``MONARCH_TLS_CERT``, ``MONARCH_TLS_KEY``
    #: as inline PEM, so that they can travel over an SSH channel or a job
    #: script).  A scheduler that mints per-job certificates replaces these
    #: values.
    credentials: Mapping[str, str]
    #: Seconds the whole allocation may take (allocate, then readiness).
    timeout: float
    #: Call ``report_lost(host_name, reason)`` (any thread, any time until
    #: release) when a host is gone for good: its worker process exited, the
    #: SSH channel closed, the job step ended.  Each proc on that host then
    #: fails with a ``MeshFailure`` naming the host and ``reason``; procs on
    #: other hosts are not affected.
    report_lost: Callable[[str, str], None]
    #: Set when the core gives up on this allocation (timeout, Ctrl-C): a
    #: blocking ``allocate`` should check it and return or raise soon.  (An
    #: ``async def allocate`` is cancelled instead.)  Whatever it returns
    #: after that is released at once.
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: The client transport's :meth:`Transport.worker_credentials` (set by
    #: the core; schedulers call :meth:`credentials_for`).
    issue_credentials: Callable[[str], Mapping[str, str]] | None = dataclasses.field(default=None, repr=False)
    #: Where :meth:`report_notice` goes (set by the core).
    notice_sink: Callable[[str | None, str], None] | None = dataclasses.field(default=None, repr=False)

    def report_notice(self, host: str | None, message: str) -> None:
        """Tell the owner of the host mesh something it should act on before
        it becomes a failure (any thread, any time until release): ``"Slurm
        job 12 will reach its time limit in about 60 s"``.  ``host`` names
        the host it concerns, ``None`` the whole allocation.  Nothing fails:
        the owner's ``__supervise__`` (or, on the client, the
        ``unhandled_fault_hook``) gets a ``MeshFailure`` whose ``notice`` is
        true and whose ``report()`` is ``message``; one nobody handles is
        logged (WARNING), never fatal.  Report each event once."""
        if self.notice_sink is not None:
            self.notice_sink(host, str(message))

    def credentials_for(self, host: str) -> dict[str, str]:
        """The credentials one worker loop listening on ``host`` needs (the
        name or address given to :meth:`command`): with ``tls`` session
        credentials a key and certificate for that worker alone (valid for
        ``host`` and the addresses it resolves to here), otherwise
        :attr:`credentials`.  Secrets: never log them, never put them on a
        command line (``ps`` shows it to every user of the host)."""
        if self.issue_credentials is None:
            return dict(self.credentials)
        return dict(self.issue_credentials(host))

    def command(
        self,
        host: str = "127.0.0.1",
        *,
        python: str | None = None,
        port: int = 0,
        insecure_tcp: bool = False,
        exit_with_parent: bool = True,
    ) -> list[str]:
        """The argv that starts one worker loop listening on ``host``.

        ``[python, "-m", "monarch_core.worker", "--address",
        "<scheme>://<host>:<port>", "--exit-with-parent"]``.  With port 0
        (the default) the worker binds a free port and prints the real
        address in its readiness line.  ``ipc`` ignores ``host``/``port`` (a
        fresh abstract socket name).  Plain ``tcp`` on a non-loopback host
        needs ``insecure_tcp=True`` (which adds ``--insecure-tcp``).
        ``exit_with_parent``: the worker exits when the process that started
        it (the ssh session, the client, the step launcher) goes away.
        """
        py = python or self.python
        if self.scheme in ("ipc", "unix"):
            import uuid

            address = f"ipc://@monarch-worker-{uuid.uuid4().hex}"
        else:
            h = f"[{host}]" if ":" in host and not host.startswith("[") else host
            address = f"{self.scheme}://{h}:{int(port)}"
        argv = [py, "-m", "monarch_core.worker", "--address", address]
        if insecure_tcp:
            argv.append("--insecure-tcp")
        if exit_with_parent:
            argv.append("--exit-with-parent")
        return argv

    def environment(self, base: Mapping[str, str] | None = None, *, host: str | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) plus the worker's
        credentials: :meth:`credentials_for` ``(host)`` when ``host`` is
        given, else :attr:`credentials`."""
        import os

        env = dict(os.environ if base is None else base)
        env.update(self.credentials if host is None else self.credentials_for(host))
        return env

    def shell_command(self, host: str = "127.0.0.1", **kwargs: Any) -> str:
        """:meth:`command` as one POSIX shell line with the credentials
        exported before it (``env VAR=... python -m monarch_core.worker ...``),
        for an SSH exec or a job script.  It holds secrets: do not log it."""
        import shlex

        parts = ["env", *(f"{k}={v}" for k, v in self.credentials.items()), *self.command(host, **kwargs)]
        return " ".join(shlex.quote(p) for p in parts)


def wait_worker_address(stream: Any, timeout: float, *, host: str = "worker", forward: Any = None) -> str:
    """Read a worker loop's readiness line from ``stream`` and return its address.

    ``stream`` is the worker's standard output as a binary or text file
    object (``Popen.stdout``, a paramiko channel file ...).  Reads lines
    until one starts with :data:`WORKER_READY_PREFIX`; raises
    :class:`~monarch_core.errors.AllocationError` naming ``host`` (with the
    last lines it printed) if the stream ends first or ``timeout`` seconds
    pass.  Blocking: call it from ``allocate``, never on a trio loop.

    The rest of the output keeps flowing after the readiness line (procs the
    worker starts write to it): to ``forward`` (a binary file object, or an
    int file descriptor; default: this process's standard output, fd 1) from
    a daemon thread, so the worker never blocks on a full pipe.
    """
    import os
    import queue

    from monarch_core.errors import AllocationError

    lines: queue.Queue = queue.Queue()
    seen: list[str] = []

    def pump() -> None:
        found = False
        try:
            while True:
                raw = stream.readline()
                if not raw:
                    break
                if found:
                    data = raw if isinstance(raw, bytes) else raw.encode()
                    target = 1 if forward is None else forward
                    try:
                        if isinstance(target, int):
                            os.write(target, data)
                        else:
                            target.write(data)
                            target.flush()
                    except (OSError, ValueError):
                        pass
                    continue
                line = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
                if line.startswith(WORKER_READY_PREFIX):
                    found = True
                lines.put(line)
        except (OSError, ValueError):
            pass
        if not found:
            lines.put(None)

    threading.Thread(target=pump, name=f"monarch-worker-output-{host}", daemon=True).start()
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AllocationError(
                f"worker loop of host {host!r} printed no readiness line ({WORKER_READY_PREFIX}URL) within "
                f"{timeout:.0f}s" + _tail(seen)
            ) from None
        if line is None:
            raise AllocationError(
                f"worker loop of host {host!r} exited before it listened" + _tail(seen)
            )
        if line.startswith(WORKER_READY_PREFIX):
            return line[len(WORKER_READY_PREFIX):].strip()
        seen.append(line.rstrip("\n"))


def _tail(seen: list[str]) -> str:
    return ("; its last output:\n  " + "\n  ".join(seen[-8:])) if seen else ""


class Allocation(abc.ABC):
    """Hosts handed out by a scheduler, and how to give them back.

    ``hosts`` in row-major order of ``extent``; ``extent`` maps dimension
    names to sizes whose product is ``len(hosts)`` (``{"hosts": 4}``,
    ``{"racks": 2, "hosts": 2}``).  ``extent = None`` means
    ``{dim: len(hosts)}`` (``dim`` is kept for older schedulers).
    """

    hosts: Sequence[HostHandle] = ()
    extent: Mapping[str, int] | None = None
    #: Dimension label of a one-dimensional host mesh (when ``extent`` is None).
    dim: str = "hosts"

    def release(self) -> Any:
        """Give the hosts back: stop the worker loops, end the job.

        Called exactly once by the core, off the kernel loop, with a timeout
        (``MONARCH_RELEASE_TIMEOUT``, default 30 s): on ``HostMesh.shutdown()``,
        when the allocation or its readiness step fails, and at every exit of
        the client a Python process can run code in (normal exit, an
        unhandled supervision failure, ``shutdown_context()``, SIGTERM).
        ``HostMesh.stop()`` does *not* release: it stops the procs and keeps
        the worker loops for the next ``spawn_procs``.  May block, or be an
        ``async def`` (run in a trio loop of its own).  Must not raise for
        hosts that are already gone."""
        return None

    def detach(self) -> Any:
        """Called *instead of* :meth:`release` when the client ends while
        its host mesh is stopped (``HostMesh.stop()`` was the last thing done
        to it, not ``shutdown()``): the core has told the worker loops to
        exit; an allocation that can outlive its client (a batch job) ends
        what is left of this client's workers and keeps the hosts, so that a
        later client can allocate them again (the spec's *persistent
        allocations*).  Same conditions as :meth:`release` (once, off the
        loop, with a timeout).  The default is :meth:`release`."""
        return self.release()

    def sync_workspace(
        self, workspace: Workspace, hosts: Sequence[str], *, conda: bool = False, auto_reload: bool = False
    ) -> Any:
        """Copy ``workspace`` (a :class:`Workspace`: local directories and
        their remote names) to the hosts named ``hosts`` (optional).

        Called by ``HostMesh.sync_workspace`` (spec: "sync local code changes
        to the remote hosts"), off the kernel loop, with the names of the
        host mesh's hosts (a slice passes only its own).  Copy each directory
        into the host's working directory under its remote name, only what
        changed, and make the procs that host starts *from now on* import it
        (the remote directories on their ``PYTHONPATH``); procs already
        running are not touched.  May block, or be an ``async def``.

        Schedulers whose hosts see this machine's filesystem (``local``)
        return ``None``: there is nothing to copy.  This default raises
        ``NotImplementedError``; the core turns it into an error naming the
        scheduler.  Raise ``NotImplementedError`` naming the option for
        ``conda=True`` / ``auto_reload=True`` if you do not support them,
        ``AllocationError`` naming the host for a copy that failed."""
        raise NotImplementedError


class Scheduler(abc.ABC):
    """Turns an :class:`AllocationRequest` into running, answering worker loops.

    Contract, in the order the core calls it (``hosts_from_config``):

    0. :attr:`transport` / :meth:`client_address` -- when the client has not
       enabled a transport yet, the core enables the scheduler's.
    1. :meth:`validate` -- on the caller's thread; raise ``ConfigError``.
    2. :meth:`allocate` -- on a thread of its own, never on the kernel's trio
       loop, so it may block (``subprocess``, ``time.sleep``, a blocking SSH
       library) or be an ``async def`` (run by ``trio.run`` on that thread).
       It starts one worker loop per host, running
       ``launch.command(host)`` with ``launch.credentials_for(host)`` in its
       environment, and returns an :class:`Allocation` of their addresses.
       It may raise :class:`~monarch_core.errors.AllocationError` (or
       ``ConfigError``); any other exception becomes an ``AllocationError``
       naming the scheduler.  It must release what it started before
       raising.  The core gives up after ``launch.timeout`` seconds (sets
       ``launch.cancelled``, cancels an async ``allocate``, releases a late
       result) and raises ``AllocationError``.
    3. readiness -- the core, not the scheduler: every worker must answer
       within what is left of ``launch.timeout``, else ``AllocationError``
       naming the hosts that did not, and the allocation is released.
    4. while in use -- ``launch.report_lost(host, reason)`` for a host that is
       gone; ``launch.report_notice(host, message)`` for what the owner
       should hear before it happens (a job about to end).
    5. :meth:`Allocation.release` -- see there (or :meth:`Allocation.detach`
       when the client ends with its host mesh stopped).

    (Schedulers written for the first contract, ``async def allocate(self,
    request)``, still work: the core passes ``launch`` only to an
    ``allocate`` that takes it.)
    """

    name: str = ""
    #: The transport this scheduler's hosts need (``"tls"`` for hosts on
    #: other machines), or ``None`` (whatever the client enabled).  When the
    #: client has not enabled a transport yet, ``hosts_from_config`` enables
    #: this one, at :meth:`client_address` if that gives one, and asks it for
    #: session credentials (:data:`SESSION_CREDENTIALS`) unless the user
    #: configured their own.  A client already running on a transport that
    #: cannot leave this machine (``ipc``) gets a ``ConfigError`` saying to
    #: call ``enable_transport`` first.
    transport: str | None = None
    #: The configuration keys this scheduler accepts.  When set, ``validate``
    #: and ``allocate`` see only these keys: an entry's own key outside it is
    #: a ``ConfigError`` naming it, a ``[defaults]`` key outside it is left
    #: out (logged at DEBUG).  ``None``: every key, the scheduler checks them.
    params: frozenset[str] | None = None

    def validate(self, request: AllocationRequest) -> None:
        """Raise :class:`~monarch_core.errors.ConfigError` naming
        ``request.source`` when the parameters are wrong.  Called before
        :meth:`allocate`."""

    def client_address(self, request: AllocationRequest) -> str | None:
        """The URL the client should listen on so that this request's hosts
        can reach it (e.g. ``"tls://10.1.2.3:0"``: the local address of a
        route to the first host), or ``None`` for the transport's default.
        Called on the caller's thread, before :meth:`allocate`, only when the
        core enables :attr:`transport` itself; keep it quick (no connection
        that waits longer than a connect timeout)."""
        return None

    @abc.abstractmethod
    def allocate(self, request: AllocationRequest, launch: WorkerLaunch) -> Allocation:
        """Start the worker loops and return their addresses (see the class
        docstring; may block, or be ``async def``)."""


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
    """One telemetry record, as a sink receives it (in the client).

    Every event's ``attributes`` say where it was recorded: ``proc`` (the proc
    id; ``client-...`` for the client), ``proc_name`` (``procs0{'gpus': 1/4}``,
    ``client``), ``host`` and ``pid``.  Then, by ``kind``:

    ``"span"`` -- a finished span: ``name`` (``<mesh>.<endpoint>`` for a call,
    the function's name for ``@traced``), ``start_ns`` (wall clock, ns since the
    epoch), ``duration_ns``; attributes ``trace_id`` (32 hex digits),
    ``span_id`` and ``parent_id`` (16 hex digits; ``parent_id`` ``None`` at a
    trace's root), ``span_kind`` (``"client"``: the caller's side of one
    adverb call, from the send to the reply; ``"server"``: one endpoint
    invocation in the actor's proc, the child of its client span;
    ``"internal"``: a ``@traced`` function), ``thread`` (the actor's display
    name, or the client thread's name), ``error`` (the exception's type name,
    only when it raised); for calls also ``mesh``, ``endpoint``, ``rank`` (and
    ``adverb`` on the client side, ``actor_id`` on the server side).

    ``"metric"`` -- the running totals of one endpoint from one side, sent
    each interval in which they changed (cumulative since the process
    started: the latest one supersedes the earlier): ``name`` ``"endpoint"``,
    ``start_ns`` when they were read; attributes ``side`` (``"client"`` /
    ``"server"``), ``mesh``, ``mesh_key``, ``endpoint``, ``rank``, ``adverb``,
    ``calls``, ``errors`` (type name -> count), ``request_bytes``,
    ``reply_bytes``, ``latency_count``, ``latency_sum_ns``,
    ``latency_min_ns``, ``latency_max_ns``, ``latency_p50_ns``,
    ``latency_p99_ns`` and ``latency_buckets`` (see
    :class:`monarch_core.telemetry.EndpointMetrics`).

    ``"lifecycle"`` -- a lifecycle or supervision event: ``name`` one of
    ``monarch_core.telemetry.LIFECYCLE`` (``proc.failed``,
    ``supervision.event`` ...), ``start_ns`` when it happened,
    ``duration_ns`` 0, the attributes that table lists for it.
    """

    kind: str
    name: str
    start_ns: int
    duration_ns: int = 0
    attributes: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class TelemetrySink(abc.ABC):
    """Receives telemetry in the client, in batches, from the telemetry thread
    (about once per ``MONARCH_TELEMETRY_INTERVAL``, and at shutdown), never
    per call.

    ``kinds`` names the event kinds the sink wants (a subset of ``"span"``,
    ``"metric"``, ``"lifecycle"``; default all three).  A sink that wants
    ``"span"`` turns on tracing of every call while it is installed: leave it
    out of ``kinds`` if the sink does not use spans, and calls stay untraced.
    """

    kinds: frozenset[str] = frozenset({"span", "metric", "lifecycle"})

    @abc.abstractmethod
    def emit(self, events: Sequence[TelemetryEvent]) -> None:
        """Handle a batch (events of the kinds in ``kinds``).  Must not block
        for long; exceptions are logged and the sink is kept."""

    def close(self) -> None:
        """Flush and release resources (the client's shutdown, or
        ``monarch_core.telemetry.remove_sink``)."""


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

    Complete example -- a transport over Unix sockets in a directory (it
    passes ``monarch_core.testing.check_transport``; the project's tests run
    this code)::

        # my_transport/plugin.py
        import errno, os, uuid
        import trio
        from monarch_core.hookspecs import (
            Listener, Stream, Transport, TransportSpec, hookimpl)
        from monarch_core.errors import ConnectError, ConnectionClosed, TransportError

        _BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)

        class _S(Stream):
            def __init__(self, s, peer): self._s, self.peer = s, peer
            async def send_all(self, data):
                try: await self._s.send_all(data)
                except _BROKEN as e: raise ConnectionClosed(f"{self.peer}: {e}") from None
            async def receive_some(self, max_bytes=65536):
                try: return await self._s.receive_some(max_bytes)
                except _BROKEN as e: raise ConnectionClosed(f"{self.peer}: {e}") from None
            async def aclose(self): await self._s.aclose()

        class _L(Listener):
            def __init__(self, lst, address, path):
                self._l, self.address, self._path = lst, address, path
            async def accept(self):
                try: return _S(await self._l.accept(), f"client of {self.address}")
                except _BROKEN as e: raise TransportError(f"{self.address}: {e}") from None
            async def aclose(self):
                path, self._path = self._path, None
                if path is not None:
                    try: os.unlink(path)          # leave no socket file behind
                    except OSError: pass
                await self._l.aclose()

        class DirTransport(Transport):
            name = "dir"
            def default_bind_spec(self):
                return f"dir:///tmp/monarch-{uuid.uuid4().hex}"
            def normalize(self, url):
                if not url.startswith("dir:///") or "\\0" in url:
                    raise ValueError(f"malformed dir address {url!r}; expected dir:///absolute/path")
                return url
            async def listen(self, spec):
                path = self.normalize(spec)[len("dir://"):]
                sock = trio.socket.socket(trio.socket.AF_UNIX)
                try:
                    await sock.bind(path); sock.listen()
                except OSError as e:
                    sock.close()
                    raise TransportError(f"cannot listen on {spec}: {e}") from None
                return _L(trio.SocketListener(sock), spec, path)
            async def connect(self, address):
                path = self.normalize(address)[len("dir://"):]
                try: return _S(await trio.open_unix_socket(path), address)
                except OSError as e:  # refused: nothing listens there (the kernel counts these)
                    raise ConnectError(f"cannot connect to {address}: {e}",
                                       refused=e.errno in (errno.ECONNREFUSED, errno.ENOENT)) from None

        @hookimpl
        def monarch_transports():
            return [TransportSpec(name="dir", schemes=("dir",),
                                  factory="my_transport.plugin:DirTransport",
                                  description="Unix sockets in a directory")]

    and in ``pyproject.toml``::

        [project.entry-points.monarch]
        dir = "my_transport.plugin"

    after which ``enable_transport("dir")`` and ``enable_transport("dir:///tmp/x")``
    select it.  Test it with the conformance kit::

        import trio
        from monarch_core.testing import check_transport
        from my_transport.plugin import DirTransport

        def test_dir_transport_conforms():
            trio.run(check_transport, DirTransport())

    ``docs/plugin-authors.md`` (section "A transport") states the rest of
    the contract: ``child_bind_spec``, ``ConnectError(refused=True)``,
    cancellation and concurrency of ``send_all``, and the
    :meth:`Stream.raw_socket` fast path.
    """


@hookspec
def monarch_schedulers() -> Sequence[SchedulerSpec]:
    """Describe the host schedulers (allocators) this plugin provides.

    Called once, when ``hosts_from_config(name)`` first needs a scheduler or
    ``monarch plugins`` lists them.  Return a sequence of
    :class:`SchedulerSpec`; every plugin's results are collected and the first
    registration of a name wins.  The configuration entry's ``scheduler = "..."``
    picks one by name.

    The contract of the objects it returns is :class:`Scheduler`'s docstring
    (and ``docs/plugin-authors.md``): ``allocate`` runs on its own thread,
    starts one worker loop per host with ``launch.command(host)`` and
    ``launch.credentials_for(host)``, reads each address from the readiness line; the
    core waits for the workers, turns ``launch.report_lost`` into failures of
    that host's procs, and calls ``Allocation.release()`` once.

    Complete example -- a scheduler that hands out N hosts on this machine,
    each running its own worker loop (the project's tests run this code
    through ``monarch_core.testing.check_scheduler``)::

        # my_sched/plugin.py
        import subprocess, threading
        from monarch_core.hookspecs import (
            Allocation, HostHandle, Scheduler, SchedulerSpec, hookimpl, wait_worker_address)
        from monarch_core.errors import ConfigError

        class _Alloc(Allocation):
            def __init__(self, n):
                self.procs, self.hosts, self.extent = [], [], {"hosts": n}
                self.done = threading.Event()
            def release(self):
                self.done.set()
                for p in self.procs:
                    p.kill()
                    p.wait()

        class LoopbackWorkers(Scheduler):
            name = "loopback"
            params = frozenset({"hosts"})
            def validate(self, request):
                n = request.params.get("hosts")
                if not isinstance(n, int) or n < 1:
                    raise ConfigError(f"{request.source}: 'hosts' must be an int >= 1")
            def allocate(self, request, launch):       # blocking is fine: not the kernel's loop
                alloc = _Alloc(request.params["hosts"])
                try:
                    for i in range(request.params["hosts"]):
                        p = subprocess.Popen(launch.command("127.0.0.1"), env=launch.environment(),
                                             stdout=subprocess.PIPE)
                        alloc.procs.append(p)
                        url = wait_worker_address(p.stdout, launch.timeout, host=f"host{i}")
                        alloc.hosts.append(HostHandle(name=f"host{i}", address=url,
                                                      labels={"pid": str(p.pid)}))
                        threading.Thread(target=_watch, args=(p, f"host{i}", alloc, launch),
                                         daemon=True).start()
                except BaseException:
                    alloc.release()
                    raise
                return alloc

        def _watch(p, name, alloc, launch):
            p.wait()
            if not alloc.done.is_set():
                launch.report_lost(name, f"worker pid {p.pid} exited")

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
    """Return sinks that receive the program's telemetry in batches.

    Called once, in the client (the root process), when its runtime starts
    (the first mesh); procs never call it.  Every proc aggregates its endpoint
    metrics and buffers its spans and lifecycle events, and ships them to the
    client in one message per ``MONARCH_TELEMETRY_INTERVAL`` (1 s), when it
    stops, and when the client asks (``monarch_core.telemetry.flush``); the
    client's telemetry thread hands them, with its own, to every sink's
    :meth:`TelemetrySink.emit` -- the kinds it names in
    :attr:`TelemetrySink.kinds`, as :class:`TelemetryEvent` s described there.
    Return a sequence of sinks (empty: none).  ``MONARCH_TELEMETRY=0`` records
    nothing at all, and the hook is not called.

    Complete example -- count events per kind and write each span's name and
    duration as a JSON line (the project's tests run this code)::

        import collections, json, os
        from monarch_core.hookspecs import TelemetrySink, hookimpl

        class SpanLines(TelemetrySink):
            kinds = frozenset({"span", "metric", "lifecycle"})

            def __init__(self, path):
                self.counts = collections.Counter()
                self._f = open(path, "a")

            def emit(self, events):
                for e in events:
                    self.counts[e.kind] += 1
                    if e.kind == "span":
                        self._f.write(json.dumps({"name": e.name, "ms": e.duration_ns / 1e6,
                                                  "parent": e.attributes["parent_id"],
                                                  "proc": e.attributes["proc_name"]}) + "\\n")
                self._f.flush()

            def close(self):
                self._f.close()

        @hookimpl
        def monarch_telemetry_sinks():
            path = os.environ.get("SPAN_LINES")
            return [SpanLines(path)] if path else []

    with ``[project.entry-points.monarch] span_lines = "span_lines.plugin"``
    in its ``pyproject.toml``.  ``monarch_core.telemetry.add_sink(sink)``
    installs a sink from Python instead; ``monarch-telemetry-otel`` is a sink
    plugin that exports spans and metrics through the OpenTelemetry SDK.
    """


# --------------------------------------------------------------------------
# data plane: one-sided memory transfers (``monarch_core.rdma``)
#
# A *backend* moves bytes between a buffer registered in one proc (its owner)
# and memory in another proc (the holder of an ``RDMABuffer`` handle), ideally
# without the owner's participation.  The core resolves the installed
# backends once per process (the hook below is called once), asks each one
# to register every buffer created in that process (``register``), and, in a
# holder, connects to each owner proc once (``connect``) and caches the
# connections in preference order: a transfer is then a plain method call on
# the first cached connection whose backend registered that buffer.  No
# pluggy call happens per transfer.
#
# Preference order (highest first; ``RDMABackendSpec.preference``):
#
#   ibverbs      100   monarch-transport-rdma: RDMA READ/WRITE over an RC queue pair
#   process_vm    50   monarch-transport-rdma: process_vm_readv/writev, same host only
#   channel        0   built in: chunked requests over the proc's session, served by
#                      the owner's proc (never its actor thread); always reachable
#
# ``MONARCH_RDMA_BACKEND=<name>`` forces one (``auto``, the default, takes
# the order above).  Backends raise only :class:`~monarch_core.errors.RDMAError`
# (or ``SupervisionError`` when the owner proc is gone, ``TimeoutError`` when a
# transfer passes its deadline); map ``OSError`` and library errors yourself.
#
# Everything a backend puts in a handle (``announce``, ``register``) or sends
# through ``exchange`` is plain data: ``marshal``-able values only (None, bool,
# int, float, str, bytes, and tuples/lists/dicts of them).


@dataclasses.dataclass(frozen=True)
class MemoryRegion:
    """Memory an owner registers (:meth:`RDMABackend.register`), or local
    memory a transfer reads into or writes from.

    ``addr`` is the address of the first byte in this process (a device
    pointer when ``device`` is not ``"cpu"``, e.g. ``"cuda:0"``); the core
    keeps the memory alive while it is registered.  ``writable`` is False for
    read-only memory (``bytes``): backends must refuse remote writes to it.
    """

    addr: int
    nbytes: int
    device: str = "cpu"
    writable: bool = True


@dataclasses.dataclass(frozen=True)
class RDMAPeer:
    """An owner proc, as a holder's handle describes it (:meth:`RDMABackend.connect`).

    ``host`` identifies the machine and pid namespace the owner runs in (two
    procs with the same ``host`` can name each other's pids); ``pid`` is its
    process id; ``announce`` is what this backend's :meth:`RDMABackend.announce`
    returned in the owner proc (``{}`` if the backend is not installed there).
    """

    proc_id: str
    host: str
    pid: int
    announce: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class RemoteRegion:
    """One registered buffer of an owner proc, as a holder sees it.

    ``descriptor`` is what the backend's :meth:`RDMABackend.register` returned
    for it in the owner (an rkey and address, a pid and a liveness ticket
    ...).  ``name`` describes the buffer for error messages (id, size, owner).
    """

    addr: int
    nbytes: int
    device: str
    writable: bool
    descriptor: Mapping[str, Any]
    name: str = "buffer"


class RDMAConnection(abc.ABC):
    """A holder's data path to one owner proc, made once by
    :meth:`RDMABackend.connect` and cached for the life of the process.

    Called from the core's transfer threads, never from the kernel loop, possibly
    from several threads at once (make it thread-safe).  Blocking is expected.
    ``offset`` is from the start of ``remote``; the core has checked that
    ``offset + nbytes <= remote.nbytes`` and that the local memory holds
    ``nbytes``.  Raise :class:`~monarch_core.errors.RDMAError` naming
    ``remote.name`` on failure (a dropped buffer, a refused access),
    ``SupervisionError`` when the owner proc is gone, ``TimeoutError`` past
    ``deadline`` (a ``time.monotonic()`` value).
    """

    @abc.abstractmethod
    def read(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        """Copy ``local.nbytes`` bytes of ``remote`` from ``offset`` into ``local`` (host memory)."""

    @abc.abstractmethod
    def write(self, remote: RemoteRegion, offset: int, local: MemoryRegion, deadline: float) -> None:
        """Copy ``local.nbytes`` bytes of ``local`` (host memory) into ``remote`` at ``offset``."""

    def close(self) -> None:
        """Release what the connection holds (queue pairs ...).  Idempotent."""


class RDMABackend(abc.ABC):
    """One way to move a buffer's bytes, resolved once per process.

    Owner side (the proc that creates an ``RDMABuffer``): :meth:`announce`
    once, :meth:`register` per buffer, :meth:`deregister` when it is dropped
    or its owner stops, :meth:`accept` for a holder's :meth:`connect`.
    Holder side: :meth:`reachable` and :meth:`connect` once per owner proc,
    then the connection's ``read``/``write`` per transfer.
    """

    #: Canonical name (``RDMABackendSpec.name``), what ``RDMABuffer.backend`` says.
    name: str = ""
    #: Whether the owner takes no part in a transfer (RDMA, ``process_vm_readv``).
    one_sided: bool = True

    def unavailable(self) -> str | None:
        """``None`` when the backend can work in this process, else why not,
        with the fix (``"pyverbs is not installed: apt install python3-pyverbs"``).
        Called once per process; must be quick and must not raise."""
        return None

    def announce(self) -> Mapping[str, Any]:
        """Plain data about this process that holders need to connect
        (``{"pid": ..., "gid": ...}``); put in every handle.  Called once."""
        return {}

    @abc.abstractmethod
    def register(self, region: MemoryRegion) -> Mapping[str, Any] | None:
        """Make ``region`` reachable through this backend; return the plain
        data holders need to address it (it travels in the handle), or
        ``None`` when this backend cannot serve such memory (device memory,
        say).  Raise ``RDMAError`` on failure (the buffer is then served by
        the other backends)."""

    def deregister(self, region: MemoryRegion, descriptor: Mapping[str, Any]) -> None:
        """Make the region unreachable at once (later transfers must fail).
        The core keeps the memory alive a short grace period after this
        (``MONARCH_RDMA_RELEASE_GRACE``) for transfers already under way."""

    def reachable(self, peer: RDMAPeer) -> str | None:
        """``None`` when this process can try :meth:`connect` to ``peer``,
        else why not (``"pid 123 is on another host"``).  Quick, no I/O."""
        return None

    @abc.abstractmethod
    def connect(self, peer: RDMAPeer, exchange: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> RDMAConnection:
        """Make the data path to ``peer`` (once per owner proc, cached).

        ``exchange(request)`` delivers plain data to this backend's
        :meth:`accept` in the owner proc and returns its answer (a queue
        pair's number and address, say); it raises ``RDMAError`` /
        ``SupervisionError`` / ``TimeoutError``.  Raise ``RDMAError`` saying
        why when the peer cannot be reached this way (``process_vm_readv`` is
        refused by ptrace policy ...): the core then uses the next backend.
        Raise ``SupervisionError`` when the peer's process is gone."""

    def accept(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        """Owner side of a holder's ``exchange`` (on the owner proc's RDMA
        service thread, not an actor's).  Default: refuse."""
        from monarch_core.errors import RDMAError

        raise RDMAError(f"the {self.name or type(self).__name__} backend takes no connection requests")


@dataclasses.dataclass(frozen=True)
class RDMABackendSpec:
    """What :func:`monarch_rdma_backends` returns.  ``factory``: a callable or a
    lazily imported ``"module:attr"`` (heavy libraries such as ``pyverbs`` are
    imported by the backend itself, inside ``unavailable``/``register``, not
    here).  ``preference``: higher is tried first (see the section comment)."""

    name: str
    factory: Callable[[], RDMABackend] | str
    preference: int = 10
    description: str = ""

    def load(self) -> RDMABackend:
        """Import (if needed) and call the factory."""
        return _call_factory(self.factory)


@hookspec
def monarch_rdma_backends() -> Sequence[RDMABackendSpec]:
    """Describe the one-sided data paths (RDMA backends) this plugin provides.

    Called once per process, the first time an ``RDMABuffer`` is created or
    used there (or ``get_rdma_backend()`` asks).  Every plugin's results are
    collected; a name given twice goes to the first registration (built-ins,
    then entry points in name order).  The core orders the backends by
    ``preference`` (highest first), drops those whose
    :meth:`RDMABackend.unavailable` gives a reason (logged at DEBUG), and per
    owner proc keeps the first ones that :meth:`RDMABackend.connect`;
    ``MONARCH_RDMA_BACKEND`` forces one by name.

    Complete example -- a backend for buffers of one process only (what the
    core's tests run; a real one reaches other processes)::

        import ctypes, os
        from monarch_core.errors import RDMAError
        from monarch_core.hookspecs import (
            RDMABackend, RDMABackendSpec, RDMAConnection, hookimpl)

        class _Copy(RDMAConnection):
            def read(self, remote, offset, local, deadline):
                ctypes.memmove(local.addr, remote.addr + offset, local.nbytes)
            def write(self, remote, offset, local, deadline):
                if not remote.writable:
                    raise RDMAError(f"{remote.name} is read-only")
                ctypes.memmove(remote.addr + offset, local.addr, local.nbytes)

        class SameProcess(RDMABackend):
            name = "same_process"
            def announce(self):
                return {"pid": os.getpid()}
            def register(self, region):
                return {} if region.device == "cpu" else None
            def reachable(self, peer):
                return None if peer.announce.get("pid") == os.getpid() else "another process"
            def connect(self, peer, exchange):
                return _Copy()

        @hookimpl
        def monarch_rdma_backends():
            return [RDMABackendSpec("same_process", SameProcess, preference=200,
                                    description="memmove within one process")]

    See ``docs/rdma.md`` for what the project's backends need and do.
    """
