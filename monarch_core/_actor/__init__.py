"""The mesh API (private): ``Actor``, endpoints and their adverbs, the actor,
proc and host meshes, ``context()``, channels, controllers, attaching to
worker loops and the tensor engine's entry.  Futures, ports and supervision
reports live in ``_proc`` (the proc runtime below), the launch of procs and
hosts in ``_launch``; ``monarch_core.actor`` is the public façade."""

#: What a fork server imports above the proc runtime before its first fork,
#: for the procs' actor code (``_launch._fork_server.warm``: the launch layer
#: names nothing above it).  Here, where importing it loads nothing else:
#: ``python -m monarch_core.worker`` reads it without loading the mesh API.
FORK_SERVER_WARM = ("monarch_core.actor", "monarch_core._actor._endpoint")
