"""The reference's ``monarch.mesh_controller.spawn_tensor_engine``.

On monarch-core a proc mesh *is* its device mesh: ``with mesh.activate():``
runs torch on its procs through the tensor engine plugin, which starts its
workers on first use.  ``spawn_tensor_engine(mesh)`` returns ``mesh`` itself
(everything the reference's ``DeviceMesh`` is used for -- ``activate()``,
``rank_tensor``, ``slice``, ``process_group`` -- is a ``ProcMesh`` method),
after checking that the plugin is installed (``ImportError`` naming it if
not).  The reference's ``DeviceMesh.exit()`` is not provided: the workers
stop with the mesh (``mesh.stop()``)."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["spawn_tensor_engine"]

M = TypeVar("M")


def spawn_tensor_engine(proc_mesh: M) -> M:
    """``proc_mesh``, ready to ``activate()`` (the tensor engine plugin loaded)."""
    import monarch_core

    monarch_core.Tensor  # noqa: B018  (loads the engine, or raises ImportError naming the plugin)
    return proc_mesh
