"""Telemetry: endpoint metrics, spans, lifecycle events and proc output.

The private half of :mod:`monarch_core.telemetry` (the public façade), at the
bottom of the layers: the proc runtime records into it and calls
:func:`collect` / :func:`ingest`; nothing here imports the runtime, trio,
asyncio or pluggy at import time.

* :mod:`._core` -- switches, this process's identity, the span/event buffers;
* :mod:`._metrics` -- endpoint stats and their histograms;
* :mod:`._spans` -- ``@traced``, trace contexts, span records;
* :mod:`._batch` -- batches shipped to the root, and the sink events made of them;
* :mod:`._hub` -- the root's sinks and telemetry thread;
* :mod:`._sinks` -- the JSON-lines and Chrome trace sinks;
* :mod:`._output` -- proc stdout/stderr capture and the root's printer;
* :mod:`._events` -- the lifecycle event names and the structured log fields;
* :mod:`._summary` -- the summary tables (``monarch summary``).
"""

from __future__ import annotations

from typing import Any

from monarch_core._telemetry._core import configure_process, lifecycle, state
from monarch_core._telemetry._events import log_extra
from monarch_core._telemetry._spans import traced

__all__ = ["bind_current_actor", "configure_process", "lifecycle", "log_extra", "state", "traced"]


def bind_current_actor(var: Any) -> None:
    """Tell telemetry which context variable holds the running actor (``_proc._state``)."""
    state.current_actor = var
