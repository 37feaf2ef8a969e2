"""The plugin manager: loads plugins lazily, resolves names once.

Nothing here runs per message.  The manager is built on first use; transports
and schedulers are resolved by name into objects that the kernel then calls
directly.

The plugin boundary is here: every failure of a plugin is mapped into
:class:`~monarch_core.errors.PluginError` naming the plugin (its entry-point
name), its distribution and version, and the hook or factory that failed.

* A plugin that fails to import, whose hook implementations do not match the
  specs (pluggy's validation: unknown argument names; ``check_pending``:
  unknown hook names, reported with the spec names it could have meant), is
  *failed*: not registered, listed by ``monarch plugins``.
* A *description* hook (``monarch_transports``, ``monarch_schedulers``,
  ``monarch_rdma_backends``, ``monarch_telemetry_sinks``) that raises, or
  returns something other than its specs, makes the plugin *broken*: what it
  describes is left out, everything else (the built-ins included) works, and
  errors for a name it may have provided name it.
* Any other hook that raises (``monarch_proc_env``, ``monarch_proc_setup``)
  fails the operation that called it with a ``PluginError`` naming the plugin.
* A telemetry sink a plugin returns is guarded: an ``emit`` that raises is one
  WARNING under ``monarch.telemetry`` naming the plugin, then at most one a
  minute (:data:`SINK_WARNING_INTERVAL`), never a traceback (DEBUG has them).

Each such warning is given once per process: a :class:`RuntimeWarning`
(``warnings.warn``), with the same text at DEBUG under ``monarch.plugins``.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from monarch_core import settings
from monarch_core import hookspecs
from monarch_core._contract._common import _import_object
from monarch_core.errors import ConfigError, MonarchError, PluginError, UnknownSchedulerError, UnknownTransportError

if TYPE_CHECKING:
    from importlib import metadata

logger = logging.getLogger("monarch.plugins")
sink_logger = logging.getLogger("monarch.telemetry")

#: Hooks that describe what a plugin provides: one that raises leaves that out
#: (the plugin is listed as broken), the rest of the process carries on.
DESCRIPTION_HOOKS = {
    "monarch_transports": hookspecs.TransportSpec,
    "monarch_schedulers": hookspecs.SchedulerSpec,
    "monarch_rdma_backends": hookspecs.RDMABackendSpec,
    "monarch_telemetry_sinks": None,  # any object with emit(events)
    "monarch_settings": settings.Setting,
}
#: Seconds between two WARNING lines about one plugin sink whose ``emit`` raises.
SINK_WARNING_INTERVAL = 60.0

ENTRY_POINT_GROUP = "monarch"
DISABLE_ENV = "MONARCH_DISABLED_PLUGINS"

#: Names the project's own plugins provide, and the distribution that does.
KNOWN_TRANSPORT_PACKAGES = {
    "tcp": "monarch-transport-tcp",
    "tls": "monarch-transport-tcp",
}
#: Names users try as a transport that are something else.
NOT_TRANSPORTS = {
    "rdma": (
        "'rdma' is not a transport: RDMA is monarch-core's data plane, beside whichever transport is enabled "
        "(monarch_core.rdma.RDMABuffer: one-sided reads and writes of a proc's memory; it and its channel, "
        "ibverbs and process_vm backends come from monarch-transport-rdma: pip install ./plugins/transport_rdma in a "
        "monarch-core checkout; see docs/rdma.md). Enable 'ipc', 'tcp' or 'tls' for messages."
    ),
}
KNOWN_SCHEDULER_PACKAGES = {
    "ssh": "monarch-scheduler-ssh",
    "slurm": "monarch-scheduler-slurm",
}
#: Where each of those distributions lives in a monarch-core checkout (the
#: project's plugins install by path).  One not listed is not part of this
#: release yet.
PLUGIN_DIRS = {
    "monarch-transport-tcp": "plugins/transport_tcp",
    "monarch-scheduler-slurm": "plugins/scheduler_slurm",
    "monarch-scheduler-ssh": "plugins/scheduler_ssh",
    "monarch-transport-rdma": "plugins/transport_rdma",
    "monarch-telemetry-otel": "plugins/telemetry_otel",
    "monarch-dashboard": "plugins/dashboard",
    "monarch-debugger": "plugins/debugger",
    "monarch-tensor-engine": "plugins/tensor_engine",
    "monarch-spmd": "plugins/spmd",
}
#: The project's distributions each of those requires besides the core (from
#: the plugins' ``pyproject.toml``): nothing of the project is on an index, so
#: an install line names them too.
PLUGIN_NEEDS = {
    "monarch-scheduler-slurm": ("monarch-transport-tcp",),
    "monarch-scheduler-ssh": ("monarch-transport-tcp",),
}


def install_hint(pkg: str, *, upgrade: bool = False) -> str:
    """How to install (or ``upgrade``) the project's plugin distribution ``pkg``:
    one ``pip install`` line from a checkout naming the core, the project
    distributions ``pkg`` requires and ``pkg`` itself, by path."""
    folder = PLUGIN_DIRS.get(pkg)
    if folder is None:
        return f"{pkg} is not part of this monarch-core release yet"
    paths = [".", *(f"./{PLUGIN_DIRS[d]}" for d in PLUGIN_NEEDS.get(pkg, ())), f"./{folder}"]
    return f"pip install {'--upgrade ' if upgrade else ''}{' '.join(paths)} (in a monarch-core checkout)"


def provided(hook: str, distribution: str, needed_for: str, offers: str) -> Any:
    """What the first plugin answering the ``firstresult`` hook ``hook`` gives
    (a façade's provider: ``monarch_core.rdma``, ``monarch_core.spmd``, the
    tensor engine), or ``ImportError``: ``needed_for`` needs ``distribution``
    (which ``offers`` that), with the line that installs it."""
    got = getattr(registry().pm.hook, hook)()
    if got is None:
        raise ImportError(f"{needed_for}, and none is installed here: {install_hint(distribution)} "
                          f"({distribution}: {offers})")
    return got


@dataclass
class PluginInfo:
    """One registered plugin, as ``monarch plugins`` shows it."""

    name: str
    distribution: str
    version: str
    module: Any
    transports: list[str] = field(default_factory=list)
    schedulers: list[str] = field(default_factory=list)
    rdma_backends: list[str] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)
    #: What failed in it after it loaded, one line per hook
    #: (``"monarch_schedulers() raised RuntimeError: ..."``); empty: it works.
    problems: list[str] = field(default_factory=list)

    @property
    def origin(self) -> str:
        """``plugin 'name' (from dist version)``, how errors name it."""
        return f"plugin {self.name!r} (from {self.distribution} {self.version})"

    def fix(self) -> str:
        """What the user can do about a broken plugin."""
        return (f"Fix or upgrade {self.distribution}, or set {DISABLE_ENV}={self.name} "
                f"to run without it")


class PluginRegistry:
    """A pluggy manager plus the name tables resolved from it (once)."""

    def __init__(self, *, load_entry_points: bool = True, resolved: tuple | None = None) -> None:
        """``resolved``: what :meth:`resolved` returned in a process with the
        same environment (a fork server's spawner): those plugins are loaded
        without scanning the installed distributions."""
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.infos: list[PluginInfo] = []
        #: entry-point name -> why it failed to load (not registered)
        self.failed: dict[str, str] = {}
        #: entry-point name -> (distribution, version) of those that failed to load
        self.failed_from: dict[str, tuple[str, str]] = {}
        self._providers: dict[str, PluginInfo] = {}  # transport/scheduler spec name -> its plugin
        self._lock = threading.RLock()
        self._specs: dict[str, dict[str, Any]] = {}  # "transport"/"scheduler" -> name -> spec, built once
        self._transports: dict[str, hookspecs.Transport] = {}
        blocked = set(settings.get(DISABLE_ENV))
        self.blocked = blocked
        self._resolved: list[tuple[str, str, str, str]] = []  # (name, entry point value, dist, version)
        from monarch_core import _builtins
        # (the core's version from monarch_core._version: reading the installed
        # distribution's metadata cost ~25 ms on every start of a client, a fork
        # server and an exec'd proc)
        from monarch_core._version import __version__

        core_version, eps = resolved if resolved is not None else (__version__, None)
        self._register("builtin", _builtins, "monarch-core", core_version)
        if eps is not None:
            for name, value, dist_name, dist_version in eps:
                self._add_loaded(name, value, dist_name, dist_version, _import_object(value))
        elif load_entry_points:
            self._load_entry_points()

    def resolved(self) -> tuple[str, list[tuple[str, str, str, str]]]:
        """The core's version and the plugins loaded from entry points, for
        ``PluginRegistry(resolved=...)`` in a process with the same environment."""
        return self.infos[0].version if self.infos else "0+unknown", list(self._resolved)

    def _add_loaded(self, name: str, value: str, dist_name: str, dist_version: str, module: Any) -> None:
        self._add(PluginInfo(name, dist_name, dist_version, module))
        self._resolved.append((name, value, dist_name, dist_version))

    # -- loading ---------------------------------------------------------
    def _register(self, name: str, module: Any, dist: str, version: str) -> None:
        if name in self.blocked:
            logger.info("plugin %r is disabled by %s", name, DISABLE_ENV)
            return
        self._add(PluginInfo(name, dist, version, module))

    def _add(self, info: PluginInfo) -> None:
        """Register ``info.module``, validated against the specs (pluggy checks
        the argument names at ``register``, :meth:`pluggy.PluginManager.check_pending`
        the hook names), its hook implementations guarded.  Raises
        :class:`PluginError` (nothing registered) for an invalid plugin."""
        try:
            self.pm.register(info.module, name=info.name)
        except pluggy.PluginValidationError as e:
            raise PluginError(" ".join(str(e).split())) from None
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError:
            unknown = sorted(h.name for h in self.pm.get_hookcallers(info.module) or () if not h.has_spec())
            self.pm.unregister(info.module)
            raise PluginError("; ".join(self._unknown_hook(n) for n in unknown)) from None
        for caller in self.pm.get_hookcallers(info.module) or ():
            for impl in caller.get_hookimpls():
                if impl.plugin is info.module and not (impl.wrapper or impl.hookwrapper):
                    # pluggy calls ``impl.function``: the plugin boundary is this
                    # one wrapper per hook implementation (no cost per message:
                    # no hook is called there).
                    setattr(impl, "function", self._guard(info, caller.name, impl.function))
        self.infos.append(info)
        declared = self._describe(info, "monarch_settings")
        if declared:
            try:
                settings.declare(declared, info.distribution)
            except ConfigError as e:
                self._broken(info, f"monarch_settings(): {e}")

    def _unknown_hook(self, name: str) -> str:
        specs = sorted(n for n in vars(self.pm.hook) if not n.startswith("_") and getattr(self.pm.hook, n).has_spec())
        close = difflib.get_close_matches(name, specs, n=3, cutoff=0.6)
        meant = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else f"the hooks are {specs}."
        return f"unknown hook {name!r} ({meant} The hooks are specified in monarch_core.hookspecs)"

    def _guard(self, info: PluginInfo, hook: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (``info``'s implementation of ``hook``) behind the plugin boundary."""

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                out = fn(*args, **kwargs)
            except Exception as e:
                if hook in DESCRIPTION_HOOKS:
                    self._broken(info, f"{hook}() raised {type(e).__name__}: {e}", e)
                    return None  # pluggy leaves None out of the results
                if isinstance(e, MonarchError):
                    raise  # a plugin's own error in our tree says what it means
                raise PluginError(
                    f"{info.origin} failed in its hook {hook}(): {type(e).__name__}: {e}. {info.fix()}."
                ) from e
            if hook in DESCRIPTION_HOOKS:
                specs = self._checked(info, hook, out)
                if hook == "monarch_telemetry_sinks":
                    return [GuardedSink(s, info) for s in specs]
                return specs
            return out

        return guarded

    def _checked(self, info: PluginInfo, hook: str, out: Any) -> list[Any]:
        """The items of what the description ``hook`` returned, those of the wrong type left out (broken)."""
        want = DESCRIPTION_HOOKS[hook]
        try:
            items = list(out or ())
        except TypeError:
            self._broken(info, f"{hook}() returned {type(out).__name__}, not a list")
            return []
        good = []
        for item in items:
            if want is not None and not isinstance(item, want):
                self._broken(info, f"{hook}() returned {item!r}, not a {want.__name__}")
            elif want is None and not callable(getattr(item, "emit", None)):
                self._broken(info, f"{hook}() returned {item!r}, which has no emit(events) method")
            else:
                good.append(item)
        return good

    def _broken(self, info: PluginInfo, problem: str, exc: BaseException | None = None) -> None:
        """``info`` is broken: ``problem``, kept for ``monarch plugins`` and warned about (once)."""
        with self._lock:
            if problem not in info.problems:
                info.problems.append(problem)
        warn_once(f"monarch {info.origin} is broken: {problem}; what it provides through that hook is not used. "
                  f"{info.fix()}.", exc)

    def _describe(self, info: PluginInfo, hook: str) -> list[Any]:
        """What ``info``'s description ``hook`` returns (behind the boundary:
        the plugin is broken, and nothing returned, if it raises)."""
        impl = getattr(info.module, hook, None)
        if impl is None:
            return []
        return self._guard(info, hook, impl)() or []

    def broken_note(self) -> str:
        """A sentence naming the plugins that failed to load or are broken
        (for errors about a name one of them may have provided); '' if none."""
        parts = [f"{n!r} (from {' '.join(self.failed_from.get(n, ('?', '?')))}) failed to load: {why}"
                 for n, why in sorted(self.failed.items())]
        parts += [f"{i.name!r} (from {i.distribution} {i.version}) is broken: {'; '.join(i.problems)}"
                  for i in self.infos if i.problems]
        if not parts:
            return ""
        return (" It may come from a plugin that does not work: " + ". ".join(parts)
                + f" (see `monarch plugins`; fix the plugin, or set {DISABLE_ENV} to its name).")

    def _load_entry_points(self) -> None:
        from importlib import metadata

        eps = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
        for ep in eps:
            if ep.name in self.blocked:
                logger.info("plugin %r is disabled by %s", ep.name, DISABLE_ENV)
                continue
            dist = getattr(ep, "dist", None)
            dist_name = dist.metadata["Name"] if dist is not None else "?"
            dist_version = dist.version if dist is not None else "?"
            try:
                module = ep.load()
                self._add_loaded(ep.name, ep.value, dist_name, dist_version, module)
            except Exception as e:  # a broken plugin must not break the others
                why = str(e) if isinstance(e, PluginError) else f"{type(e).__name__}: {e}"
                msg = (
                    f"monarch plugin {ep.name!r} (from {dist_name} {dist_version}, entry point "
                    f"{ep.value!r}) failed to load and is disabled: {why}. "
                    + ("Fix or upgrade it" if isinstance(e, PluginError) else "Reinstall it")
                    + f", or set {DISABLE_ENV}={ep.name} to silence this warning."
                )
                self.failed[ep.name] = why
                self.failed_from[ep.name] = (dist_name, dist_version)
                warn_once(msg)

    def _spec_table(self, kind: str) -> dict[str, Any]:
        """The specs of ``kind`` (``"transport"``/``"scheduler"``) by every
        name they accept (a transport: its aliases and schemes too), built
        once from the ``monarch_<kind>s`` hooks; the first registration wins."""
        with self._lock:
            table = self._specs.get(kind)
            if table is None:
                table = {}
                for info in self.infos:
                    for spec in self._describe(info, f"monarch_{kind}s"):
                        getattr(info, f"{kind}s").append(spec.name)
                        self._providers.setdefault(f"{kind}:{spec.name}", info)
                        names = (spec.name, *spec.aliases, *spec.schemes) if kind == "transport" else (spec.name,)
                        for key in names:
                            if key in table and table[key] is not spec:
                                logger.warning("%s name %r claimed by plugin %r is already provided; ignoring",
                                               kind, key, info.name)
                                continue
                            table[key] = spec
                self._specs[kind] = table
            return table

    # -- transports ------------------------------------------------------
    def transport_specs(self) -> dict[str, hookspecs.TransportSpec]:
        """Every accepted name/alias/scheme → its spec (first registration wins)."""
        return self._spec_table("transport")

    def transport(self, name: str) -> hookspecs.Transport:
        """The transport for a name, alias or URL scheme (instantiated once)."""
        with self._lock:
            t = self._transports.get(name)
            if t is not None:
                return t
            spec = self.transport_specs().get(name)
            if spec is None:
                raise UnknownTransportError(self.unknown_transport_message(name))
            t = self._transports.get(spec.name)
            if t is None:
                t = self._load(spec, "transport")
                if getattr(t, "name", None) != spec.name:
                    # Procs find their transport again by this name: a class
                    # attribute inherited from another transport (``tcp``)
                    # would start them on that one, unable to parse our URLs.
                    if getattr(t, "name", ""):
                        logger.warning(
                            "transport %r: its object's name is %r; using %r (set Transport.name to the "
                            "TransportSpec's name)", spec.name, t.name, spec.name,
                        )
                    t.name = spec.name
                self._transports[spec.name] = t
            self._transports[name] = t
            return t

    def unknown_transport_message(self, name: str) -> str:
        known = sorted({s.name for s in self.transport_specs().values()})
        schemes = sorted({sc for s in self.transport_specs().values() for sc in s.schemes})
        msg = f"no installed plugin provides the transport {name!r}. Installed transports: {known or 'none'}"
        msg += f" (URL schemes: {schemes or 'none'})."
        pkg = KNOWN_TRANSPORT_PACKAGES.get(name)
        if name in NOT_TRANSPORTS:
            msg += " " + NOT_TRANSPORTS[name]
        elif pkg:
            installed = _dist_version(pkg)
            if pkg in _blocked_dists(self):
                msg += (
                    f" {name!r} is provided by {pkg}, which is installed but disabled by "
                    f"{DISABLE_ENV}={os.environ.get(DISABLE_ENV, '')}; remove it from that list."
                )
            elif installed is not None:
                msg += (
                    f" {name!r} comes from {pkg}, but the installed {pkg} {installed} does not provide it; "
                    f"upgrade it: {install_hint(pkg, upgrade=True)}."
                )
            else:
                msg += f" {name!r} is provided by {pkg}: {install_hint(pkg)}."
        else:
            msg += " Check the spelling, or install the plugin that provides it."
        return msg + self.broken_note()

    def _load(self, spec: Any, kind: str) -> Any:
        """``spec.load()``, its failure a :class:`PluginError` naming the plugin
        that provided ``spec``, the factory and (a module missing) how to install it."""
        try:
            return spec.load()
        except Exception as e:
            info = self._providers.get(f"{kind}:{spec.name}")
            origin = info.origin if info is not None else "its plugin"
            factory = spec.factory if isinstance(spec.factory, str) else getattr(spec.factory, "__qualname__", spec.factory)
            what = f"the {kind} {spec.name!r} of {origin}: its factory {factory!r}"
            if isinstance(e, ModuleNotFoundError) and e.name:
                dist = info.distribution if info is not None else "the plugin"
                if dist in PLUGIN_DIRS:
                    hint = f"reinstall {dist} with its dependencies: {install_hint(dist)}"
                else:
                    hint = (f"install the distribution that provides the module {e.name!r} (a dependency of {dist}), "
                            f"or reinstall {dist} with its dependencies")
                msg = f"{what} needs the module {e.name!r}, which is not installed; {hint}."
            else:
                msg = f"{what} failed: {type(e).__name__}: {e}."
            if info is not None:
                msg += f" Or set {DISABLE_ENV}={info.name} to run without it."
            raise PluginError(msg) from e

    # -- schedulers ------------------------------------------------------
    def scheduler_specs(self) -> dict[str, hookspecs.SchedulerSpec]:
        return self._spec_table("scheduler")

    def scheduler(self, name: str) -> hookspecs.Scheduler:
        spec = self.scheduler_specs().get(name)
        if spec is None:
            known = sorted(self.scheduler_specs())
            msg = f"no installed plugin provides the scheduler {name!r}. Installed schedulers: {known}."
            pkg = KNOWN_SCHEDULER_PACKAGES.get(name)
            if pkg:
                msg += f" {name!r} is provided by {pkg}: {install_hint(pkg)}."
            raise UnknownSchedulerError(msg + self.broken_note())
        return self._load(spec, "scheduler")

    # -- listing ---------------------------------------------------------
    def describe(self) -> list[PluginInfo]:
        self.transport_specs()
        self.scheduler_specs()
        for info in self.infos:
            if not info.rdma_backends:
                info.rdma_backends = [spec.name for spec in self._describe(info, "monarch_rdma_backends")]
            info.hooks = sorted(
                h.name for h in self.pm.get_hookcallers(info.module) or () if h.name.startswith("monarch_")
            )
        return self.infos


class GuardedSink:
    """A telemetry sink a plugin returned, behind the plugin boundary: its
    ``emit`` raising is logged (WARNING, ``monarch.telemetry``, naming the
    plugin) at most once per :data:`SINK_WARNING_INTERVAL` seconds, the next
    line counting the failures left out; the tracebacks are at DEBUG.  The
    events of a failed ``emit`` are that sink's loss only.  The plugin's own
    object is :attr:`wrapped`."""

    def __init__(self, sink: Any, info: PluginInfo) -> None:
        #: the plugin's sink
        self.wrapped = sink
        self.info = info
        self._lock = threading.Lock()
        self._last: float | None = None  # monotonic time of the last WARNING
        self._left_out = 0
        if callable(getattr(sink, "emit_batches", None)):  # a sink that reads raw batches keeps that path
            self.emit_batches = self._emit_batches

    def _emit_batches(self, batches: Any) -> None:
        self._call("emit_batches", batches)

    @property
    def kinds(self) -> Any:
        """The wrapped sink's ``kinds`` (None: every kind)."""
        return getattr(self.wrapped, "kinds", None)

    def emit(self, events: Any) -> None:
        """Hand ``events`` to the sink; a failure is logged, never raised."""
        self._call("emit", events)

    def close(self) -> None:
        """Close the sink (if it has ``close``); a failure is logged, never raised."""
        if getattr(self.wrapped, "close", None) is not None:
            self._call("close", always=True)

    def _call(self, op: str, *args: Any, always: bool = False) -> None:
        """The wrapped sink's ``op(*args)``; a failure is logged (:meth:`_failed`)."""
        try:
            getattr(self.wrapped, op)(*args)
        except Exception as e:  # noqa: BLE001 - one sink must not stop the others
            self._failed(op, e, always=always)

    def _failed(self, op: str, e: Exception, *, always: bool = False) -> None:
        sink_logger.debug("telemetry sink %r of %s: %s() failed", self.wrapped, self.info.origin, op, exc_info=True)
        now = time.monotonic()
        with self._lock:
            if not always and self._last is not None and now - self._last < SINK_WARNING_INTERVAL:
                self._left_out += 1
                return
            left_out, self._left_out = self._left_out, 0
            self._last = now
        more = f" ({left_out} more failure(s) since the last such line)" if left_out else ""
        sink_logger.warning(
            "telemetry sink %r of %s failed in %s(): %s: %s%s; its events are dropped while it fails "
            "(logged at most once every %gs; DEBUG shows the tracebacks). %s.",
            self.wrapped, self.info.origin, op, type(e).__name__, e, more, SINK_WARNING_INTERVAL, self.info.fix(),
        )

    def __repr__(self) -> str:
        return f"{self.wrapped!r} (from {self.info.origin})"


_CORE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(message: str, exc: BaseException | None = None) -> None:
    """``message`` as a :class:`RuntimeWarning`, once per process (and at DEBUG
    under ``monarch.plugins``, with ``exc``'s traceback)."""
    with _warned_lock:
        if message in _warned:
            return
        _warned.add(message)
    logger.debug("%s", message, exc_info=exc)
    if sys.version_info >= (3, 12):  # attributed to the first caller outside monarch_core
        warnings.warn(message, RuntimeWarning, skip_file_prefixes=(_CORE_DIR,))
    else:  # pragma: no cover - Python 3.10/3.11
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def broken_note() -> str:
    """:meth:`PluginRegistry.broken_note` of the process-wide registry ('' if
    it is not built yet)."""
    reg = _registry
    return reg.broken_note() if reg is not None else ""


def _blocked_dists(reg: PluginRegistry) -> set[str]:
    from importlib import metadata

    out = set()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        if ep.name in reg.blocked and dist is not None:
            out.add(dist.metadata["Name"])
    return out


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


_registry: PluginRegistry | None = None
_registry_lock = threading.Lock()


def registry() -> PluginRegistry:
    """The process-wide registry, built on first use."""
    global _registry
    reg = _registry
    if reg is None:
        with _registry_lock:
            if _registry is None:
                _registry = PluginRegistry()
            reg = _registry
    return reg


def adopt_registry(resolved: tuple) -> bool:
    """Build the process-wide registry from a spawner's :meth:`PluginRegistry.resolved`
    (a fork server does this, so that the procs it forks do not scan the
    installed distributions).  False, and nothing adopted, if one exists
    already or a listed plugin fails to load (the normal scan then runs)."""
    global _registry
    with _registry_lock:
        if _registry is not None:
            return False
        try:
            _registry = PluginRegistry(resolved=resolved)
        except Exception as e:  # noqa: BLE001 - fall back to the scan
            logger.debug("could not adopt the spawner's plugins (%s); scanning", e)
            return False
        return True


def reset_registry() -> None:
    """Forget the registry (tests use this after changing the environment)."""
    global _registry
    with _registry_lock:
        _registry = None
