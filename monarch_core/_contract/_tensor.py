"""The distributed tensor engine's seam: one hook a plugin answers with the
engine (``monarch-tensor-engine`` does).

Public through :mod:`monarch_core.hookspecs`; import from there.
"""

from __future__ import annotations

from typing import Any

from monarch_core._compat import TENSOR_ENGINE_NAMES
from monarch_core._contract._common import hookspec

__all__ = ["TENSOR_ENGINE_NAMES", "monarch_tensor_engine"]


@hookspec(firstresult=True)
def monarch_tensor_engine() -> Any:
    """Provide the distributed tensor engine: an object (a module) with

    * ``activate(proc_mesh)`` -> a context manager: inside it, torch
      operations run on every proc of the mesh (``ProcMesh.activate()``);
    * ``rank_tensor(proc_mesh, dim)`` and ``rank_tensors(proc_mesh)``
      (``ProcMesh.rank_tensor``/``rank_tensors``);
    * ``process_group(proc_mesh, dims, backend)`` (``ProcMesh.process_group``);
    * ``random``: the module of the reference's ``monarch.random``
      (``monarch_core.random`` forwards to it);
    * ``rref(endpoint, args, kwargs)`` (``Endpoint.rref``);
    * every name of :data:`TENSOR_ENGINE_NAMES`, which ``monarch_core``
      re-exports lazily.

    The first plugin that answers is the engine.  Called when one of those
    is first used, never at import; without an engine each of them raises
    ``ImportError`` naming the distribution to install."""
