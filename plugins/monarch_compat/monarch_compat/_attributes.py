"""Attribute names of the reference that programs read on monarch-core objects.

Installed on monarch-core's classes when ``monarch`` is imported and, through
this distribution's plugin (:mod:`monarch_compat.plugin`), in every proc of a
program (an actor's code may run where ``monarch`` was never imported).  Each
is a read-only alias of a public monarch-core attribute; none replaces an
attribute monarch-core has (:func:`install` refuses to).

==================================  =====================================
reference                            monarch-core
==================================  =====================================
``mesh._labels``                     ``mesh.extent.labels``
``context().actor_instance.proc_mesh``  ``context().actor_instance.proc``
``DeviceMesh.exit()``                ``ProcMesh.exit()``: a method, ``monarch_tensor_engine.api.exit_engine``
==================================  =====================================

``proc_mesh`` differs on purpose: the reference's is the whole proc mesh the
actor was spawned on; monarch-core's ``proc`` is the actor's own proc (a proc
mesh of one), which is what an actor can use without reaching every other
rank's proc (docs/compat.md).
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["ATTRIBUTES", "install"]


def _labels(mesh: Any) -> tuple[str, ...]:
    """The mesh's dimension names (``mesh.extent.labels``)."""
    return tuple(mesh.extent.labels)


def _proc_mesh(instance: Any) -> Any:
    """The proc mesh of the proc this actor (or client) runs on (``.proc``)."""
    return instance.proc


def _exit(mesh: Any) -> None:
    """The reference's ``DeviceMesh.exit()`` (``spawn_tensor_engine(mesh).exit()``):
    stop the tensor engine's workers on this mesh's procs, which keep running
    (``monarch_tensor_engine.api.exit_engine``)."""
    from monarch_tensor_engine import api

    api.exit_engine(mesh)


def _targets() -> list[tuple[type, str, Callable[[Any], Any]]]:
    from monarch_core._actor._context import ActorInstance, ClientInstance
    from monarch_core._actor._proc_mesh import ProcMesh
    from monarch_core._mesh._shape import MeshTrait

    return [(MeshTrait, "_labels", _labels), (ActorInstance, "proc_mesh", _proc_mesh),
            (ClientInstance, "proc_mesh", _proc_mesh), (ProcMesh, "exit", _exit)]


#: (class name, attribute) of every alias :func:`install` adds
ATTRIBUTES = (("MeshTrait", "_labels"), ("ActorInstance", "proc_mesh"), ("ClientInstance", "proc_mesh"),
              ("ProcMesh", "exit"))

#: the aliases that are methods (the others are read-only properties)
_METHODS = {"exit"}


def install() -> None:
    """Add the aliases (idempotent).  ``RuntimeError`` if monarch-core has
    since defined one of these names itself: the alias would hide it."""
    for cls, name, fn in _targets():
        current = cls.__dict__.get(name)
        if current is fn or (isinstance(current, property) and current.fget is fn):
            continue
        if any(name in c.__dict__ for c in cls.__mro__):
            raise RuntimeError(f"monarch-compat: {cls.__qualname__}.{name} is now defined by monarch-core; "
                               f"this version of monarch-compat would hide it: upgrade monarch-compat")
        setattr(cls, name, fn if name in _METHODS else property(fn, doc=fn.__doc__))
