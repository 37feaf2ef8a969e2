"""The telemetry seam of the plugin contract: sinks.

:func:`monarch_telemetry_sinks` yields :class:`TelemetrySink` s, which
receive batches of :class:`TelemetryEvent` in the client.

Public through :mod:`monarch_core.hookspecs`; import from there.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from monarch_core._contract._common import hookspec

__all__ = ["TelemetryEvent", "TelemetrySink", "monarch_telemetry_sinks"]


@dataclasses.dataclass(frozen=True)
class TelemetryEvent:
    """One telemetry record, as a sink receives it (in the client).

    Every event's ``attributes`` say where it was recorded: ``proc`` (the proc
    id; ``client-...`` for the client), ``proc_name`` (``procs0{'gpus': 1/4}``,
    ``client``), ``host`` and ``pid``.  Then, by ``kind``:

    ``"span"`` -- a finished span: ``name`` (``<mesh>.<endpoint>`` for a call,
    ``<mesh>.__init__`` for a traced spawn -- adverb ``"spawn"``, one client
    span until every actor's ``__init__`` returned, one server span per actor
    -- the function's name for ``@traced``), ``start_ns`` (wall clock, ns since the
    epoch), ``duration_ns``; attributes ``trace_id`` (32 hex digits),
    ``span_id`` and ``parent_id`` (16 hex digits; ``parent_id`` ``None`` at a
    trace's root), ``span_kind`` (``"client"``: the caller's side of one
    adverb call, from the send to the reply; ``"server"``: one endpoint
    invocation in the actor's proc, the child of its client span;
    ``"internal"``: a ``@traced`` function), ``thread`` (the actor's display
    name, or the client thread's name), ``error`` (the exception's type name,
    only when it raised); for calls also ``mesh``, ``endpoint``, ``rank`` (and
    ``adverb`` on the client side, ``actor_id`` on the server side).

    ``"metric"`` -- the running totals of one endpoint from one side, sent
    each interval in which they changed (cumulative since the process
    started: the latest one supersedes the earlier): ``name`` ``"endpoint"``,
    ``start_ns`` when they were read; attributes ``side`` (``"client"`` /
    ``"server"``), ``mesh``, ``mesh_key``, ``endpoint``, ``rank``, ``adverb``,
    ``calls``, ``errors`` (type name -> count), ``request_bytes``,
    ``reply_bytes``, ``latency_count``, ``latency_sum_ns``,
    ``latency_min_ns``, ``latency_max_ns``, ``latency_p50_ns``,
    ``latency_p99_ns`` and ``latency_buckets`` (see
    :class:`monarch_core.telemetry.EndpointMetrics`).  Two of them are empty on
    one side, as each side knows them: ``rank`` is ``None`` on the client side
    for ``call``/``stream``/``broadcast`` (one call reaching every rank; the
    destination's rank for ``call_one``/``choose``), and ``adverb`` is ``""``
    on the server side (the actor's proc runs the endpoint whatever the adverb;
    its ``rank`` is the actor's).  Likewise a span has ``adverb`` on the client
    side only and ``actor_id`` on the server side only.

    ``"lifecycle"`` -- a lifecycle or supervision event: ``name`` one of
    ``monarch_core.telemetry.LIFECYCLE`` (``proc.failed``,
    ``supervision.event`` ...), ``start_ns`` when it happened,
    ``duration_ns`` 0, the attributes that table lists for it.
    """

    kind: str
    name: str
    start_ns: int
    duration_ns: int = 0
    attributes: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class TelemetrySink(abc.ABC):
    """Receives telemetry in the client, in batches, from the telemetry thread
    (about once per ``MONARCH_TELEMETRY_INTERVAL``, and at shutdown), never
    per call.

    ``kinds`` names the event kinds the sink wants (a subset of ``"span"``,
    ``"metric"``, ``"lifecycle"``; default all three).  A sink that wants
    ``"span"`` turns on tracing of every call while it is installed: leave it
    out of ``kinds`` if the sink does not use spans, and calls stay untraced.
    """

    kinds: frozenset[str] = frozenset({"span", "metric", "lifecycle"})

    @abc.abstractmethod
    def emit(self, events: Sequence[TelemetryEvent]) -> None:
        """Handle a batch (events of the kinds in ``kinds``).  Must not block
        for long.  An exception loses that batch for this sink only; the sink
        is kept and gets the next one.  For a sink a plugin returned, it is
        one WARNING under ``monarch.telemetry`` naming the plugin and its
        distribution, then at most one a minute (counting the failures in
        between; the tracebacks are at DEBUG)."""

    def close(self) -> None:
        """Flush and release resources (the client's shutdown, or
        ``monarch_core.telemetry.remove_sink``)."""


@hookspec
def monarch_telemetry_sinks() -> Sequence[TelemetrySink]:
    """Return sinks that receive the program's telemetry in batches.

    Called once, in the client (the root process), when its runtime starts
    (the first mesh); procs never call it.  Every proc aggregates its endpoint
    metrics and buffers its spans and lifecycle events, and ships them to the
    client in one message per ``MONARCH_TELEMETRY_INTERVAL`` (1 s), when it
    stops, and when the client asks (``monarch_core.telemetry.flush``); the
    client's telemetry thread hands them, with its own, to every sink's
    :meth:`TelemetrySink.emit` -- the kinds it names in
    :attr:`TelemetrySink.kinds`, as :class:`TelemetryEvent` s described there.
    Return a sequence of sinks (empty: none).  ``MONARCH_TELEMETRY=0`` records
    nothing at all, and the hook is not called.

    Configuration: the hook takes no arguments, so a sink reads its own when
    the hook is called, in the client -- environment variables of its own
    (the example's ``SPAN_LINES``; the project's plugins declare theirs in
    ``monarch_core.settings``), a file, or what the program has set up
    before its first mesh (``monarch-telemetry-otel`` uses the OpenTelemetry
    providers the program installed).  Return no sink when it is not
    configured.  A program that wants to pass arguments builds the sink itself
    and installs it with ``monarch_core.telemetry.add_sink(sink)``.

    Failures: a hook that raises, or returns something without ``emit``, makes
    the plugin *broken* (one ``RuntimeWarning`` naming it, ``monarch plugins``
    lists it); the other sinks are used.

    Complete example -- count events per kind and write each span's name and
    duration as a JSON line (the project's tests run this code)::

        import collections, json, os
        from monarch_core.hookspecs import TelemetrySink, hookimpl

        class SpanLines(TelemetrySink):
            kinds = frozenset({"span", "metric", "lifecycle"})

            def __init__(self, path):
                self.counts = collections.Counter()
                self._f = open(path, "a")

            def emit(self, events):
                for e in events:
                    self.counts[e.kind] += 1
                    if e.kind == "span":
                        self._f.write(json.dumps({"name": e.name, "ms": e.duration_ns / 1e6,
                                                  "parent": e.attributes["parent_id"],
                                                  "proc": e.attributes["proc_name"]}) + "\\n")
                self._f.flush()

            def close(self):
                self._f.close()

        @hookimpl
        def monarch_telemetry_sinks():
            path = os.environ.get("SPAN_LINES")
            return [SpanLines(path)] if path else []

    with ``[project.entry-points.monarch] span_lines = "span_lines.plugin"``
    in its ``pyproject.toml``.  ``monarch_core.telemetry.add_sink(sink)``
    installs a sink from Python instead; ``monarch-telemetry-otel`` is a sink
    plugin that exports spans and metrics through the OpenTelemetry SDK.
    """
