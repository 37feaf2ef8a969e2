"""The plugin contract of monarch-core: pluggy hookspecs for its seams.

This module, together with the public types it names, is the *only* thing a
plugin imports from monarch-core.  Nine families of hooks:

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
* **lifecycle** -- :func:`monarch_actor_stopped`,
  :func:`monarch_proc_stopping`, :func:`monarch_proc_stopped` and
  :func:`monarch_endpoint_raised` tell a plugin, inside the process where it
  happens, that an actor stopped, the process begins to stop or stopped, or
  an endpoint raised (release what an actor held; a post-mortem debugger);
* **settings** -- :func:`monarch_settings` declares the ``MONARCH_*``
  variables a plugin reads (:class:`Setting`, read with
  ``monarch_core.settings.get``);
* **telemetry** -- :func:`monarch_telemetry_sinks` yields sinks that receive,
  in the client, batches of :class:`TelemetryEvent` (spans, endpoint metrics,
  lifecycle events) recorded in every process of the program.
* **data plane** -- :func:`monarch_rdma_backends` yields :class:`RDMABackendSpec`
  descriptions of one-sided memory transfer paths (``ibverbs``,
  ``process_vm`` ...) behind ``monarch_core.rdma.RDMABuffer``; an
  :class:`RDMABackend` is resolved once per process, its
  :class:`RDMAConnection` once per peer proc; :func:`monarch_rdma_api`
  provides the names of ``monarch_core.rdma``.
* **tensor engine** -- :func:`monarch_tensor_engine` provides the
  distributed tensor engine (``ProcMesh.activate()``, the names of
  :data:`TENSOR_ENGINE_NAMES`).
* **spmd** -- :func:`monarch_spmd_api` provides the names of
  ``monarch_core.spmd`` (:data:`SPMD_NAMES`: ``SPMDActor``, ``launch`` ...).

Hooks are plain synchronous functions that *describe*, *decide* or *react*;
they are called once (when a transport is enabled, a host mesh is allocated, a
proc starts, or the kernel starts) or at a lifecycle event (an actor stopped,
an endpoint raised), never per message.  The objects they return do
the asynchronous work on the kernel's trio loop.

A plugin is a module with functions decorated by :data:`hookimpl`, declared in
its distribution's ``pyproject.toml``::

    [project.entry-points.monarch]
    mytransport = "my_package.plugin"

``monarch plugins`` lists what is installed.  ``MONARCH_DISABLED_PLUGINS=a,b``
blocks plugins by entry-point name.  Implementations are validated against
these specs when a plugin is registered (argument names; hook names, an
unknown one reported with the spec names it could have meant).  A plugin that
fails to import or to validate, or whose describing hook (``monarch_transports``,
``monarch_schedulers``, ``monarch_rdma_backends``, ``monarch_telemetry_sinks``)
raises, becomes one warning naming it, its distribution and the hook, and is
listed as failed or broken by ``monarch plugins``; the rest keep working.  Any
other hook that raises fails its operation with a ``PluginError`` naming the
plugin and the hook (``docs/plugin-authors.md``, "When a plugin breaks").

Errors: objects returned by plugins must raise only exceptions from
:mod:`monarch_core.errors` (``ConnectError``, ``ConnectionClosed``,
``ProtocolError``, ``TransportError``, ``ConfigError`` ...).  Map ``OSError``,
``trio`` and library exceptions at the plugin boundary.

See ``docs/plugin-authors.md`` for a walk-through and
:mod:`monarch_core.testing` for the conformance checks every transport should
pass.

Where it lives: this module is the contract's façade (import from it, as
plugins do); each seam is a private module of ``monarch_core._contract``,
and the names here are its objects (their ``__module__`` names that module):

* ``_contract/_common.py`` -- :data:`PROJECT_NAME`, :data:`hookspec`,
  :data:`hookimpl`;
* ``_contract/_transport.py`` -- :class:`Stream`, :class:`Listener`,
  :class:`Transport`, :class:`TransportSpec`, :data:`TRUST_ALL`,
  :data:`SESSION_CREDENTIALS`, :func:`monarch_transports` and its worked
  example;
* ``_contract/_scheduler.py`` -- :class:`Scheduler`, :class:`SchedulerSpec`,
  :class:`AllocationRequest`, :class:`WorkerLaunch`,
  :data:`WORKER_READY_PREFIX`, :func:`wait_worker_address`,
  :class:`Allocation`, :class:`HostHandle`, :func:`monarch_schedulers` and
  its worked example (:class:`Workspace`, :class:`SyncedHost`, :class:`Environment`
  and :func:`active_environment` come from ``monarch_core._workspace``);
* ``_contract/_bootstrap.py`` -- :func:`monarch_proc_env`,
  :func:`monarch_proc_setup`;
* ``_contract/_settings.py`` -- :func:`monarch_settings` (:class:`Setting`
  comes from ``monarch_core.settings``);
* ``_contract/_lifecycle.py`` -- :func:`monarch_actor_stopped`,
  :func:`monarch_proc_stopping`, :func:`monarch_proc_stopped`,
  :func:`monarch_endpoint_raised`;
* ``_contract/_telemetry.py`` -- :class:`TelemetryEvent`,
  :class:`TelemetrySink`, :func:`monarch_telemetry_sinks` and its worked
  example;
* ``_contract/_rdma.py`` -- the data plane's rules (preference order,
  errors, plain data), :class:`MemoryRegion`, :class:`RDMAPeer`,
  :class:`RemoteRegion`, :class:`RDMAConnection`, :class:`RDMABackend`,
  :class:`RDMABackendSpec`, :func:`monarch_rdma_backends` and its worked
  example, :func:`monarch_rdma_api`;
* ``_contract/_tensor.py`` -- :func:`monarch_tensor_engine`
  (:data:`TENSOR_ENGINE_NAMES` comes from ``monarch_core._compat``);
* ``_contract/_spmd.py`` -- :data:`SPMD_NAMES`, :func:`monarch_spmd_api`.

``monarch_core._plugins`` registers this module with pluggy
(``add_hookspecs``), which finds every hook specification here.
"""

from __future__ import annotations

from monarch_core._contract._bootstrap import monarch_proc_env, monarch_proc_setup
from monarch_core._contract._common import PROJECT_NAME, hookimpl, hookspec
from monarch_core._contract._lifecycle import (
    monarch_actor_stopped,
    monarch_endpoint_raised,
    monarch_proc_stopped,
    monarch_proc_stopping,
)
from monarch_core._contract._rdma import (
    MemoryRegion,
    RDMABackend,
    RDMABackendSpec,
    RDMAConnection,
    RDMAPeer,
    RemoteRegion,
    monarch_rdma_api,
    monarch_rdma_backends,
)
from monarch_core._contract._scheduler import (
    WORKER_READY_PREFIX,
    Allocation,
    AllocationRequest,
    HostHandle,
    Scheduler,
    SchedulerSpec,
    WorkerLaunch,
    monarch_schedulers,
    wait_worker_address,
)
from monarch_core._contract._telemetry import TelemetryEvent, TelemetrySink, monarch_telemetry_sinks
from monarch_core._contract._transport import (
    SESSION_CREDENTIALS,
    TRUST_ALL,
    Listener,
    Stream,
    Transport,
    TransportSpec,
    monarch_transports,
)
from monarch_core._contract._settings import monarch_settings
from monarch_core._contract._spmd import SPMD_NAMES, monarch_spmd_api
from monarch_core._contract._tensor import TENSOR_ENGINE_NAMES, monarch_tensor_engine
from monarch_core._workspace import Environment, SyncedHost, Workspace, active_environment
from monarch_core.settings import Setting

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
    "SyncedHost",
    "Environment",
    "active_environment",
    "hookimpl",
    "hookspec",
    "monarch_proc_env",
    "monarch_proc_setup",
    "monarch_actor_stopped",
    "monarch_endpoint_raised",
    "monarch_proc_stopping",
    "monarch_proc_stopped",
    "monarch_settings",
    "Setting",
    "monarch_rdma_api",
    "monarch_spmd_api",
    "SPMD_NAMES",
    "monarch_tensor_engine",
    "TENSOR_ENGINE_NAMES",
    "monarch_rdma_backends",
    "monarch_schedulers",
    "monarch_telemetry_sinks",
    "monarch_transports",
    "wait_worker_address",
]
