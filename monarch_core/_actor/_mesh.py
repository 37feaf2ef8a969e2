"""The mesh/API layer's entry points: ``this_proc``, ``this_host``, ``hosts_from_config``.

The mesh objects live in a module each: ``ActorMesh`` in ``_actor_mesh``,
``ProcMesh`` in ``_proc_mesh``, ``HostMesh`` in ``_host_mesh``; controllers in
``_controller``, ``attach`` in ``_attach``, the shared ``_ProcSlot`` in
``_mesh_base``.  They are importable from here too.
"""

from __future__ import annotations

import logging
from typing import Any

from monarch_core._launch import _start
from monarch_core._proc import _state
from monarch_core._actor import FORK_SERVER_WARM
from monarch_core._actor._actor_mesh import ActorMesh
from monarch_core._actor._attach import ATTACH_TIMEOUT, attach
from monarch_core._actor._controller import get_or_spawn_controller
from monarch_core._proc._future import Future
from monarch_core._actor._host_mesh import HostMesh
from monarch_core._actor._mesh_base import _EMPTY_REGION, START_TIMEOUT, _ProcSlot
from monarch_core._actor._proc_mesh import ProcMesh
from monarch_core._mesh._shape import Extent
from monarch_core.errors import ConfigError

__all__ = [
    "ATTACH_TIMEOUT", "START_TIMEOUT", "ActorMesh", "HostMesh", "ProcMesh", "attach", "get_or_spawn_controller",
    "allocate_entry", "host_mesh_of", "hosts_from_config", "this_host", "this_proc",
]

logger = logging.getLogger("monarch.mesh")


def this_proc() -> ProcMesh:
    """The proc this code runs in (the client's own process on the client)."""
    _start.ensure_runtime()
    rt = _state.current()
    pm = rt.caches.get("this_proc")
    if pm is None:
        slot = _ProcSlot(rt.proc_id, rt.kernel.address)
        pm = ProcMesh(rt.proc_mesh_name, [slot], _EMPTY_REGION, None, Future._resolved(True)._ensure(), False)
        rt.caches["this_proc"] = pm
    return pm


def this_host() -> HostMesh:
    """The machine this code runs on, as a one-host ``HostMesh`` (no
    dimensions).  Procs spawned from it are started by this process: forked
    from its fork server (``_zygote``), or exec'd as its children, and they
    die with it."""
    from monarch_core._launch import _fork_server
    from monarch_core.hookspecs import HostHandle

    rt = _fork_server.runtime_with_fork_server(FORK_SERVER_WARM)

    if not rt.caches.get("this_host_announced"):
        rt.caches["this_host_announced"] = True
        rt.events.emit("host_mesh_spawned", mesh="this_host", hosts=["localhost"], scheduler="this_host")
    return HostMesh([HostHandle("localhost")], _EMPTY_REGION, owner=True, name="this_host")


def hosts_from_config(name: str, *, timeout: float | None = None) -> HostMesh:
    """The host mesh ``name`` from the project's configuration.

    Looks up ``[hosts.<name>]`` in ``monarch.toml`` (or ``[tool.monarch.hosts.<name>]``
    in ``pyproject.toml``; ``MONARCH_CONFIG`` overrides the path), resolves its
    ``scheduler`` through the installed plugins, allocates the hosts (off the
    kernel loop) and waits until every worker loop answers, all within
    ``timeout`` seconds (default ``MONARCH_ALLOCATE_TIMEOUT`` or 300).
    See ``docs/configuration.md``.  Errors name the file and list what is
    configured and installed; ``AllocationError`` when the scheduler fails or
    a host does not answer (naming it).

    With no configuration file at all, the zero-config default
    (``_config.default_host_mesh``, one INFO line): inside a Slurm
    allocation the allocation itself, elsewhere two hosts on this machine.
    """
    from monarch_core._config import default_host_mesh, find_config_file, lookup_host_mesh
    from monarch_core._plugins import registry

    if not isinstance(name, str) or not name:
        raise TypeError(f"hosts_from_config(name): name must be a non-empty str, got {name!r}")
    reg = registry()
    installed = sorted(reg.scheduler_specs())
    lookup = default_host_mesh if find_config_file() is None else lookup_host_mesh
    cfg = lookup(name, installed_schedulers=installed)
    return allocate_entry(cfg, timeout=timeout)


def allocate_entry(cfg: Any, *, timeout: float | None = None, wrap: Any = None) -> HostMesh:
    """The owning ``HostMesh`` of one host mesh entry ``cfg`` (a
    ``_config.HostMeshConfig``: from the project's configuration, or built by
    ``monarch_core.job`` from a job's arguments): resolve its scheduler, check
    its parameters, prepare the transport, allocate and wait (see
    :func:`hosts_from_config`, which is this after the lookup).  ``wrap``: a
    function given the scheduler that returns the one to allocate with (a
    job's, which keeps its allocation past the client: ``monarch_core.job``)."""
    from monarch_core._launch import _alloc
    from monarch_core._plugins import registry
    from monarch_core.hookspecs import AllocationRequest

    scheduler = registry().scheduler(cfg.scheduler)
    params = _scheduler_params(scheduler, cfg)
    if wrap is not None:
        scheduler = wrap(scheduler)
    request = AllocationRequest(name=cfg.name, params=params, source=cfg.source)
    scheduler.validate(request)
    _check_params(scheduler, request)
    _alloc.prepare_transport(scheduler, request)
    # the client's runtime starts while the scheduler starts the hosts
    record = _alloc.allocate(scheduler, request, _start.ensure_runtime, timeout)
    return host_mesh_of(record, cfg.name)


def host_mesh_of(record: Any, name: str) -> HostMesh:
    """The owning ``HostMesh`` over an allocation (``_launch._alloc.allocate``)."""
    region = Extent(list(record.labels), list(record.sizes)).region
    hm = HostMesh(list(record.hosts), region, owner=True, allocation=record, name=name)
    hm._shared["owner"] = _state.current_actor.get()  # who hears its notices (None: this process)
    _start.ensure_runtime()
    _state.current().events.emit("host_mesh_spawned", mesh=name, hosts=[h.name for h in record.hosts],
                                 scheduler=getattr(record.scheduler, "name", None))
    record.on_lost = hm._host_lost
    for host_name, reason in list(record.lost.items()):  # reported while allocating
        hm._host_lost(host_name, reason)
    for host_name, message in record.listen_notices(hm._host_notice):  # reported while allocating
        hm._host_notice(host_name, message)
    _state.current().agent.register_owned(hm)
    return hm


def _scheduler_params(scheduler: Any, cfg: Any) -> dict[str, Any]:
    """The ``[defaults]`` policy: a scheduler that declares ``params`` does not
    get ``[defaults]`` keys outside them (logged at DEBUG); the entry's own
    keys all reach it (its ``validate`` names the unknown ones, or
    :func:`_check_params` does)."""
    accepted = getattr(scheduler, "params", None)
    params = dict(cfg.params)
    if accepted is None:
        return params
    from_defaults: frozenset[str] = getattr(cfg, "defaults_keys", frozenset())
    dropped = sorted(k for k in params if k not in accepted and k in from_defaults)
    if dropped:
        logger.debug("%s: [defaults] key(s) %s are not parameters of scheduler %r; not passed to it",
                     cfg.source, dropped, cfg.scheduler)
    return {k: v for k, v in params.items() if k not in dropped}


def _check_params(scheduler: Any, request: Any) -> None:
    accepted: Any = getattr(scheduler, "params", None)
    unknown = sorted(k for k in request.params if accepted is not None and k not in accepted)
    if unknown:
        raise ConfigError(
            f"{request.source}: unknown parameter(s) {unknown} for scheduler {scheduler.name!r}; "
            f"it accepts {sorted(accepted)}"
        )
