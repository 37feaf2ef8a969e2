"""The proc runtime (private): the proc agent, actor hosts, endpoint invocation,
ports and futures, cast trees, supervision reports, the control messages
between agents, serialisation, proc output and this process's runtime state.
It sits below telemetry (:mod:`monarch_core._telemetry`), :mod:`monarch_core._launch`
and the mesh API (:mod:`monarch_core._actor`) and imports none of them: it
calls the instrumentation it is handed per call (:mod:`._instrumentation`), and
tells what happens as events on its bus (:mod:`._runtime_events`), which
telemetry subscribes to."""
