"""The ``monarch_core.actor`` API: the names of the reference ``monarch.actor``.

A façade: the work lives in private packages, and this module imports from
``_actor`` (actors, endpoints, meshes, context, channels, attach),
``_proc`` (``Future``, ``Port``/``PortReceiver``, ``MeshFailure``,
``returns_future``, ``ChannelTransport``), ``_launch`` (``BootstrapCommand``;
the runtime, lazily, for ``shutdown_context``), ``_mesh`` (``Extent``,
``Point``, ``ValueMesh``), ``_telemetry`` (``traced``), ``_workspace`` and
``errors``.  ``__all__`` is exactly the reference's documented names.
``ChannelTransport``, ``BootstrapCommand`` and ``Workspace`` (types named in
the reference's signatures) are importable from here too, and from
``monarch_core``; so are ``attach_to_workers``, ``run_worker_loop_forever``
(and ``run_worker_loop_until_shutdown``, the reference's name for the same loop)
(also in :mod:`monarch_core.worker`) and ``returns_future``, which programs
written for the reference import from ``monarch.actor``.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any, Callable

from monarch_core._actor._actor import Actor
from monarch_core._actor._actor_mesh import ActorMesh  # noqa: F401 (what spawn returns; importable, not in __all__)
from monarch_core._actor._attach import (  # noqa: F401 (importable, not in __all__)
    attach_to_workers,
    run_worker_loop_forever,
    run_worker_loop_until_shutdown,
)
from monarch_core._launch._bootstrap import BootstrapCommand, default_bootstrap_cmd  # noqa: F401 (importable, not in __all__)
from monarch_core._actor._context import Context, context, current_actor_name, current_rank, current_size
from monarch_core._actor._endpoint import (
    Accumulator,
    Endpoint,
    as_endpoint,
    concurrent_endpoint,
    endpoint,
    send,
)
from monarch_core._proc._future import Future
from monarch_core._proc._owned import returns_future  # noqa: F401 (importable, not in __all__)
from monarch_core._actor._mesh import (
    HostMesh,
    ProcMesh,
    get_or_spawn_controller,
    hosts_from_config,
    this_host,
    this_proc,
)
from monarch_core._actor._channel import Channel
from monarch_core._proc._port import Port, PortReceiver
from monarch_core._proc._supervision import MeshFailure
from monarch_core._proc import _supervision
from monarch_core._proc._transport import ChannelTransport, enable_transport  # noqa: F401 (importable, not in __all__)
from monarch_core._mesh._shape import Extent, Point
from monarch_core._mesh._value_mesh import ValueMesh
from monarch_core._telemetry import traced
from monarch_core._workspace import Workspace  # noqa: F401 (importable, not in __all__)
from monarch_core.errors import ActorError



class _ActorModule(types.ModuleType):
    """This module's type: ``unhandled_fault_hook`` is a property, so that
    assigning it (``monarch_core.actor.unhandled_fault_hook = fn``, the
    reference's way) sets the hook the supervision runtime calls."""

    @property
    def unhandled_fault_hook(self) -> Callable[[MeshFailure], Any]:
        """Called (on a helper thread of the client) with a failure nobody
        handled.  Assign a function to replace it: a normal return drops the
        fault; raising anything (including ``SystemExit``) leaves it unhandled.
        The default logs the report and leaves it unhandled, which ends the
        client with exit code 1."""
        return _supervision.fault_hook()

    @unhandled_fault_hook.setter
    def unhandled_fault_hook(self, fn: Callable[[MeshFailure], Any]) -> None:
        _supervision.set_fault_hook(fn)

    def __reduce__(self) -> Any:  # pickled by name, as a plain module is
        return (importlib.import_module, (self.__name__,))


sys.modules[__name__].__class__ = _ActorModule
if TYPE_CHECKING:  # what a type checker sees of that property (it cannot see the module's class)
    unhandled_fault_hook: Callable[[MeshFailure], Any]


def shutdown_context() -> Future[None]:
    """Stop every proc and actor this process owns and stop its kernel.

    Idempotent: later calls return an already-resolved future.  Runs
    automatically at interpreter exit."""
    from monarch_core._launch import _start

    _start.shutdown()
    return Future._resolved(None)


__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "Channel",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "ValueMesh",
    "as_endpoint",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "get_or_spawn_controller",
    "hosts_from_config",
    "send",
    "shutdown_context",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
]
