"""The allocator seam of the plugin contract: host schedulers.

A :class:`Scheduler` (described by the :class:`SchedulerSpec` s that
:func:`monarch_schedulers` yields) turns an :class:`AllocationRequest` into
worker loops, started as :class:`WorkerLaunch` says and found through
:func:`wait_worker_address`, and returns an :class:`Allocation` of
:class:`HostHandle` s.

Public through :mod:`monarch_core.hookspecs`; import from there.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Callable

from monarch_core._contract._common import _call_factory, hookspec
from monarch_core._workspace import Workspace

__all__ = [
    "Allocation",
    "AllocationRequest",
    "HostHandle",
    "Scheduler",
    "SchedulerSpec",
    "WORKER_READY_PREFIX",
    "WorkerLaunch",
    "monarch_schedulers",
    "wait_worker_address",
]


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
        host mesh's hosts (a slice passes only its own), and again by the
        core's ``auto_reload`` watcher after a change (then always with
        ``conda=False, auto_reload=False``).  Copy each directory into the
        host's working directory under its remote name, only what changed.
        With ``conda=True`` also ship the client's environment
        (:func:`~monarch_core._workspace.active_environment`: the active
        conda env, else the venv at ``sys.prefix``), e.g. into
        ``Environment.remote_root(<working dir>)``, only what changed.
        May block, or be an ``async def``.

        Return ``{host name: SyncedHost(paths=..., python=...)}``: ``paths``
        the host's directories of the workspace in its order, ``python`` the
        shipped environment's interpreter there (``None`` without
        ``conda``).  The core puts the paths first on the ``sys.path`` of the
        procs each host spawns *from now on* and starts them with that
        interpreter; procs already running are not touched (the core's
        ``auto_reload`` reloads their changed modules itself).  Returning
        ``None`` means you made the hosts' procs see the code yourself.

        Schedulers whose hosts see this machine's filesystem (``local``)
        copy nothing and return the local directories (``local=True``).
        This default raises ``NotImplementedError``; the core turns it into
        an error naming the scheduler.  Raise ``NotImplementedError`` naming
        ``conda=True`` if you cannot ship an environment,
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
    def allocate(self, request: AllocationRequest, launch: WorkerLaunch) -> Allocation | Awaitable[Allocation]:
        """Start the worker loops and return their addresses (see the class
        docstring; may block, or be ``async def``: then what it returns is
        awaited)."""


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
                        p = subprocess.Popen(launch.command("127.0.0.1"),
                                             env=launch.environment(host="127.0.0.1"),
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
