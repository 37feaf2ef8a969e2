"""The client's side of the engine: one controller per proc mesh turns the
torch operations issued inside ``with mesh.activate():`` into commands
(``_protocol``) for the procs' workers (``_worker``), on handles
(:mod:`._tensor`) whose metadata come from fake tensors.

Modules, top (imports the others) to bottom: :mod:`._controller` (the
controller, the registry of meshes, ``Active``/``NoMesh``, dispatch);
:mod:`._globals` (torch's global state: dtype, seeds) and :mod:`._rng`;
the operations :mod:`._collectives`, :mod:`._grads`, :mod:`._process_group`,
:mod:`._transfer`, :mod:`._propagate`, :mod:`._known`; :mod:`._store` (the
mesh's store, as the client holds it); :mod:`._streams`; :mod:`._tensor`
(the handle); :mod:`._active` (each thread's active mesh), :mod:`._ops`,
:mod:`._cache`.  A module below reaches the controller only through the
object it is handed (``t._ctl``, ``_active.active()``), never by importing
it.  Imports ``_protocol``, ``_worker`` (the actor class the controller
spawns, and ``local_tensor``) and the core's public API.
"""
