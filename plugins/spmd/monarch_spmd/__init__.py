"""monarch-spmd: ``torch.distributed`` programs on monarch-core meshes
(docs/spmd.md).  A plugin of monarch-core: it provides the names of
``monarch_core.spmd`` through the ``monarch_spmd_api`` hook (:mod:`.plugin`,
answered with :mod:`.api`) and the ``monarch torchrun`` command through the
``monarch.cli`` entry point, and uses only the core's public modules
(``monarch_core.actor``, ``monarch_core.runtime``, ``monarch_core.errors``,
``monarch_core.hookspecs``).

Modules: torchrun's environment from a proc's mesh coordinates (:mod:`._env`),
running a rank's script or module as a fresh ``python`` process of its proc
(:mod:`._script`, the process itself in :mod:`._child`), the rendezvous
store rank 0's proc hosts as torchrun's agent does (:mod:`._store`), the
actor and the setup functions (:mod:`._actor`), a whole torchrun job on a
host mesh (:mod:`._launch`) and the ``monarch torchrun`` command
(:mod:`._command`).  The rendezvous address every rank can reach is the
core's (``monarch_core.runtime.master_address``, ``host_address``).
"""
