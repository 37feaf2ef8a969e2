"""The actor layer: actors, endpoints, futures, ports and meshes (private)."""

#: What a fork server imports above the proc runtime before its first fork,
#: for the procs' actor code (``_launch._fork_server.warm``: the launch layer
#: names nothing above it).  Here, where importing it loads nothing else:
#: ``python -m monarch_core.worker`` reads it without loading the mesh API.
FORK_SERVER_WARM = ("monarch_core.actor", "monarch_core._actor._endpoint")
