"""The procs' side of the engine: one :class:`~._actor.Worker` actor per proc
holds that proc's tensors and runs the client's commands (``_protocol``).

Modules: :mod:`._actor` (the actor and its dispatch table), :mod:`._env`
(what the worker's modules share: ``Poison``, the running stream, the
proc's workers for ``local_tensor``), :mod:`._store` (the mesh's store, as
this proc holds it), :mod:`._collectives`, :mod:`._transfer`, :mod:`._grads`
(the commands' work) and :mod:`._rng` (the functions the client's random
helpers run here).  Imports ``_protocol`` and the core's public API; never
the client's side (``_client``).
"""
