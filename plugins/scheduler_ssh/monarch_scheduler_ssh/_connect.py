"""SSH connections with paramiko: ``~/.ssh/config`` resolution, strict host
keys, ProxyJump through ``direct-tcpip`` channels, and every failure mapped to
an ``AllocationError`` that names the host and the fix.

Imported only when the scheduler allocates (paramiko is imported here).
"""

from __future__ import annotations

import base64
import dataclasses
import getpass
import hashlib
import logging
import os
import shlex
import socket
import threading
from typing import Any

import paramiko

from monarch_core.errors import AllocationError
from monarch_scheduler_ssh._params import HostEntry, SshParams, _entry

logger = logging.getLogger("monarch.ssh")

_DEFAULT_CONFIG = "~/.ssh/config"
_DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where and how to connect to one host (the entry, the parameters and
    ``~/.ssh/config`` combined: entry > parameters > ssh_config > defaults)."""

    name: str  # the host's name in the mesh
    hostname: str  # what the TCP connection dials (ssh_config HostName)
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: tuple[str, ...]
    jumps: tuple[Target, ...] = ()
    keepalive_interval: float = 5.0
    keepalive_count: int = 6
    allow_agent: bool = True
    #: ssh_config ``SetEnv``: variables the SSH server is asked to set for every
    #: command (it sets only those its ``AcceptEnv`` allows).
    set_env: tuple[tuple[str, str], ...] = ()

    @property
    def where(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        via = f" via {' -> '.join(j.name for j in self.jumps)}" if self.jumps else ""
        return f"{self.user}@{host}:{self.port}{via}"

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is filed under in known_hosts."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def load_ssh_config(params: SshParams) -> paramiko.SSHConfig | None:
    """The ssh_config to honour: ``params.ssh_config``, else ``~/.ssh/config``
    if it exists, else none (``ssh_config = false``: none)."""
    if not params.use_ssh_config:
        return None
    path = params.ssh_config or os.path.expanduser(_DEFAULT_CONFIG)
    if not os.path.isfile(path):
        return None
    try:
        return paramiko.SSHConfig.from_path(path)
    except (OSError, paramiko.SSHException, ValueError) as e:
        raise AllocationError(f"{params.source}: cannot read the ssh_config file {path!r}: {e}") from None


def resolve(entry: HostEntry, params: SshParams, cfg: paramiko.SSHConfig | None, *, _depth: int = 0,
            _jump: bool = False) -> Target:
    """The :class:`Target` of ``entry``; ``AllocationError`` for what paramiko cannot do (ProxyCommand)."""
    o: dict[str, Any] = cfg.lookup(entry.target) if cfg is not None else {}
    if "proxycommand" in o and o["proxycommand"].lower() != "none":
        raise AllocationError(
            f"{params.source}: host {entry.name!r}: ~/.ssh/config gives it a ProxyCommand, which the ssh scheduler "
            "does not run; use ProxyJump (or proxy_jump = \"jumphost\" in the entry) instead"
        )
    hostname = o.get("hostname") or entry.target
    user = entry.user or (None if _jump else params.user) or o.get("user") or _local_user()
    port_s = entry.port or (None if _jump else params.port) or o.get("port") or 22
    try:
        port = int(port_s)
    except ValueError:
        raise AllocationError(f"{params.source}: host {entry.name!r}: ssh_config gives Port {port_s!r}") from None
    identities = params.identity_files or tuple(
        p for p in (os.path.expanduser(x) for x in o.get("identityfile", ())) if os.path.isfile(p)
    )
    known = params.known_hosts or tuple(
        os.path.expanduser(x) for x in o.get("userknownhostsfile", "").split() if x
    ) or tuple(p for p in (os.path.expanduser(x) for x in _DEFAULT_KNOWN_HOSTS) if os.path.isfile(p))
    interval = params.keepalive_interval
    if interval is None:
        interval = float(o.get("serveraliveinterval", 0) or 0) or 5.0
    count = params.keepalive_count or int(o.get("serveralivecountmax", 0) or 0) or 6
    jump_spec = (None if _jump else params.proxy_jump) or o.get("proxyjump")
    jumps: tuple[Target, ...] = ()
    if jump_spec and jump_spec.lower() != "none":
        if _depth > 4:
            raise AllocationError(f"{params.source}: host {entry.name!r}: ProxyJump chain longer than 5 hosts (a loop?)")
        chain: list[Target] = []
        for j, spec in enumerate(s.strip() for s in jump_spec.split(",")):
            spec = spec.removeprefix("ssh://")
            je = _entry(spec, params.source, f"ProxyJump of {entry.name}")
            jt = resolve(je, params, cfg, _depth=_depth + 1, _jump=True)
            chain.extend(jt.jumps if j == 0 else ())  # the first jump's own jumps come first
            chain.append(dataclasses.replace(jt, jumps=()))
        jumps = tuple(chain)
    set_env = []
    for word in shlex.split(o.get("setenv", "")):
        k, sep, v = word.partition("=")
        if sep and k:
            set_env.append((k, v))
    return Target(
        name=entry.name,
        set_env=tuple(set_env),
        hostname=hostname,
        port=port,
        user=user,
        identity_files=identities,
        known_hosts=known,
        jumps=jumps,
        keepalive_interval=float(interval),
        keepalive_count=int(count),
        allow_agent=str(o.get("identitiesonly", "no")).lower() != "yes" or not identities,
    )


def _local_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid
        return str(os.getuid())


def fingerprint(key: paramiko.PKey) -> str:
    """``SHA256:...`` as OpenSSH prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class _UnknownHostKey(Exception):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(hostname)
        self.hostname, self.key = hostname, key


class _Reject(paramiko.MissingHostKeyPolicy):
    """Strict host-key checking: an unknown key is an error, never accepted."""

    def missing_host_key(self, client: Any, hostname: str, key: paramiko.PKey) -> None:
        raise _UnknownHostKey(hostname, key)


class Connection:
    """An authenticated SSH connection to one host (and the jump hosts it goes through)."""

    def __init__(self, target: Target, client: paramiko.SSHClient, jumps: list[paramiko.SSHClient]) -> None:
        self.target = target
        self.client = client
        self.jumps = jumps
        self._closed = False
        self._lock = threading.Lock()

    @property
    def transport(self) -> paramiko.Transport:
        """The connection's transport; ``EOFError`` once it was closed."""
        t = self.client.get_transport()
        if t is None:
            raise EOFError(f"the SSH connection to {self.target.where} was closed")
        return t

    def is_active(self) -> bool:
        """Is the connection still up (not closed by us, not broken)?"""
        t = self.client.get_transport()
        return t is not None and t.is_active()

    def exception(self) -> BaseException | None:
        """Why the connection broke, when paramiko knows."""
        t = self.client.get_transport()
        return t.get_exception() if t is not None else None

    def remote_ip(self) -> str | None:
        """The address this connection reached (the remote end of the TCP
        connection); ``None`` through a jump host."""
        sock = self.transport.sock
        if isinstance(sock, socket.socket):
            try:
                return str(sock.getpeername()[0])
            except OSError:
                return None
        return None

    def local_ip(self) -> str | None:
        sock = self.transport.sock
        if isinstance(sock, socket.socket):
            try:
                return str(sock.getsockname()[0])
            except OSError:
                return None
        return None

    def exec(self, command: str, timeout: float) -> paramiko.Channel:
        """A new session channel running ``command`` (with ssh_config's ``SetEnv``)."""
        ch = self.transport.open_session(timeout=timeout)
        if self.target.set_env:
            ch.update_environment(dict(self.target.set_env))
        _bounded(ch, lambda: ch.exec_command(command), timeout, "start the command")
        return ch

    def sftp(self, timeout: float) -> paramiko.SFTPClient:
        """An SFTP session whose requests time out after ``timeout`` s."""
        ch = self.transport.open_session(timeout=timeout)
        _bounded(ch, lambda: ch.invoke_subsystem("sftp"), timeout, "start SFTP")
        ch.settimeout(timeout)
        return paramiko.SFTPClient(ch)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for c in [self.client, *reversed(self.jumps)]:
            try:
                c.close()
            except Exception:  # noqa: BLE001, S110 - closing what may already be broken
                pass


def _bounded(ch: paramiko.Channel, request: Any, timeout: float, what: str) -> None:
    """Run a channel request (exec, subsystem) that paramiko waits on without
    a limit: after ``timeout`` s the channel is closed, which ends the wait."""
    expired = threading.Event()

    def give_up() -> None:
        expired.set()
        try:
            ch.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the connection is gone already: the request ends with it

    timer = threading.Timer(timeout, give_up)
    timer.daemon = True
    timer.start()
    try:
        request()
    except paramiko.SSHException:
        if expired.is_set():
            raise TimeoutError(f"the SSH server did not {what} within {timeout:g}s") from None
        raise
    finally:
        timer.cancel()


def connect(target: Target, timeout: float) -> Connection:
    """Connect and authenticate to ``target`` (through its jump hosts), each
    step within ``timeout`` seconds; ``AllocationError`` naming the host."""
    jumps: list[paramiko.SSHClient] = []
    sock: Any = None
    hops = [*target.jumps, target]
    try:
        for i, hop in enumerate(hops[:-1]):
            jumps.append(_client(hop, timeout, sock, via=target))
            sock = _tunnel(jumps[-1], hops[i + 1], timeout, hop, target)
        client = _client(target, timeout, sock, via=None)
    except BaseException:
        if sock is not None and hasattr(sock, "close"):
            sock.close()
        for c in reversed(jumps):
            c.close()
        raise
    conn = Connection(target, client, jumps)
    conn.transport.set_keepalive(0)  # liveness is ours (watched keepalive requests), not paramiko's
    return conn


def _tunnel(jump: paramiko.SSHClient, nxt: Target, timeout: float, hop: Target, target: Target) -> Any:
    t = jump.get_transport()
    try:
        assert t is not None
        return t.open_channel("direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0), timeout=timeout)
    except paramiko.ChannelException as e:
        raise AllocationError(
            f"host {target.name!r} ({target.where}): the jump host {hop.name!r} could not open a connection to "
            f"{nxt.hostname}:{nxt.port}: {e.text or e} (does it allow TCP forwarding, AllowTcpForwarding yes, and "
            "reach that address?)"
        ) from None
    except (paramiko.SSHException, OSError, EOFError) as e:
        raise AllocationError(
            f"host {target.name!r} ({target.where}): the jump host {hop.name!r} did not forward the connection "
            f"within {timeout:g}s: {type(e).__name__}: {e}"
        ) from None


def _client(t: Target, timeout: float, sock: Any, *, via: Target | None) -> paramiko.SSHClient:
    """One authenticated hop; errors name the host being reached (and the hop)."""
    client = paramiko.SSHClient()
    keys = client.get_host_keys()
    for path in t.known_hosts:
        try:
            keys.load(path)
        except (OSError, paramiko.SSHException) as e:
            client.close()
            raise AllocationError(f"host {t.name!r}: cannot read known_hosts file {path!r}: {e}") from None
    client.set_missing_host_key_policy(_Reject())
    what = f"host {t.name!r} ({t.where})" if via is None else f"host {via.name!r}: its jump host {t.name!r} ({t.where})"
    known = ", ".join(t.known_hosts) or "(no known_hosts file: ~/.ssh/known_hosts does not exist)"
    kh = t.known_hosts[0] if t.known_hosts else "~/.ssh/known_hosts"
    try:
        client.connect(
            t.hostname, t.port, username=t.user, key_filename=list(t.identity_files) or None,
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
            sock=sock, allow_agent=t.allow_agent, look_for_keys=not t.identity_files,
        )
        return client
    except BaseException as e:
        client.close()
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise _map(e, t, what, known, kh, timeout) from None


def _map(e: BaseException, t: Target, what: str, known: str, kh: str, timeout: float) -> AllocationError:
    hp = t.known_hosts_name
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError) and e.errors:
        inner = list(e.errors.values())
        e = next((x for x in inner if not isinstance(x, ConnectionRefusedError)), inner[0])
    if isinstance(e, _UnknownHostKey):
        return AllocationError(
            f"{what}: its host key is not in known_hosts ({known}); the ssh scheduler checks host keys strictly "
            f"and never accepts an unknown one. The server offered {e.key.get_name()} {fingerprint(e.key)}. If that "
            f"is the host's key (ask its administrator), add it: ssh-keyscan -p {t.port} {t.hostname} >> {kh} "
            "(or log in once with ssh), or point known_hosts = ... at the file that has it"
        )
    if isinstance(e, paramiko.BadHostKeyException):
        return AllocationError(
            f"{what}: its HOST KEY CHANGED: known_hosts ({known}) has {e.expected_key.get_name()} "
            f"{fingerprint(e.expected_key)}, the server offered {e.key.get_name()} {fingerprint(e.key)}. Someone may "
            "be intercepting the connection, or the host was reinstalled. If you know it was, replace the old key: "
            f"ssh-keygen -R '{hp}' -f {kh} && ssh-keyscan -p {t.port} {t.hostname} >> {kh}"
        )
    if isinstance(e, paramiko.PasswordRequiredException):
        return AllocationError(
            f"{what}: the private key is encrypted ({', '.join(t.identity_files) or 'a default key'}); load it into "
            "ssh-agent (ssh-add) or use an unencrypted key (identity_file = ...)"
        )
    if isinstance(e, paramiko.AuthenticationException):
        keys = ", ".join(t.identity_files) or "the default keys in ~/.ssh and ssh-agent"
        return AllocationError(
            f"{what}: authentication as user {t.user!r} failed (tried {keys}): {str(e).rstrip('.')}. Is the public key in "
            f"~{t.user}/.ssh/authorized_keys on that host, and is the user right (user = ..., user@host in hosts, "
            "or User in ~/.ssh/config)?"
        )
    if isinstance(e, socket.gaierror):
        return AllocationError(f"{what}: cannot resolve host name {t.hostname!r}: {e.strerror or e}")
    if isinstance(e, ConnectionRefusedError):
        return AllocationError(
            f"{what}: connection refused at {t.hostname}:{t.port}: no SSH server listens there (is sshd running, "
            "on that port?)"
        )
    if isinstance(e, (socket.timeout, TimeoutError)):
        return AllocationError(
            f"{what}: no answer within {timeout:g}s (connect_timeout): host down or unreachable, or a firewall "
            "drops the packets"
        )
    if isinstance(e, paramiko.SSHException) and "banner" in str(e).lower():
        return AllocationError(
            f"{what}: the server at {t.hostname}:{t.port} did not start the SSH protocol within {timeout:g}s "
            f"(not an SSH server, or overloaded): {e}"
        )
    if isinstance(e, paramiko.SSHException) and "no authentication methods" in str(e).lower():
        return AllocationError(
            f"{what}: no key to authenticate as {t.user!r} with: set identity_file = \"~/.ssh/id_ed25519\" (or "
            "IdentityFile in ~/.ssh/config), or load a key into ssh-agent"
        )
    if isinstance(e, FileNotFoundError):
        return AllocationError(f"{what}: identity file not found: {e.filename or e}")
    if isinstance(e, OSError):
        return AllocationError(f"{what}: cannot connect to {t.hostname}:{t.port}: {e.strerror or e}")
    if isinstance(e, AllocationError):
        return e
    return AllocationError(f"{what}: SSH connection failed: {type(e).__name__}: {e}")
