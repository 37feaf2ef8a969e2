"""The proc runtime (private): the proc agent, actor hosts, endpoint invocation,
ports and futures, cast trees, supervision reports, the control messages
between agents, serialisation and this process's runtime state.  It sits
below :mod:`monarch_core._launch` and the mesh API (:mod:`monarch_core._actor`)
and imports neither."""
