"""The reference's ``monarch.mesh_controller.spawn_tensor_engine``.

On monarch-core a proc mesh *is* its device mesh: ``with mesh.activate():``
runs torch on its procs through the tensor engine plugin, which starts its
workers on first use.  ``spawn_tensor_engine(mesh)`` returns ``mesh`` itself
(everything the reference's ``DeviceMesh`` is used for -- ``activate()``,
``rank_tensor``, ``slice``, ``process_group`` -- is a ``ProcMesh`` method),
with the engine's workers spawned on its procs (``ImportError`` naming the
plugin if it is not installed).  The reference's ``DeviceMesh.exit()`` is
``mesh.exit()`` (an alias monarch-compat adds to ``ProcMesh``:
``monarch_tensor_engine.api.exit_engine``): it stops those workers and
leaves the procs running; a later ``activate()`` or ``spawn_tensor_engine``
spawns new ones."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["spawn_tensor_engine"]

M = TypeVar("M")


def spawn_tensor_engine(proc_mesh: M) -> M:
    """``proc_mesh``, ready to ``activate()``, its engine's workers spawned."""
    import monarch_core

    monarch_core.Tensor  # noqa: B018  (loads the engine, or raises ImportError naming the plugin)
    from monarch_tensor_engine import api

    api.start_engine(proc_mesh)
    return proc_mesh
