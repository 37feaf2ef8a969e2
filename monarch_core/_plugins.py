"""The plugin manager: loads plugins lazily, resolves names once.

Nothing here runs per message.  The manager is built on first use; transports
and schedulers are resolved by name into objects that the kernel then calls
directly.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from monarch_core import settings
from monarch_core import hookspecs
from monarch_core.errors import UnknownSchedulerError, UnknownTransportError

if TYPE_CHECKING:
    from importlib import metadata

logger = logging.getLogger("monarch.plugins")

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
        "(monarch_core.rdma.RDMABuffer: one-sided reads and writes of a proc's memory; its ibverbs and "
        "process_vm backends come from monarch-transport-rdma: pip install ./plugins/transport_rdma in a "
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
    "monarch-scheduler-ssh": "plugins/scheduler_ssh",
    "monarch-transport-rdma": "plugins/transport_rdma",
}


def install_hint(pkg: str, *, upgrade: bool = False) -> str:
    """How to install (or ``upgrade``) the project's plugin distribution ``pkg``."""
    folder = PLUGIN_DIRS.get(pkg)
    if folder is None:
        return f"{pkg} is not part of this monarch-core release yet"
    return f"pip install {'--upgrade ' if upgrade else ''}./{folder} (in a monarch-core checkout)"


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


class PluginRegistry:
    """A pluggy manager plus the name tables resolved from it (once)."""

    def __init__(self, *, load_entry_points: bool = True, resolved: list | None = None) -> None:
        """``resolved``: what :meth:`resolved` returned in a process with the
        same environment (a fork server's spawner): those plugins are loaded
        without scanning the installed distributions."""
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.infos: list[PluginInfo] = []
        self.failed: dict[str, str] = {}
        self._lock = threading.RLock()
        self._transport_specs: dict[str, hookspecs.TransportSpec] | None = None
        self._scheduler_specs: dict[str, hookspecs.SchedulerSpec] | None = None
        self._transports: dict[str, hookspecs.Transport] = {}
        blocked = set(settings.get(DISABLE_ENV))
        self.blocked = blocked
        self._resolved: list[tuple[str, str, str, str]] = []  # (name, entry point value, dist, version)
        from monarch_core import _builtins

        if resolved is not None:
            core_version, eps = resolved
            self._register("builtin", _builtins, "monarch-core", core_version)
            for name, value, dist_name, dist_version in eps:
                self._add_loaded(name, value, dist_name, dist_version, _load_value(value))
            return
        self._register("builtin", _builtins, "monarch-core", _core_version())
        if load_entry_points:
            self._load_entry_points()

    def resolved(self) -> tuple[str, list[tuple[str, str, str, str]]]:
        """The core's version and the plugins loaded from entry points, for
        ``PluginRegistry(resolved=...)`` in a process with the same environment."""
        return self.infos[0].version if self.infos else "0+unknown", list(self._resolved)

    def _add_loaded(self, name: str, value: str, dist_name: str, dist_version: str, module: Any) -> None:
        self.pm.register(module, name=name)
        self.infos.append(PluginInfo(name, dist_name, dist_version, module))
        self._resolved.append((name, value, dist_name, dist_version))

    # -- loading ---------------------------------------------------------
    def _register(self, name: str, module: Any, dist: str, version: str) -> None:
        if name in self.blocked:
            logger.info("plugin %r is disabled by %s", name, DISABLE_ENV)
            return
        self.pm.register(module, name=name)
        self.infos.append(PluginInfo(name, dist, version, module))

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
                msg = (
                    f"monarch plugin {ep.name!r} (from {dist_name} {dist_version}, entry point "
                    f"{ep.value!r}) failed to load and is disabled: {type(e).__name__}: {e}. "
                    f"Reinstall it, or set {DISABLE_ENV}={ep.name} to silence this warning."
                )
                self.failed[ep.name] = f"{type(e).__name__}: {e}"
                warnings.warn(msg, RuntimeWarning, stacklevel=2)
                logger.warning("%s", msg)
                continue

    # -- transports ------------------------------------------------------
    def transport_specs(self) -> dict[str, hookspecs.TransportSpec]:
        """Every accepted name/alias/scheme → its spec (first registration wins)."""
        with self._lock:
            if self._transport_specs is None:
                table: dict[str, hookspecs.TransportSpec] = {}
                for info in self.infos:
                    impl = getattr(info.module, "monarch_transports", None)
                    if impl is None:
                        continue
                    for spec in impl() or ():
                        info.transports.append(spec.name)
                        for key in (spec.name, *spec.aliases, *spec.schemes):
                            if key in table and table[key] is not spec:
                                logger.warning(
                                    "transport name %r claimed by plugin %r is already provided; ignoring",
                                    key,
                                    info.name,
                                )
                                continue
                            table[key] = spec
                self._transport_specs = table
            return self._transport_specs

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
                t = spec.load()
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
        return msg

    # -- schedulers ------------------------------------------------------
    def scheduler_specs(self) -> dict[str, hookspecs.SchedulerSpec]:
        with self._lock:
            if self._scheduler_specs is None:
                table: dict[str, hookspecs.SchedulerSpec] = {}
                for info in self.infos:
                    impl = getattr(info.module, "monarch_schedulers", None)
                    if impl is None:
                        continue
                    for spec in impl() or ():
                        info.schedulers.append(spec.name)
                        if spec.name in table:
                            logger.warning("scheduler %r from plugin %r is already provided; ignoring", spec.name, info.name)
                            continue
                        table[spec.name] = spec
                self._scheduler_specs = table
            return self._scheduler_specs

    def scheduler(self, name: str) -> hookspecs.Scheduler:
        spec = self.scheduler_specs().get(name)
        if spec is None:
            known = sorted(self.scheduler_specs())
            msg = f"no installed plugin provides the scheduler {name!r}. Installed schedulers: {known}."
            pkg = KNOWN_SCHEDULER_PACKAGES.get(name)
            if pkg:
                msg += f" {name!r} is provided by {pkg}: {install_hint(pkg)}."
            raise UnknownSchedulerError(msg)
        return spec.load()

    # -- listing ---------------------------------------------------------
    def describe(self) -> list[PluginInfo]:
        self.transport_specs()
        self.scheduler_specs()
        for info in self.infos:
            impl = getattr(info.module, "monarch_rdma_backends", None)
            if impl is not None and not info.rdma_backends:
                try:
                    info.rdma_backends = [spec.name for spec in impl() or ()]
                except Exception as e:  # noqa: BLE001 - listing must not fail
                    logger.warning("plugin %r: monarch_rdma_backends() failed: %s", info.name, e)
            info.hooks = sorted(
                h.name for h in self.pm.get_hookcallers(info.module) or () if h.name.startswith("monarch_")
            )
        return self.infos


def _load_value(value: str) -> Any:
    """What the entry point ``value`` (``"pkg.mod"`` or ``"pkg.mod:obj.attr"``) names."""
    import importlib

    mod_name, _, attrs = value.partition(":")
    obj = importlib.import_module(mod_name.strip())
    for a in filter(None, attrs.strip().split(".")):
        obj = getattr(obj, a)
    return obj


def _blocked_dists(reg: PluginRegistry) -> set[str]:
    from importlib import metadata

    out = set()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in reg.blocked and getattr(ep, "dist", None) is not None:
            out.add(ep.dist.metadata["Name"])
    return out


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _core_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("monarch-core")
    except metadata.PackageNotFoundError:
        return "0+unknown"


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
