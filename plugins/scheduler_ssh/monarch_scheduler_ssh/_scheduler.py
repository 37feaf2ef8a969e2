"""``scheduler = "ssh"``: one worker loop per host, each a child of its SSH
session (paramiko), authenticated end to end with the client's session TLS
credentials.  See the plugin's README and the project's docs/ssh.md.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from monarch_core.errors import AllocationError
from monarch_core.hookspecs import (
    Allocation,
    AllocationRequest,
    HostHandle,
    Scheduler,
    SyncedHost,
    WorkerLaunch,
    Workspace,
)
from monarch_scheduler_ssh._params import PARAMS, SshParams, parse

logger = logging.getLogger("monarch.ssh")

#: Seconds ``release`` waits for the workers to end after closing their stdin.
_END_WAIT = 5.0
#: Seconds the other hosts get, once one failed to start, to fail (or start)
#: on their own before their connections are closed: a wrong ``python`` fails
#: every host, and each must say so, not "the connection closed".
_ERROR_GRACE = 2.0


class SSHScheduler(Scheduler):
    """Hosts reached over SSH.  ``validate`` checks the entry (no connection,
    no paramiko); ``client_address`` finds the address the hosts reach this
    client at; ``allocate`` connects to every host at once, starts a worker
    loop on each and returns when all listen.  Parameters: see
    :data:`~monarch_scheduler_ssh._params.PARAMS` and docs/ssh.md."""

    name = "ssh"
    transport = "tls"
    params = PARAMS

    def validate(self, request: AllocationRequest) -> None:
        parse(request.params, request.source)

    def client_address(self, request: AllocationRequest) -> str | None:
        p = parse(request.params, request.source)
        if p.client_address:
            return p.client_address if "://" in p.client_address else f"tls://{_url_host(p.client_address)}:0"
        from monarch_scheduler_ssh import _connect

        target = _connect.resolve(p.hosts[0], p, _connect.load_ssh_config(p))
        first = target.jumps[0] if target.jumps and not _routable(target.hostname) else target
        ip = _route_source(first.hostname, first.port, p.source, target.name)
        return f"tls://{_url_host(ip)}:0"

    def allocate(self, request: AllocationRequest, launch: WorkerLaunch) -> Allocation:
        p = parse(request.params, request.source)
        if launch.transport != "tls" and not (launch.transport == "tcp" and p.insecure_tcp):
            raise AllocationError(
                f"ssh scheduler ({p.source}): this client runs the {launch.transport!r} transport, but hosts reached "
                "over SSH talk to it over tls (mutually authenticated). Leave the transport to hosts_from_config "
                "(it enables tls), or call enable_transport('tls://<an address the hosts reach>:0') first"
                + ("; plain tcp needs insecure_tcp = true in the entry, on a network you trust"
                   if launch.transport == "tcp" else "")
            )
        from monarch_scheduler_ssh import _connect

        cfg = _connect.load_ssh_config(p)
        targets = [_connect.resolve(e, p, cfg) for e in p.hosts]
        alloc = SSHAllocation(p, targets, launch, request.name)
        alloc.bring_up()
        return alloc


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _routable(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except OSError:
        return False


def _route_source(host: str, port: int, source: str, name: str) -> str:
    """The local address of this machine's route to ``host`` (a UDP
    ``connect`` sends nothing): where that host reaches this client."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as e:
        raise AllocationError(
            f"ssh scheduler ({source}): cannot resolve host {name!r} ({host}) to find the address it reaches this "
            f"client at: {e}; fix the host, or set client_address = \"<this machine's address>\""
        ) from None
    last: OSError | None = None
    for family, kind, proto, _, addr in infos:
        s = socket.socket(family, kind, proto)
        try:
            s.connect(addr)
            ip = s.getsockname()[0]
        except OSError as e:
            last = e
            continue
        finally:
            s.close()
        try:
            if ipaddress.ip_address(ip.split("%", 1)[0]).is_unspecified:
                continue
        except ValueError:
            pass
        return str(ip)
    raise AllocationError(
        f"ssh scheduler ({source}): no route from this machine to host {name!r} ({host}): {last}; set "
        "client_address = \"<an address of this machine the hosts can reach>\""
    )


class SSHAllocation(Allocation):
    """The worker loops of one ``hosts_from_config`` call and their SSH
    connections (``hosts`` in the configured order)."""

    def __init__(self, p: SshParams, targets: list, launch: WorkerLaunch, name: str) -> None:
        self.p = p
        self.targets = targets
        self.launch = launch
        self.name = name
        self.token = secrets.token_hex(8)
        self.hosts: list[HostHandle] = []
        self.extent = {"hosts": len(targets)}
        self.workers: dict[str, Any] = {}  # host name -> RemoteWorker
        self.conns: list[Any] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._abort = threading.Event()
        self._changed = threading.Event()  # a bring-up thread ended
        self._finished = 0  # bring-up threads that ended

    @property
    def python(self) -> str:
        return self.p.python or self.launch.python

    # ------------------------------------------------------------ bring-up

    def bring_up(self) -> None:
        """Connect to and start every host at once; return when all listen,
        or release everything and raise ``AllocationError``."""
        from monarch_scheduler_ssh._progress import Progress

        n = len(self.targets)
        deadline = time.monotonic() + self.launch.timeout
        progress = Progress(n, f"ssh {self.name}: starting worker loops")
        results: list[Any] = [None] * n
        errors: dict[str, str] = {}
        threads = [threading.Thread(target=self._one, args=(i, deadline, results, errors, progress),
                                    name=f"monarch-ssh-up-{t.name}", daemon=True) for i, t in enumerate(self.targets)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        first_error: float | None = None
        try:
            while True:
                self._changed.clear()  # (before looking: a host that ends after the look wakes the wait)
                with self._lock:
                    if self._finished == n:
                        break
                now = time.monotonic()
                if errors and first_error is None:
                    first_error = now
                failed = first_error is not None and now >= first_error + min(_ERROR_GRACE, self.p.connect_timeout)
                if self.launch.cancelled.is_set() or now >= deadline or failed:
                    self._abort.set()
                    self._close_all()  # unblocks anything waiting on a connection
                    grace = time.monotonic() + self.p.connect_timeout + 1.0
                    for t in threads:
                        t.join(max(0.0, grace - time.monotonic()))
                    break
                self._changed.wait(0.05)
        except BaseException:
            self._abort.set()
            progress.close()
            self.release()
            raise
        progress.close()
        pending = [t.name for t, r in zip(self.targets, results) if r is None and t.name not in errors]
        if errors or pending or self.launch.cancelled.is_set():
            self.release()
            if self.launch.cancelled.is_set() and not errors:
                raise AllocationError(f"ssh scheduler ({self.p.source}): allocation cancelled")
            if not errors:
                errors = {name: f"host {name!r}: did not start within {self.launch.timeout:g}s" for name in pending}
            raise AllocationError(self._failure(errors, n))
        for i, w in enumerate(results):
            self.hosts.append(HostHandle(
                name=w.name, address=w.address,
                labels={"hostname": str(w.hello.get("hostname", "?")), "address": str(w.worker_host), "pid": str(w.pid)},
            ))
        logger.info("ssh %s: %d worker loops up in %.2fs", self.name, n, time.monotonic() - t0)
        for w in results:
            w.on_lost = self._lost_callback(w.name)
            w.start_keepalive()
            if w.lost is not None:  # ended before we watched it
                self.launch.report_lost(w.name, w.lost)
        threading.Thread(target=self._monitor, name=f"monarch-ssh-monitor-{self.name}", daemon=True).start()

    def _failure(self, errors: dict[str, str], n: int) -> str:
        others = n - len(errors)
        closed = f" (the connections to the other {others} host{'s' if others != 1 else ''} were closed)" if others else ""
        if len(errors) == 1:
            return f"ssh scheduler ({self.p.source}): {next(iter(errors.values()))}{closed}"
        body = "\n  ".join(errors[t.name] for t in self.targets if t.name in errors)
        return f"ssh scheduler ({self.p.source}): {len(errors)} of {n} hosts failed{closed}:\n  {body}"

    def _one(self, i: int, deadline: float, results: list, errors: dict, progress: Any) -> None:
        from monarch_scheduler_ssh import _connect, _remote

        target = self.targets[i]
        try:
            if self._abort.is_set():
                return
            conn = _connect.connect(target, self.p.connect_timeout)
            with self._lock:
                self.conns.append(conn)
                late = self._abort.is_set() or self._released.is_set()
            if late:
                conn.close()
                return
            w = _remote.RemoteWorker(conn, target, self.token, io_timeout=self.p.io_timeout)
            with self._lock:
                self.workers[target.name] = w
            w.start(self.python, self._setup, deadline,
                    lambda: self._abort.is_set() or self.launch.cancelled.is_set())
            results[i] = w
            progress.advance(target.name)
        except _remote._Stop:
            return
        except AllocationError as e:  # (after the abort: a consequence of it, unless nothing else failed)
            if not self._abort.is_set() or not errors:
                errors[target.name] = str(e)
        except Exception as e:  # noqa: BLE001 - a bug or an unmapped library error: name the host
            if not self._abort.is_set() or not errors:
                errors[target.name] = f"host {target.name!r} ({target.where}): {type(e).__name__}: {e}"
        finally:
            with self._lock:
                self._finished += 1
            self._changed.set()

    def _setup(self, w: Any) -> tuple[list[str], dict[str, str], str | None]:
        """After the hello: the worker's address, argv, environment, cwd."""
        host = self._worker_host(w)
        w.worker_host = host
        argv = self.launch.command(host, python=self.python, insecure_tcp=self.p.insecure_tcp)
        env = {k: v.replace("{host}", w.name) for k, v in self.p.env.items()}
        env.update(self.launch.credentials_for(host))
        cwd = self.p.cwd.replace("{host}", w.name) if self.p.cwd else None
        return argv, env, cwd

    def _worker_host(self, w: Any) -> str:
        """The address the worker listens on and advertises."""
        ip = w.conn.remote_ip()
        if ip is None:  # through a jump host: the address the last hop reached
            parts = str(w.hello.get("ssh", "")).split()
            ip = parts[2] if len(parts) >= 4 else w.target.hostname
        if self.p.worker_host:
            return (self.p.worker_host.replace("{host}", w.name)
                    .replace("{hostname}", str(w.hello.get("hostname", w.target.hostname)))
                    .replace("{address}", ip))
        return ip

    # ------------------------------------------------------------ while in use

    def _lost_callback(self, name: str) -> Any:
        def lost(reason: str) -> None:
            if not self._released.is_set():
                self.launch.report_lost(name, reason)

        return lost

    def _monitor(self) -> None:
        while not self._released.wait(0.25):
            now = time.monotonic()
            for w in list(self.workers.values()):
                w.check_keepalive(now)

    def sync_workspace(self, workspace: Workspace, hosts: Sequence[str], *, conda: bool = False,
                       auto_reload: bool = False) -> dict[str, SyncedHost]:
        """Copy ``workspace`` into each host's working directory over SFTP
        (only changed files), then put its directories on the ``PYTHONPATH``
        of the procs those hosts start from now on.  ``conda=True``: also the
        client's environment, into ``.monarch/env/<name>`` there (its Python
        runs the procs spawned from now on: the core reads the returned
        ``SyncedHost.python``).  ``auto_reload`` is the core's (a watcher
        that calls this again).  Returns what each host holds."""
        from monarch_core.hookspecs import active_environment
        from monarch_scheduler_ssh import _sync
        from monarch_scheduler_ssh._progress import Progress

        if self._released.is_set():
            raise AllocationError(f"ssh scheduler ({self.p.source}): the hosts were released")
        unknown = [h for h in hosts if h not in self.workers]
        if unknown:
            raise AllocationError(f"ssh scheduler ({self.p.source}): no such host(s) {unknown}; known: {sorted(self.workers)}")
        env = active_environment() if conda else None
        stats: dict[str, Any] = {}
        out: dict[str, SyncedHost] = {}
        errors: dict[str, str] = {}

        def one(name: str) -> None:
            w = self.workers[name]
            what = f"host {name!r} ({w.target.where})"
            try:
                if w.lost is not None:
                    raise AllocationError(f"{what}: it was lost ({w.lost})")
                root = w.cwd or "."
                python = None
                if env is not None:
                    def bar(total: int) -> Progress:
                        return Progress(total, f"{name}: environment {env.name}", unit="B")

                    python, stats[f"{name} env"] = _sync.sync_env(w.conn, self.python, env, root, self.p.io_timeout,
                                                                  what, self.token, bar)
                stats[name] = _sync.sync_host(w.conn, self.python, workspace, root, self.p.io_timeout, what, self.token)
                paths = workspace.remote_dirs(root)
                w.control({"op": "pythonpath", "paths": paths})
                out[name] = SyncedHost(paths=tuple(paths), python=python)
            except AllocationError as e:
                errors[name] = str(e)
            except Exception as e:  # noqa: BLE001 - name the host
                errors[name] = f"{what}: {type(e).__name__}: {e}"

        threads = [threading.Thread(target=one, args=(h,), name=f"monarch-ssh-sync-{h}", daemon=True) for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            body = "\n  ".join(errors[h] for h in hosts if h in errors)
            raise AllocationError(f"ssh scheduler ({self.p.source}): sync_workspace failed on {len(errors)} of "
                                  f"{len(hosts)} hosts:\n  {body}")
        for key, s in stats.items():
            logger.info("sync_workspace: %s: %d files uploaded (%d bytes), %d unchanged, %.2fs",
                        key, s.uploaded, s.bytes, s.unchanged, s.seconds)
        return out

    # ------------------------------------------------------------ release

    def _close_all(self) -> None:
        with self._lock:
            conns = list(self.conns)
        for c in conns:
            c.close()

    def release(self) -> None:
        """Stop every worker (stdin closed: the bootstrap exits, the procs
        die with it), kill any a lost host left behind once it answers again,
        and close every connection."""
        with self._lock:
            if self._released.is_set():
                return
            self._released.set()
            workers = list(self.workers.values())
        for w in workers:
            w.stop()
        deadline = time.monotonic() + _END_WAIT
        for w in workers:
            w.wait_ended(max(0.0, deadline - time.monotonic()))
        reap = [w for w in workers if w.needs_reap and w.pid is not None]
        threads = [threading.Thread(target=self._reap_one, args=(w,), daemon=True) for w in reap]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.p.connect_timeout + self.p.io_timeout)
        self._close_all()

    def _reap_one(self, w: Any) -> None:
        """Reconnect to a host whose connection was given up on and kill the
        worker it may still run (its children die with it)."""
        from monarch_scheduler_ssh import _bootstrap, _connect

        try:
            conn = _connect.connect(w.target, self.p.connect_timeout)
        except AllocationError as e:
            logger.warning("ssh: could not reach host %r again to stop its worker loop (pid %s): %s; it ends when "
                           "that host's sshd notices the connection is gone", w.name, w.pid, e)
            return
        try:
            ch = conn.exec(_bootstrap.kill_command(w.pid, self.token), self.p.io_timeout)
            ch.settimeout(self.p.io_timeout)
            out = ch.makefile().read().decode(errors="replace").strip()
            logger.info("ssh: worker loop of lost host %r (pid %s): %s", w.name, w.pid, out)
        except Exception as e:  # noqa: BLE001 - best effort, logged
            logger.warning("ssh: stopping the worker loop of lost host %r failed: %s", w.name, e)
        finally:
            conn.close()
