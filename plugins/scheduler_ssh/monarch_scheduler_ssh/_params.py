"""The ``[hosts.<name>]`` parameters of ``scheduler = "ssh"``: checked and
normalised, with errors that name the file, the key and a fix.

No paramiko here: ``validate`` runs before anything connects.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from monarch_core.errors import ConfigError

#: Every key the scheduler accepts (``Scheduler.params``).
PARAMS = frozenset({
    "hosts", "user", "port", "identity_file", "known_hosts", "ssh_config", "proxy_jump",
    "python", "env", "cwd", "connect_timeout", "io_timeout", "keepalive_interval", "keepalive_count",
    "worker_host", "client_address", "insecure_tcp",
})

#: Defaults of the numeric settings (seconds, count).
CONNECT_TIMEOUT = 10.0
IO_TIMEOUT = 60.0
KEEPALIVE_INTERVAL = 5.0
KEEPALIVE_COUNT = 6

_ENTRY = re.compile(
    r"^(?:(?P<user>[^@\s\[\]]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.%\w]+)\]|(?P<host>[^:@\s\[\]]+))(?::(?P<port>\d{1,5}))?$"
)
_PLACEHOLDERS = ("{host}", "{hostname}", "{address}")

EXAMPLE = '''[hosts.lab]
scheduler = "ssh"
hosts = ["node1", "alice@node2:2222", "node[3-4]"]   # or hosts = "hostfile.txt"'''


@dataclasses.dataclass(frozen=True)
class HostEntry:
    """One configured host: ``name`` (unique, shown in tables and failure
    reports), what to connect to (an ``~/.ssh/config`` alias or an address)
    and the user and port written in the entry, if any."""

    name: str
    target: str
    user: str | None = None
    port: int | None = None


@dataclasses.dataclass(frozen=True)
class SshParams:
    """The checked parameters of one ``[hosts.<name>]`` entry."""

    source: str
    hosts: tuple[HostEntry, ...]
    user: str | None = None
    port: int | None = None
    identity_files: tuple[str, ...] = ()
    known_hosts: tuple[str, ...] = ()
    ssh_config: str | None = None  # a path, or None: ~/.ssh/config when it exists
    use_ssh_config: bool = True
    proxy_jump: str | None = None
    python: str | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    cwd: str | None = None
    connect_timeout: float = CONNECT_TIMEOUT
    io_timeout: float = IO_TIMEOUT
    keepalive_interval: float | None = None  # None: ssh_config's ServerAliveInterval, else KEEPALIVE_INTERVAL
    keepalive_count: int | None = None
    worker_host: str | None = None
    client_address: str | None = None
    insecure_tcp: bool = False


def parse(params: Mapping[str, Any], source: str) -> SshParams:
    """Check ``params`` (the entry's keys); ``ConfigError`` naming ``source``."""

    def bad(key: str, what: str) -> ConfigError:
        return ConfigError(f"{source}: {key!r} {what}")

    unknown = sorted(set(params) - PARAMS)
    if unknown:
        raise ConfigError(
            f"{source}: unknown parameter(s) {unknown} for scheduler 'ssh'; it accepts {sorted(PARAMS)}"
        )
    if "hosts" not in params:
        raise ConfigError(f"{source}: scheduler 'ssh' needs 'hosts', the machines to start worker loops on, e.g.\n{EXAMPLE}")
    hosts = _hosts(params["hosts"], source)

    def opt_str(key: str) -> str | None:
        v = params.get(key)
        if v is None:
            return None
        if not isinstance(v, str) or not v:
            raise bad(key, f"must be a non-empty string, got {v!r}")
        return v

    def opt_paths(key: str) -> tuple[str, ...]:
        v = params.get(key)
        if v is None:
            return ()
        items = [v] if isinstance(v, str) else v
        if not isinstance(items, list) or not items or not all(isinstance(x, str) and x for x in items):
            raise bad(key, f"must be a path or a list of paths, got {v!r}")
        return tuple(os.path.expanduser(x) for x in items)

    def number(key: str, default: float | None, minimum: float, *, integer: bool = False) -> Any:
        v = params.get(key)
        if v is None:
            return default
        ok = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok or (isinstance(v, float) and not math.isfinite(v)) or v < minimum:
            kind = "an integer" if integer else "a number of seconds"
            raise bad(key, f"must be {kind} >= {minimum:g}, got {v!r}")
        return int(v) if integer else float(v)

    port = params.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
        raise bad("port", f"must be a TCP port number (1-65535), got {port!r}")
    env = params.get("env", {})
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str) for k, v in env.items()):
        raise bad("env", f"must be a table of strings, e.g. env = {{ PYTHONPATH = \"/srv/code\" }}, got {env!r}")
    bad_names = [k for k in env if "=" in k or "\0" in k or "\0" in env[k]]
    if bad_names:
        raise bad("env", f"has names or values a process environment cannot hold: {bad_names}")
    ssh_config = params.get("ssh_config")
    use_ssh_config = True
    if ssh_config is False:
        use_ssh_config, ssh_config = False, None
    elif ssh_config is not None:
        if not isinstance(ssh_config, str) or not ssh_config:
            raise bad("ssh_config", f"must be the path of an ssh_config file, or false to read none, got {ssh_config!r}")
        ssh_config = os.path.expanduser(ssh_config)
        if not os.path.isfile(ssh_config):
            raise bad("ssh_config", f"names {ssh_config!r}, which is not a file")
    for key in ("identity_file", "known_hosts"):
        for path in opt_paths(key):
            if not os.path.isfile(path):
                raise bad(key, f"names {path!r}, which is not a file")
    insecure = params.get("insecure_tcp", False)
    if not isinstance(insecure, bool):
        raise bad("insecure_tcp", f"must be true or false, got {insecure!r}")
    worker_host = opt_str("worker_host")
    if worker_host is not None:
        stripped = worker_host
        for p in _PLACEHOLDERS:
            stripped = stripped.replace(p, "")
        if "{" in stripped or "}" in stripped or "/" in worker_host:
            raise bad("worker_host", f"must be a host name or address, optionally with {list(_PLACEHOLDERS)}, got "
                                     f"{worker_host!r}")
    client_address = opt_str("client_address")
    if client_address is not None and "://" in client_address and not client_address.startswith(("tls://", "tcp://")):
        raise bad("client_address", f"must be an address (10.0.0.5) or a tls:// URL, got {client_address!r}")
    cwd = opt_str("cwd")
    if cwd is not None and "\0" in cwd:
        raise bad("cwd", "must not contain NUL")
    return SshParams(
        source=source,
        hosts=hosts,
        user=opt_str("user"),
        port=port,
        identity_files=opt_paths("identity_file"),
        known_hosts=opt_paths("known_hosts"),
        ssh_config=ssh_config,
        use_ssh_config=use_ssh_config,
        proxy_jump=opt_str("proxy_jump"),
        python=opt_str("python"),
        env=dict(env),
        cwd=cwd,
        connect_timeout=number("connect_timeout", CONNECT_TIMEOUT, 0.1),
        io_timeout=number("io_timeout", IO_TIMEOUT, 0.1),
        keepalive_interval=number("keepalive_interval", None, 0),
        keepalive_count=number("keepalive_count", None, 1, integer=True),
        worker_host=worker_host,
        client_address=client_address,
        insecure_tcp=insecure,
    )


def _hosts(value: Any, source: str) -> tuple[HostEntry, ...]:
    if isinstance(value, str):
        lines = _hostfile(value, source)
        where = f"hostfile {value!r}"
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        lines = [(str(v), f"hosts[{i}]") for i, v in enumerate(value)]
        where = "'hosts'"
    else:
        raise ConfigError(
            f"{source}: 'hosts' must be a non-empty list of hosts or the path of a hostfile (one host per line), "
            f"got {value!r}; e.g.\n{EXAMPLE}"
        )
    entries: list[HostEntry] = []
    for text, at in lines:
        for one in _expand(text.strip(), source, at):
            entries.append(_entry(one, source, at))
    if not entries:
        raise ConfigError(f"{source}: {where} names no host")
    names = [e.name for e in entries]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{source}: 'hosts' names {dup} more than once; each host gets one worker loop")
    return tuple(entries)


def _hostfile(path: str, source: str) -> list[tuple[str, str]]:
    p = Path(os.path.expanduser(path))
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(
            f"{source}: 'hosts' is a string, so it names a hostfile, but {str(p.absolute())!r} cannot be read "
            f"({e.strerror or e}); give a list (hosts = [\"node1\", \"node2\"]) or the file's path (relative paths "
            "are taken from the current working directory)"
        ) from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            out.append((line.split()[0], f"{p}:{n}"))  # the first word (MPI hostfiles add slots=...)
    return out


def _expand(text: str, source: str, at: str) -> list[str]:
    """``node[1-3]`` ranges (python-hostlist); ``[::1]`` stays an IPv6 literal."""
    body = text.split("@", 1)[-1]
    if "[" not in text or body.startswith("["):
        return [text]
    import hostlist

    try:
        return list(hostlist.expand_hostlist(text))
    except hostlist.BadHostlist as e:
        raise ConfigError(f"{source}: {at} = {text!r} is not a host or a host range like node[1-4,7]: {e}") from None


def _entry(text: str, source: str, at: str) -> HostEntry:
    if text.count(":") >= 2 and "[" not in text and "@" not in text.split(":", 1)[0]:  # bare IPv6
        return HostEntry(name=text, target=text)
    m = _ENTRY.match(text)
    if m is None or (m["port"] is not None and not 1 <= int(m["port"]) <= 65535):
        raise ConfigError(
            f"{source}: {at} = {text!r} is not a host; write host, user@host, host:port, user@host:port or "
            "[ipv6]:port (an ~/.ssh/config alias counts as a host)"
        )
    host = m["v6"] or m["host"]
    port = int(m["port"]) if m["port"] else None
    name = host if port is None else (f"[{host}]:{port}" if m["v6"] else f"{host}:{port}")
    return HostEntry(name=name, target=host, user=m["user"], port=port)
