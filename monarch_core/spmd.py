"""``monarch_core.spmd``: ``torch.distributed`` programs on meshes (the
reference's ``monarch.spmd``).

``setup_torch_elastic_env(proc_mesh)`` gives every proc torchrun's
environment, so ``torch.distributed.init_process_group()`` works in its
actors; ``SPMDActor.main(master_addr, master_port, argv)`` runs an existing
training script on every proc, as ``torchrun`` would (``monarch torchrun``
is the command-line form, ``launch(host_mesh, argv, nproc_per_node=...)``
its Python form: stop every rank at the first failure, restarts).  See
``docs/spmd.md``.

A façade over a plugin: ``SPMDActor``, ``setup_torch_elastic_env``,
``setup_torch_elastic_env_async``, ``launch``, ``JobFailed``,
``RankFailure`` and ``ScriptError`` come from whichever installed plugin
answers the ``monarch_spmd_api`` hook -- ``monarch-spmd`` (``pip install
./plugins/spmd``), which also adds the ``monarch torchrun`` command.
Without it this module still imports, and using one of those names raises
``ImportError`` saying what to install.  ``AddrType`` and ``host_address``
are the core's own (:mod:`monarch_core.runtime`) and need no plugin.
Importing this module loads nothing; the first name used loads what it needs
(the plugin registry, or the runtime's façade).
"""

from __future__ import annotations

from typing import Any

from monarch_core._compat import SPMD_NAMES as PROVIDED  # the names the providing plugin supplies

#: the names the core itself supplies (from ``monarch_core.runtime``)
CORE = ("AddrType", "host_address")

__all__ = [*CORE, *PROVIDED]

DISTRIBUTION = "monarch-spmd"


def _provider() -> Any:
    from monarch_core._plugins import provided

    return provided("monarch_spmd_api", DISTRIBUTION,
                    "monarch_core.spmd needs a plugin that provides SPMDActor, setup_torch_elastic_env and launch",
                    "torchrun's environment on proc meshes and the `monarch torchrun` command; see docs/spmd.md")


def __getattr__(name: str) -> Any:
    if name in CORE:
        from monarch_core import runtime

        value = getattr(runtime, name)
    elif name in PROVIDED:
        value = getattr(_provider(), name)
    else:
        raise AttributeError(f"module 'monarch_core.spmd' has no attribute {name!r}")
    globals()[name] = value  # found once per process
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
