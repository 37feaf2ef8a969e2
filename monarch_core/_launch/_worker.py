"""The worker-loop side of launching: a host's worker loop starts procs for remote clients.

``python -m monarch_core.worker`` (the public façade, :mod:`monarch_core.worker`)
runs :func:`run_worker_loop_forever`: a kernel whose agent is a
:class:`WorkerLoopAgent`.  It answers ``host_hello`` (readiness: hostname,
pid, address), starts the :class:`~._spec.ProcSpec` s of ``host_spawn`` --
forked from its fork server (a zygote it starts with itself, so a host's procs
start in parallel from a warm parent), or exec'd as its own children -- and
heartbeats them, tells the client when one ends (``proc_died``), kills a client's procs
when that client goes away -- its session fails, or it sent no heartbeat for
longer than ``MONARCH_DELIVERY_TIMEOUT`` (then a worker loop started for an
allocation, ``--exit-with-parent``, also exits: nobody will use it again) --
signals procs on ``host_kill`` and exits on ``host_shutdown``.  When it listens it prints the readiness line
``monarch worker loop listening on URL`` on stdout (the handshake schedulers
read; see ``hookspecs.WORKER_READY_PREFIX``).
"""

from __future__ import annotations

import functools
import getpass
import ipaddress
import logging
import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

import trio

from monarch_core._proc import _serial
from monarch_core._proc._agent import ProcAgent
from monarch_core._proc._watch import HEARTBEAT_INTERVAL, HOST_HEARTBEAT_TIMEOUT
from monarch_core._proc._port import send_to_port
from monarch_core._proc import _control as C
from monarch_core._kernel import _wire as W
from monarch_core._launch._spawn import start_proc
from monarch_core._launch._spec import ProcSpec

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

logger = logging.getLogger("monarch.worker")

#: The line a worker loop prints on stdout once it listens (then the URL).
READY_PREFIX = "monarch worker loop listening on "

#: Seconds of silence after which a client has declared this host lost (its
#: host watch, ``ProcWatch``: ``MONARCH_HOST_HEARTBEAT_TIMEOUT``, at least three
#: heartbeat intervals), as this worker loop's settings say.
LOSS_DEADLINE: float = max(HOST_HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_INTERVAL)


class WorkerLoopAgent(ProcAgent):
    """The agent of a worker loop: a proc agent that also starts procs for clients."""

    def __init__(self, kernel: Kernel, child_bind_spec: str | None = None) -> None:
        super().__init__(kernel)
        self.is_host = True
        self.child_bind_spec = child_bind_spec  # where its procs bind (None: the transport's default)
        self.client_procs: dict[str, set[str]] = {}  # client proc id -> procs started for it
        self.proc_spawner: dict[str, tuple] = {}  # proc id -> (client proc id, address)
        #: client proc id -> when its last heartbeat came (clients that heartbeat us)
        self.client_heard: dict[str, float] = {}
        #: client proc id -> seconds between its last two heartbeats (its interval, as seen here)
        self.client_gap: dict[str, float] = {}
        #: exit once the last heartbeating client is lost (a worker loop started for one allocation)
        self.exit_without_client = False
        #: the service id it was started with (``ID@scheme://...``), told to whoever attaches; None: none
        self.service_id: str | None = None
        #: client proc id -> (a heartbeat arriving after this counts, lost if none by then, the silence):
        #: clients silent for longer than they wait for a host, which may have declared this one lost
        self.client_recheck: dict[str, tuple[float, float, float]] = {}

    def control_handlers(self) -> dict[type, Callable[[Any, Any, list, str], None]]:
        return {
            **super().control_handlers(),
            C.HostHello: self._on_host_hello,
            C.HostSpawn: self._on_host_spawn,
            C.ChildHello: self._on_child_hello,
            C.HostKill: self._on_host_kill,
            C.HostShutdown: self._on_host_shutdown,
        }

    def _on_proc_failed(self, proc_id: str, reason: str, stopped: bool) -> None:
        self._host_proc_gone(proc_id, reason, stopped)
        super()._on_proc_failed(proc_id, reason, stopped)

    def _on_host_hello(self, m: C.HostHello, payload: Any, buffers: list, sender: str) -> None:
        import socket

        send_to_port(
            m.reply, -1, W.S_VALUE,
            {"hostname": socket.gethostname(), "pid": os.getpid(), "address": self.kernel.address,
             "service": self.service_id},
        )

    def _on_host_spawn(self, m: C.HostSpawn, payload: Any, buffers: list, sender: str) -> None:
        specs = _serial.loads(payload, buffers)
        if self.exit_without_client and HEARTBEAT_INTERVAL > 0 and sender not in self.client_heard:
            # A worker loop started for an allocation: its client's host mesh
            # heartbeats it from now on (HostMesh watches its hosts), so its
            # silence counts from its first spawn -- a client cut off before
            # its first heartbeat got through is lost like any other.
            self.client_heard[sender] = time.monotonic()
            self.watch.ensure_heartbeat()
        self.kernel.start_task(self._host_spawn, specs, sender)

    async def _host_spawn(self, specs: list, client: str) -> None:
        kernel = self.kernel

        async def start(spec: ProcSpec) -> None:
            try:
                assert kernel.address is not None  # (set once the kernel listens)
                bind = self.child_bind_spec or kernel.transport.child_bind_spec(kernel.address)
                await start_proc(kernel, spec, bind_spec=bind)
                self.watch_child(spec.proc_id)
            except Exception as e:
                msg = (
                    f"could not start {spec.describe} on {kernel.address} with "
                    f"{spec.argv_for_errors()!r}: {type(e).__name__}: {e}"
                )
                logger.error("%s", msg)
                kernel.proc_failed(spec.proc_id, msg)

        for spec in specs:
            self.proc_spawner[spec.proc_id] = tuple(spec.parent)
            self.client_procs.setdefault(client, set()).add(spec.proc_id)
        async with trio.open_nursery() as nursery:  # all at once, as on the client's own host
            for spec in specs:
                nursery.start_soon(start, spec)

    def _on_child_hello(self, m: C.ChildHello, payload: Any, buffers: list, sender: str) -> None:
        """A proc this worker loop started says where it listens (its hello
        goes to the client): from now on our heartbeats reach it."""
        proc_id, address = m
        if sender != proc_id or proc_id not in self.proc_spawner:
            logger.warning("child_hello for %r from %s, which is not a proc this worker loop started", proc_id, sender)
            return
        self.kernel.learn_address(proc_id, address)
        self.watch.heard_from(proc_id)  # it answered: the hung clock restarts now

    def _on_ping(self, m: C.Ping, payload: Any, buffers: list, sender: str) -> None:
        """A heartbeat: from a client (its host mesh watches us), it is that
        client's contact, whose absence :meth:`heartbeat_tick` acts on."""
        if sender not in self.proc_spawner and sender != self.kernel.proc_id and sender not in self.kernel.dead:
            now = time.monotonic()
            prev = self.client_heard.get(sender)
            recheck = self.client_recheck.get(sender)
            if prev is not None and now - prev > LOSS_DEADLINE:
                # the first of those queued while we did not run (or the link was down): not a fresh one
                self._recheck(sender, now, now - prev)
            elif recheck is not None and now >= recheck[0]:  # sent since we ran again: it still watches us
                del self.client_recheck[sender]
                logger.info("worker loop %s: client %s still heartbeats it", self.kernel.address, sender)
            if prev is not None and now - prev <= LOSS_DEADLINE:  # a silence is not its interval
                self.client_gap[sender] = now - prev
            self.client_heard[sender] = now
            self.watch.ensure_heartbeat()
        super()._on_ping(m, payload, buffers, sender)

    def heartbeat_tick(self, now: float, paused: float | None) -> None:
        """A client not heard from for longer than the delivery timeout is
        lost: its procs are killed (through its failure, :meth:`_host_proc_gone`)
        and, when it was the last one and this worker loop was started for an
        allocation, the worker loop exits.

        A client silent for longer than the loss deadline (how long a client
        waits for a host's heartbeat answer, ``MONARCH_HOST_HEARTBEAT_TIMEOUT``,
        at least three heartbeat intervals) -- because we did not run (stopped,
        then continued) or the link was down -- has declared this host lost
        and stopped heartbeating it, unless it did not run either (a
        suspended machine).  So it is rechecked at once
        (:meth:`_recheck`): a heartbeat sent after we heard from it again
        keeps it; none within three of its intervals, and it is lost as above
        -- a host thawed after it was declared lost ends its procs (and,
        started for an allocation, itself) within seconds, not a delivery
        timeout later.  After a pause every other client gets a full timeout
        again."""
        if paused is not None:
            for client, last in self.client_heard.items():
                if now - last > LOSS_DEADLINE:
                    self._recheck(client, now, now - last)
                self.client_heard[client] = now
            return
        lost = False
        for client, last in list(self.client_heard.items()):
            # never less than a few of its heartbeat intervals (a client may send them less often)
            limit = max(self.kernel.delivery_timeout, 3 * self.client_gap.get(client, HEARTBEAT_INTERVAL))
            gone = client in self.kernel.dead  # its session failed (undeliverable): already handled
            recheck = self.client_recheck.get(client)
            given_up = recheck is not None and now > recheck[1]
            if not gone and not given_up and now - last <= limit:
                continue
            del self.client_heard[client]
            self.client_gap.pop(client, None)
            self.client_recheck.pop(client, None)
            lost = True
            if not gone:
                why = (
                    f"its client {client} sent no heartbeat for {now - last:.0f}s (more than "
                    f"MONARCH_DELIVERY_TIMEOUT={self.kernel.delivery_timeout:g}s): the client is gone or cut off"
                )
                if given_up and recheck is not None:
                    why = (
                        f"its client {client} was not heard for {recheck[2]:.0f}s (this worker loop did not run, or "
                        f"the link was down), longer than a client waits for its host's heartbeat "
                        f"(MONARCH_HOST_HEARTBEAT_TIMEOUT={HOST_HEARTBEAT_TIMEOUT:g}s), and has sent no heartbeat "
                        "since: the client declared this host lost"
                    )
                # a client that ended with nothing left here (attached worker loops outlive clients) is no news
                level = logging.WARNING if self.client_procs.get(client) or self.exit_without_client else logging.INFO
                logger.log(level, "worker loop %s: %s", self.kernel.address, why)
                self.kernel.proc_failed(client, why)  # its procs are killed (_host_proc_gone)
        if lost and self.exit_without_client and not self.client_heard:
            logger.warning("worker loop %s was started for its lost client's allocation; exiting (killing its "
                           "procs)", self.kernel.address)
            self.exit()

    def _recheck(self, client: str, now: float, silence: float) -> None:
        """``client`` was silent for ``silence`` s, more than
        :data:`LOSS_DEADLINE`: unless a heartbeat it sends from now on arrives
        (one arriving a heartbeat interval from now: those queued during the
        silence are read at once) within three of its intervals,
        :meth:`heartbeat_tick` declares it lost."""
        window = 3 * max(self.client_gap.get(client, HEARTBEAT_INTERVAL), HEARTBEAT_INTERVAL)
        self.client_recheck[client] = (now + HEARTBEAT_INTERVAL, now + HEARTBEAT_INTERVAL + window, silence)
        logger.info(  # (a suspended machine does this too: the loss, if any, is the warning)
            "worker loop %s did not hear from client %s for %.0fs, more than a client waits for its host (%gs, "
            "MONARCH_HOST_HEARTBEAT_TIMEOUT): it may have declared this host lost; its procs end unless it "
            "heartbeats again within %.0fs", self.kernel.address, client, silence, LOSS_DEADLINE,
            HEARTBEAT_INTERVAL + window,
        )

    def _host_proc_gone(self, proc_id: str, reason: str, stopped: bool) -> None:
        spawner = self.proc_spawner.pop(proc_id, None)
        if spawner is not None:  # one of our children: tell whoever asked for it
            for procs in self.client_procs.values():
                procs.discard(proc_id)
            child = self.kernel.child(proc_id)
            if child is not None and child.returncode is None and not stopped:
                # declared failed without having exited (cut off from us): a proc
                # nobody can reach must not keep running
                self._kill(proc_id, child)
                reason = f"{reason}; its worker loop killed it"
            self.kernel.send(
                spawner[0], spawner[1], W.K_CONTROL, 0, C.encode(C.ProcDied(proc_id, reason, stopped)), b"", []
            )
            return
        started = self.client_procs.pop(proc_id, None)
        if started:  # a client went away: the work it started goes too
            logger.warning("client %s is gone (%s); killing the %d procs it started", proc_id, reason, len(started))
            for p in started:
                child = self.kernel.child(p)
                if child is not None:
                    self._kill(p, child)

    def _on_host_kill(self, m: C.HostKill, payload: Any, buffers: list, sender: str) -> None:
        sig_name = m.sig_name
        for p in m.proc_ids:
            child = self.kernel.child(p)
            if child is not None and sig_name in ("terminate", "kill"):
                self.kernel.expect_exit(p)  # asked for by its client (a stop): no failure to report
                getattr(child, sig_name)()

    def _on_host_shutdown(self, m: C.HostShutdown, payload: Any, buffers: list, sender: str) -> None:
        logger.info("worker loop %s shut down by %s", self.kernel.address, sender)
        self.kernel.ack_at_once()  # the client's release waits for this message's acknowledgement: now, not never
        self.exit()

    def exit(self) -> None:
        """End the worker loop, killing its procs."""
        self.kill_all_children()
        self.kernel.stop_loop()

    def kill_all_children(self) -> None:
        for p, entry in list(self.kernel.children().items()):
            if entry["proc"].returncode is None:
                self._kill(p, entry["proc"])

    def _kill(self, proc_id: str, child: Any) -> None:
        """SIGKILL a proc this worker loop started (its exit is then expected, not a failure)."""
        self.kernel.expect_exit(proc_id)
        child.kill()


#: ``ID@scheme://...``: a worker address carrying the worker's service id
#: (the reference's ``new_service_proc_id()``), which attaching checks
_SERVICE_ADDRESS = re.compile(r"^(?P<id>[A-Za-z0-9][A-Za-z0-9_.-]*)@(?P<address>[a-z][a-z0-9+.-]*://.+)$")


def split_service_id(address: str) -> tuple[str | None, str]:
    """``(service id, address)`` of ``ID@scheme://...``; ``(None, address)``
    for a plain address (the alias form ``tcp://PUBLIC:P@tcp://BIND:P`` is one:
    its left side is an address, not an id)."""
    m = _SERVICE_ADDRESS.match(address)
    if m is None:
        return None, address
    return m.group("id"), m.group("address")


def new_service_id() -> str:
    """A fresh service id for a worker loop (``ID@tls://host:port``): unique, URL-safe."""
    import secrets

    return f"service-{secrets.token_hex(8)}"


_HOSTPORT = re.compile(r"^(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^\[\]:/@]*)):(?:\d+|fd\d+)$")  # (fdN: an inherited socket)


def _tcp_host(url: str) -> str | None:
    """The host of ``tcp://HOST:PORT`` (or ``tcp://HOST:fdN``); ``None`` when it is not of that form."""
    if not url.startswith("tcp://"):
        return None
    m = _HOSTPORT.match(url[len("tcp://"):])
    if m is None:
        return None
    return m.group("v6") if m.group("v6") is not None else m.group("host")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _is_loopback(host: str) -> bool:
    """Only loopback literals and ``localhost`` (no name is looked up)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid
        return f"uid {os.getuid()}"


def _check_tcp_bind(address: str, insecure_tcp: bool) -> str | None:
    """Refuse a plain ``tcp://`` worker loop that would listen beyond
    loopback unless ``insecure_tcp`` (then warn).  Returns the bind spec of
    the procs it starts when they must stay on loopback too, else ``None``
    (the transport's default for children)."""
    if address.split("://", 1)[0] != "tcp":
        return None
    public, _, bind = address.rpartition("@")  # the alias form binds its right-hand side
    host = _tcp_host(bind)
    if host is None or (public and _tcp_host(public) is None):
        return None  # malformed: the transport's own error says how
    if _is_loopback(host):
        if public:  # advertise what the worker loop advertises (a tunnel's end, say)
            return f"tcp://{_url_host(_tcp_host(public) or host)}:0@tcp://{_url_host(host)}:0"
        return f"tcp://{_url_host(host)}:0"
    where = "every interface" if host in ("*", "0.0.0.0", "::") else repr(host)
    if not insecure_tcp:
        raise ValueError(
            f"refusing to start a worker loop on plain tcp at {address}: it would listen on {where}, not only "
            "on loopback, and tcp authenticates nobody: anyone who can reach a plain tcp worker port can run "
            f"arbitrary code on this host as {_user()}. Use tls:// with --ca/--key (ca=/private_key=), or pass "
            "--insecure-tcp (insecure_tcp=True) on a network you trust"
        )
    logger.warning(
        "INSECURE: worker loop on plain tcp at %s (listening on %s, --insecure-tcp/insecure_tcp=True): nothing is "
        "authenticated; anyone who can reach this port or its procs' ports can run arbitrary code on this host "
        "as %s. Use tls:// unless every host that can reach it is trusted.",
        address, where, _user(),
    )
    return None


def run_worker_loop_forever(
    address: str,
    ca: str | None = None,
    private_key: str | None = None,
    *,
    cert: str | None = None,
    insecure_tcp: bool = False,
    exit_with_parent: bool = False,
) -> None:
    """Serve as the worker loop of this host at ``address`` until shut down.

    ``ca``, ``private_key`` (and optionally ``cert``, when the key file does
    not also hold the certificate) configure TLS for ``tls://`` addresses:
    each is a file path or inline PEM, handed to the transport's
    ``set_credentials`` (for ``tls``: they override ``MONARCH_TLS_*``).
    ``ca="trust_all_connections"`` is accepted for plain ``tcp://`` only,
    where nothing is authenticated.

    Anyone who can reach a plain ``tcp://`` worker loop can run arbitrary
    code as this process's user, so a ``tcp`` address must bind loopback
    (``127.0.0.1``, ``::1``, ``localhost``; its procs then bind it too)
    unless ``insecure_tcp=True`` (a warning is logged); otherwise
    ``ValueError``.  ``tls://`` binds anywhere.  Blocks; returns after
    ``HostMesh.shutdown()``.

    ``exit_with_parent=True`` (``--exit-with-parent``): end (killing its
    procs) once the process that started it is gone -- the client that
    started a ``local`` host, the ssh session of an SSH exec -- so a worker
    loop started for one allocation never outlives its starter; and end too
    once the client that heartbeats it has sent nothing for longer than
    ``MONARCH_DELIVERY_TIMEOUT`` (a partition, a lost host: the client will
    not use it again).  Without it, only that client's procs are killed.
    """
    from monarch_core._proc import _state, _transport
    from monarch_core._launch._start import build_runtime
    from monarch_core._plugins import registry

    if not isinstance(address, str) or "://" not in address:
        raise ValueError(f"run_worker_loop_forever(address=...): expected a URL such as 'tls://host:29500', got {address!r}")
    service_id, address = split_service_id(address)
    scheme = address.split("://", 1)[0]
    child_bind = _check_tcp_bind(address, insecure_tcp)
    transport = registry().transport(scheme)
    if (ca, private_key, cert) != (None, None, None):
        transport.set_credentials(ca=ca, cert=cert, key=private_key)
    transport.normalize(address)
    child_env = getattr(transport, "child_env", None)
    if child_env is not None:
        # What its procs get (``_spawn.transport_env``: the credentials given
        # as arguments) is this process's environment from now on, so that the
        # fork server started below has the procs' start-up variables and can
        # fork them; otherwise every proc would be exec'd (a fresh interpreter
        # and its imports per proc) beside an idle fork server.
        os.environ.update(child_env())
    _transport.set_from_parent(transport.name)
    from monarch_core._launch import _fork_server

    # Forked from this process now (no thread of ours yet): the zygote shares
    # what the worker imported and imports the rest while the worker starts.
    _fork_server.start_early(fork=True)
    proc_id = f"worker-loop-{os.getpid()}"
    rt = build_runtime(
        proc_id=proc_id, kernel_name=f"worker loop {address}", transport=transport, bind_spec=address,
        agent=functools.partial(WorkerLoopAgent, child_bind_spec=child_bind), name=f"worker loop {address}",
        is_client=False, root=(proc_id, address), parent=None, point=_state.ROOT_POINT,
        python_executable=sys.executable, proc_mesh_name="worker-loop",
    )
    kernel, agent = rt.kernel, rt.agent
    agent.exit_without_client = exit_with_parent
    agent.service_id = service_id

    async def start() -> None:
        logger.info("monarch worker loop listening on %s (pid %d)", kernel.address, os.getpid())
        print(f"{READY_PREFIX}{kernel.address}", flush=True)
        _fork_server.prestart(kernel)
        if exit_with_parent:
            kernel.start_task(_exit_with_parent, os.getppid(), agent)

    trio.run(functools.partial(kernel.serve, after_start=start))
    agent.kill_all_children()


async def _exit_with_parent(parent_pid: int, agent: WorkerLoopAgent) -> None:
    """End the worker loop once re-parented (its starter is gone).  Polls:
    a parent-death signal would fire when the *thread* that started us ends."""
    while True:
        await trio.sleep(0.5)
        if os.getppid() != parent_pid:
            logger.warning("the process that started this worker loop (pid %d) is gone; exiting", parent_pid)
            agent.exit()
            return
