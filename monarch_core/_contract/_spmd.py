"""The torch.distributed launcher's seam: one hook a plugin answers with the
implementation of ``monarch_core.spmd`` (``monarch-spmd`` does).

Public through :mod:`monarch_core.hookspecs`; import from there.
"""

from __future__ import annotations

from typing import Any

from monarch_core._compat import SPMD_NAMES
from monarch_core._contract._common import hookspec

__all__ = ["SPMD_NAMES", "monarch_spmd_api"]


@hookspec(firstresult=True)
def monarch_spmd_api() -> Any:
    """Provide the implementation of ``monarch_core.spmd``: an object (a
    module) with every attribute of :data:`SPMD_NAMES` --
    ``SPMDActor`` (torchrun's environment in its proc, training scripts run
    there), ``setup_torch_elastic_env`` and ``setup_torch_elastic_env_async``,
    ``launch`` (a whole torchrun job on a host mesh), ``JobFailed``,
    ``RankFailure`` and ``ScriptError``.  The first plugin that answers
    provides them (``monarch-spmd`` does); with none installed, ``from
    monarch_core.spmd import SPMDActor`` raises ``ImportError`` naming the
    plugin to install (``AddrType`` and ``host_address`` come from
    ``monarch_core.runtime`` and need no plugin).  Called when a name is
    first used (at most once per name and process), never at import."""
