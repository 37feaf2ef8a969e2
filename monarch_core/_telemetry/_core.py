"""Process-wide telemetry state: what is switched on, who this process is, and
the buffers that batches are cut from.

Every process (client, proc) has one :data:`state`.  Spans and lifecycle
events are appended to its bounded deques by whichever thread records them;
:func:`monarch_core._telemetry._batch.collect` takes them out, with the
endpoint metrics, once per interval.  Nothing here does I/O or imports
trio, asyncio or pluggy.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
from typing import Any

from monarch_core import settings

#: Most spans / lifecycle events a process holds between two batches; older
#: ones are dropped (and counted) beyond it.
MAX_BUFFERED = 200_000
#: Items of one span in ``State.spans`` (a flat list: see :func:`._spans.record`).
SPAN_FIELDS = 7
#: ``len(State.spans)`` at :data:`MAX_BUFFERED` spans.
MAX_FLAT = MAX_BUFFERED * SPAN_FIELDS


class State:
    """What one process records, and for whom."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        #: ``MONARCH_TELEMETRY``: endpoint metrics, spans and lifecycle events at all.
        self.enabled = True
        #: Record spans of work that is not part of a traced call (``MONARCH_TRACE``,
        #: ``MONARCH_TRACE_FILE``, or, in the client, a sink that wants spans).
        self.tracing = False
        #: Seconds between two batches (``MONARCH_TELEMETRY_INTERVAL``).
        self.interval = 1.0
        #: Who records: filled in by the runtime (``configure_process``).
        self.proc_id = f"pid-{os.getpid()}"
        self.name = "client"
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.is_root = True
        #: The root has a sink (events recorded there go somewhere).
        self.sinks_active = False
        #: recorded spans, :data:`SPAN_FIELDS` items each in one flat list (any thread
        #: extends it by one span at a time, atomically; :meth:`take_spans` swaps it).  Flat,
        #: so that a buffered span is no object the garbage collector has to count.
        self.spans: list = []
        self._retired: list[tuple] = []
        self._retired_taken = 0
        self.events: collections.deque[tuple] = collections.deque(maxlen=MAX_BUFFERED)
        self.dropped = 0
        self.read_settings()

    def read_settings(self, env: Any = None) -> None:
        """(Re)read the switches from the environment (a forked proc inherits a
        module imported by its fork server: it calls this at start)."""
        self.enabled = settings.get("MONARCH_TELEMETRY", env)
        self.interval = settings.get("MONARCH_TELEMETRY_INTERVAL", env)
        self.tracing = self.enabled and (
            settings.get("MONARCH_TRACE", env) or settings.is_set("MONARCH_TRACE_FILE", env)
        )

    def take_spans(self) -> list:
        """The spans recorded since the last call.  Writers append to
        ``self.spans`` without a lock; it is swapped for a new list, and a span
        appended to the old one just after the swap is taken next time."""
        old, taken = self._retired, self._retired_taken
        late = old[taken:] if len(old) > taken else []
        cur = self.spans
        self.spans = []
        n = len(cur)
        self._retired, self._retired_taken = cur, n
        return late + cur[:n] if late else cur[:n]

    def identity(self) -> dict[str, Any]:
        return {"proc": self.proc_id, "proc_name": self.name, "host": self.host, "pid": self.pid}


state = State()


def configure_process(*, proc_id: str, name: str, host: str | None = None, is_root: bool) -> None:
    """Name this process in what it records (the runtime calls it when it starts)."""
    state.proc_id = proc_id
    state.name = name
    state.pid = os.getpid()
    if host:
        state.host = host
    state.is_root = is_root


def lifecycle(name: str, **attributes: Any) -> None:
    """Record lifecycle event ``name`` (one of :data:`._events.LIFECYCLE`) with
    its documented attributes.  No-op when telemetry is off."""
    if not state.enabled or (state.is_root and not state.sinks_active):
        return
    ev = state.events
    if len(ev) == ev.maxlen:
        state.dropped += 1
    ev.append((name, time.time_ns(), attributes))
