"""Every ``MONARCH_*`` environment variable, declared once.

Each :class:`Setting` has a name, a kind (how its text is parsed), a default,
the bounds it must respect, a one-line meaning, and whether it is a *user*
setting (a stable interface, listed in the README) or an *internal* tuning
knob (listed apart; it may change or go without notice).  Code reads a value
with :func:`get` (``settings.get("MONARCH_DELIVERY_TIMEOUT")``); nothing else
in monarch-core or its plugins reads these variables itself.  A malformed
value is a :class:`~monarch_core.errors.ConfigError` naming the variable,
what it expects and what it got::

    MONARCH_DELIVERY_TIMEOUT must be a number of seconds, got 'abc'

The configuration tables in ``README.md`` and ``docs/configuration.md`` are
generated from these declarations (``python -m monarch_core.settings``); a
test fails when they drift.

Plugins declare their own variables (the ``monarch_settings`` hook of
:mod:`monarch_core.hookspecs`, or :func:`declare` before their first read) and
read them through :func:`get` too; the plugin registry declares every loaded
plugin's when it loads it, with the plugin's distribution as ``owner``.  The
tables cover an installation: ``monarch settings`` prints them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from monarch_core.errors import ConfigError

__all__ = ["SETTINGS", "Setting", "all_settings", "declare", "get", "is_set", "markdown_table"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_KINDS = {
    "seconds": "a number of seconds",
    "float": "a number",
    "int": "an integer",
    "mib": "a whole number of MiB",
    "bool": "0 or 1 (or true/false, yes/no, on/off)",
    "str": "a string",
    "path": "a file path",
    "names": "a comma-separated list of names",
    "credential": "a file path or inline PEM",
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: see the module docstring."""

    name: str
    kind: str
    default: Any
    meaning: str
    public: bool = True
    minimum: float | None = None
    #: The distribution that reads it.
    owner: str = "monarch-core"
    #: How the default reads in the tables, when ``repr`` would not do.
    default_text: str | None = None

    def parse(self, raw: str | None) -> Any:
        """The value of ``raw`` (None or blank: the default)."""
        if raw is None or not raw.strip():
            return self.default
        text = raw.strip()
        kind = self.kind
        if kind in ("str", "path", "credential"):
            return raw
        if kind == "names":
            return tuple(n.strip() for n in text.split(",") if n.strip())
        if kind == "bool":
            word = text.lower()
            if word not in _TRUE and word not in _FALSE:
                raise self._bad(raw)
            return word in _TRUE
        try:
            value: float = int(text) if kind in ("int", "mib") else float(text)
        except ValueError:
            raise self._bad(raw) from None
        if value != value or (self.minimum is not None and value < self.minimum):  # NaN, or below the bound
            raise self._bad(raw)
        return value

    def _bad(self, raw: str) -> ConfigError:
        what = _KINDS[self.kind]
        if self.minimum is not None:
            what += f" >= {self.minimum:g}"
        return ConfigError(
            f"{self.name} must be {what}, got {raw!r} (default {self.shown_default}); unset it or fix its value"
        )

    @property
    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if self.kind == "bool":
            return "1" if self.default else "0"
        return "unset" if self.default is None else f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        # ------------------------------------------------------------ user settings
        Setting("MONARCH_CONFIG", "path", None, "path of the `monarch.toml` / `pyproject.toml` that `hosts_from_config` reads (default: searched from the working directory up)"),
        Setting("MONARCH_DISABLED_PLUGINS", "names", (), "plugin (entry-point) names not to load", default_text="none"),
        Setting("MONARCH_LOG_LEVEL", "str", None, "log level of worker processes and worker loops (default: the client's `monarch` logger level; worker loops: WARNING)"),
        Setting("MONARCH_DELIVERY_TIMEOUT", "seconds", 30.0, "seconds a message may stay unacknowledged (reconnecting included) before it is returned as undeliverable", minimum=0.001),
        Setting("MONARCH_PROC_START_TIMEOUT", "seconds", 60.0, "seconds to wait for a new proc to report its address", minimum=0.001),
        Setting("MONARCH_STOP_GRACE", "seconds", 10.0, "seconds a stopping proc gets before SIGTERM, then SIGKILL; a stopping actor, before its stop completes without its thread (one stuck in `__init__` or an endpoint)", minimum=0),
        Setting("MONARCH_HEARTBEAT_INTERVAL", "seconds", 2.0, "seconds between heartbeats a parent (the client, or a worker loop for the procs it starts) sends its procs, and the client its worker loops; beyond 32 pings a second of a kind, each peer is pinged every few intervals, at least four times per timeout; 0 disables them", minimum=0),
        Setting("MONARCH_HEARTBEAT_TIMEOUT", "seconds", 30.0, "seconds of silence after which a proc is declared hung and killed", minimum=0.001),
        Setting("MONARCH_HOST_HEARTBEAT_TIMEOUT", "seconds", 30.0, "seconds a client waits for a worker loop to answer its heartbeats (sent every `MONARCH_HEARTBEAT_INTERVAL`) before it declares that host lost (frozen or cut off) and fails its procs", minimum=0.001),
        Setting("MONARCH_ATTACH_TIMEOUT", "seconds", 10.0, "seconds `attach_to_workers` waits for each worker loop to answer", minimum=0.001),
        Setting("MONARCH_ALLOCATE_TIMEOUT", "seconds", 300.0, "seconds a scheduler's allocation (and its workers' readiness) may take in `hosts_from_config`", minimum=0.001),
        Setting("MONARCH_AUTO_RELOAD_INTERVAL", "seconds", 1.0, "seconds between two looks at a workspace synced with `sync_workspace(auto_reload=True)` (file sizes and modification times)", minimum=0.01),
        Setting("MONARCH_RELEASE_TIMEOUT", "seconds", 30.0, "seconds a scheduler's `release()` may take at shutdown or exit", minimum=0.001),
        Setting("MONARCH_MAX_MESSAGE_BYTES", "int", 1 << 36, "largest message a kernel accepts, in bytes", minimum=1, default_text="64 GiB"),
        Setting("MONARCH_UNPROVEN_CONN_BYTES_MAX", "int", 1 << 30, "bytes one connection whose peer has not proven itself (no message delivered, not authenticated) may make a proc hold; beyond, it is dropped", minimum=0, default_text="1 GiB"),
        Setting("MONARCH_UNPROVEN_BYTES_MAX", "int", 2 << 30, "the same for all such connections of a process together", minimum=0, default_text="2 GiB"),
        Setting("MONARCH_HANDSHAKE_TIMEOUT", "seconds", 10.0, "seconds a new connection may take to send its handshake", minimum=0.001),
        Setting("MONARCH_CAST_TREE_MIN", "int", 128, "meshes of at least this many actors are reached through a cast tree (see docs/architecture.md)", minimum=2),
        Setting("MONARCH_CAST_FANOUT", "int", 16, "children per node of a cast tree: no process sends more than this many messages per cast", minimum=2),
        Setting("MONARCH_SEND_WINDOW_MB", "float", 64.0, "MiB a process holds for one destination proc, sent and not yet acknowledged, before a sender waits for room (flow control; 0: no limit)", minimum=0),
        Setting("MONARCH_SEND_WINDOW_MSGS", "int", 16384, "messages a process holds for one destination proc before a sender waits for room (0: no limit)", minimum=0),
        Setting("MONARCH_FORK_SERVER", "bool", True, "0 starts every proc with exec instead of forking it from the pre-imported fork server"),
        Setting("MONARCH_BUFFER_POOL_MB", "mib", 256, "MiB of large receive buffers kept for reuse once their consumers drop them; 0 disables", minimum=0),
        Setting("MONARCH_MALLOC_REUSE_MB", "mib", 256, "procs: allocations up to this many MiB reuse freed heap pages, with one malloc arena (0: glibc defaults); a client applies it only when the variable is set", minimum=0),
        Setting("MONARCH_TELEMETRY", "bool", True, "0 turns all instrumentation off: no endpoint metrics, spans or lifecycle events (see docs/observability.md)"),
        Setting("MONARCH_METRICS_KEEP_STOPPED", "int", 16, "stopped actor meshes whose endpoint metrics the client keeps as they were; an older one's are folded into one row per (side, actor class, endpoint) (see docs/observability.md)", minimum=0),
        Setting("MONARCH_TRACE", "bool", False, "1: every process records spans of all its work, not only of traced calls (the client's sinks get them)"),
        Setting("MONARCH_TRACE_FILE", "path", None, "the client writes a Chrome trace-event file (Perfetto UI, chrome://tracing) of the whole run here; implies tracing every call"),
        Setting("MONARCH_TELEMETRY_JSONL", "path", None, "the client appends every telemetry event (spans, metrics, lifecycle) to this JSON-lines file"),
        Setting("MONARCH_STREAM_LOGS", "bool", True, "1: every proc streams its stdout/stderr/logging to the client, each line prefixed with its actor and host; 0: none does (local procs write to the terminal themselves, remote procs to a per-host log file)"),
        Setting("MONARCH_LOG_TIMESTAMPS", "bool", False, "1: each line a proc streams to the client carries the time it was written (`[trainers{'gpus': 0/4} h1 12:00:01.234] ...`)"),
        Setting("MONARCH_PROC_DEVICES", "bool", True, "1: each proc `spawn_procs` starts sees one device of its host, `CUDA_VISIBLE_DEVICES` being the host's entry at the proc's index along `MONARCH_DEVICE_DIMS` (see docs/configuration.md); 0: procs see all of their host's devices"),
        Setting("MONARCH_DEVICE_DIMS", "names", ("gpus", "gpu"), "the `per_host` dimensions, first present first, whose coordinate is a proc's device index; a spawn with none of them uses the proc's position among its host's procs", default_text="gpus,gpu"),
        Setting("MONARCH_PROC_LOG_DIR", "path", None, "folder of the per-host log files of remote procs that do not stream (default: `<tmp>/monarch-<uid>-logs`); it must be a folder of this user with mode 0700 (created so), the files are 0600"),
        # ------------------------------------------------------------ internal tuning knobs
        Setting("MONARCH_TELEMETRY_INTERVAL", "seconds", 1.0, "seconds between two telemetry batches a proc ships to the client (and the client hands its sinks)", public=False, minimum=0.01),
        Setting("MONARCH_DIRECT_GAP_US", "float", 100.0, "µs after a direct write during which a session's next messages go through the loop, batched", public=False, minimum=0),
        Setting("MONARCH_DROP_LOG_INTERVAL", "seconds", 10.0, "seconds between two WARNING lines about connections dropped from one peer host for one reason (the next line counts those left out); 0 logs every one", public=False, minimum=0),
        Setting("MONARCH_THREADED_INBOUND", "bool", True, "0 reads plain-socket sessions on the trio loop (the path TLS takes) instead of the poller thread: for diagnosing the poller and testing that path over plain sockets", public=False),
        # ------------------------------------------------------------ set by monarch-core for its own children
        Setting("MONARCH_PROC_ID", "str", None, "set in every proc: its proc id (read it, do not set it)", public=False),
        Setting("MONARCH_PROC_BOOTSTRAP", "str", None, "set by the spawner for a new proc: its start-up message (internal)", public=False),
        Setting("MONARCH_BATCH_JOB", "bool", False, "set by `JobTrait.apply(client_script=...)` for the client it starts: that client's `job.state()` is the job it runs in (docs/job.md)", public=False),
    ]
}


#: Settings declared by plugins: name -> declaration (its ``owner`` the plugin's distribution).
_declared: dict[str, Setting] = {}
_declared_lock = threading.Lock()


def declare(items: Iterable[Setting], owner: str) -> None:
    """Declare the settings ``items`` of distribution ``owner`` (a plugin).
    Idempotent for the same declarations.  :class:`ConfigError` for a name
    that is not ``MONARCH_*``, of an unknown kind, or already declared by
    monarch-core or another distribution (nothing is declared then)."""
    items = [dataclasses.replace(s, owner=owner) for s in items]
    with _declared_lock:
        for s in items:
            if not isinstance(s.name, str) or not s.name.startswith("MONARCH_") or s.kind not in _KINDS:
                raise ConfigError(f"{owner} declares setting {s.name!r} of kind {s.kind!r}: a setting is named "
                                  f"MONARCH_* and has one of the kinds {sorted(_KINDS)}")
            other = SETTINGS.get(s.name) or _declared.get(s.name)
            if other is not None and other != s:
                raise ConfigError(f"{owner} declares setting {s.name}, which {other.owner} declares already; "
                                  f"a variable has one owner: rename it (MONARCH_<PLUGIN>_...)")
        for s in items:
            _declared[s.name] = s


def _lookup(name: str) -> Setting:
    s = SETTINGS.get(name) or _declared.get(name)
    if s is None:
        raise KeyError(
            f"{name} is not a declared setting: not monarch-core's, and no plugin loaded so far declares it "
            f"(a plugin declares its own with the monarch_settings hook; `monarch settings` lists them all)"
        )
    return s


def all_settings() -> list[Setting]:
    """The core's settings, then those plugins declared (in declaration order)."""
    with _declared_lock:
        return [*SETTINGS.values(), *_declared.values()]


def get(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of setting ``name`` from ``environ`` (default: the
    process environment).  Raises :class:`ConfigError` on a malformed value
    and :class:`KeyError` for a name that is not declared."""
    return _lookup(name).parse((os.environ if environ is None else environ).get(name))


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether setting ``name`` is given a (non-blank) value."""
    _lookup(name)
    raw = (os.environ if environ is None else environ).get(name)
    return raw is not None and bool(raw.strip())


def markdown_table(public: bool) -> str:
    """The settings table of README.md / docs/configuration.md: the core's
    and those of the plugins declared so far (``monarch settings`` loads them),
    the plugins' by distribution name whatever order they were declared in (a
    process that imported a plugin's module before loading the others declares
    its settings first)."""
    rows = ["| variable | default | meaning | read by |", "|---|---|---|---|"]
    core = len(SETTINGS)  # all_settings(): the core's first, then the plugins' in declaration order
    listed = all_settings()
    for s in listed[:core] + sorted(listed[core:], key=lambda s: s.owner):
        if s.public == public and s.name not in ("MONARCH_PROC_ID", "MONARCH_PROC_BOOTSTRAP"):
            rows.append(f"| `{s.name}` | {s.shown_default} | {s.meaning} | {s.owner} |")
    return "\n".join(rows) + "\n"


def print_tables() -> None:
    """Both tables, headed (``monarch settings``, ``python -m monarch_core.settings``)."""
    print("User settings:\n")
    print(markdown_table(True))
    print("Internal tuning knobs (not a stable interface):\n")
    print(markdown_table(False))


def _main(argv: list[str]) -> int:
    print("monarch-core's settings (with those of the installed plugins: `monarch settings`).\n")
    print_tables()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
