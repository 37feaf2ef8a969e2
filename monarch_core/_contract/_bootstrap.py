"""The bootstrap seam of the plugin contract: hooks around a proc's start.

:func:`monarch_proc_env` (in the spawning process) and
:func:`monarch_proc_setup` (inside the new proc).

Public through :mod:`monarch_core.hookspecs`; import from there.
"""

from __future__ import annotations

from collections.abc import Mapping

from monarch_core._contract._common import hookspec

__all__ = ["monarch_proc_env", "monarch_proc_setup"]


@hookspec
def monarch_proc_env(proc_name: str, rank: int, coords: Mapping[str, int]) -> Mapping[str, str | None] | None:
    """Adjust the environment of a proc about to be started.

    Called once per proc, in the process that spawns it, just before the OS
    process starts.  Return a mapping of variables to set (``None`` removes a
    variable) or ``None`` for no change.  Results of all plugins are applied
    in registration order, after the user's ``BootstrapCommand`` env.

    Complete example -- pin each proc of a ``gpus`` dimension to its GPU::

        from monarch_core.hookspecs import hookimpl

        @hookimpl
        def monarch_proc_env(proc_name, rank, coords):
            if "gpus" in coords:
                return {"CUDA_VISIBLE_DEVICES": str(coords["gpus"])}
            return None
    """


@hookspec
def monarch_proc_setup(proc_name: str, rank: int) -> None:
    """Run setup inside a new proc, before any actor and before the user's
    ``bootstrap=`` callable.

    Called once in each new proc's process, on its main thread, after the
    proc's kernel is listening.  An exception fails the proc's start, and the
    error (with the plugin's name) is reported to whoever spawned it.

    Complete example -- seed every proc's random generator from its rank::

        import random
        from monarch_core.hookspecs import hookimpl

        @hookimpl
        def monarch_proc_setup(proc_name, rank):
            random.seed(1234 + rank)
    """
