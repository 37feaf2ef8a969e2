"""Telemetry: endpoint metrics, spans, lifecycle events, and what procs report to the root.

The private half of :mod:`monarch_core.telemetry` (the public façade).  It
sits right above the proc runtime (``_proc``), which sees it only through the
instrumentation it is handed where the runtime is built
(:class:`._runtime.Telemetry`, a ``_proc._instrumentation.Instrumentation``:
what runs per call) and the listeners subscribed there to the runtime's
events (:func:`._runtime.subscribe`: what the runtime tells); the sinks'
hookspec is the plugin contract's (``_contract/_telemetry.py``).  Nothing here
imports trio, asyncio or pluggy at import time.

* :mod:`._runtime` -- :class:`Telemetry`, the runtime's instrumentation, and
  :func:`subscribe`, telemetry's listeners of the runtime's events;
* :mod:`._core` -- switches, this process's identity, the span/event buffers;
* :mod:`._metrics` -- endpoint stats and their histograms;
* :mod:`._spans` -- ``@traced``, trace contexts, span records;
* :mod:`._instrument` -- the client and server side of a call (stats, timed reply collectors, spans);
* :mod:`._batch` -- batches shipped to the root, and the sink events made of them;
* :mod:`._reporting` -- a proc's telemetry and output to the root, the root's flush, lifecycle events;
* :mod:`._hub` -- the root's sinks and telemetry thread;
* :mod:`._sinks` -- the JSON-lines and Chrome trace sinks; :mod:`._plugin` -- the built-in plugin of the file sinks;
* :mod:`._events` -- the lifecycle event names and the structured log fields;
* :mod:`._summary` -- the summary tables (``monarch summary``).

Proc stdout/stderr capture and the root's printer are the runtime's own
(``_proc/_output.py``); their lines travel in the batches shipped here.
"""

from monarch_core._telemetry._spans import traced

__all__ = ["traced"]
