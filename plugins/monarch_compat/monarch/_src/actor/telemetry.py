"""The reference's ``monarch._src.actor.telemetry``: ``TracingForwarder`` and ``traced``.

The reference's ``TracingForwarder`` is a ``logging.Handler`` that hands each
record to its Rust tracing layer, tagged with the running actor.  Here it
tags the record the same way (``record.actor_id``, the running actor's id,
``"client"``-side records left as they are) and hands it to the handlers of
the ``monarch.tracing`` logger and, as logging does, of the loggers above it:
with ``logging.basicConfig()`` the records print, in a proc they travel with
its output to the client (``ProcMesh.logging_option``, docs/observability.md),
and a handler on ``monarch.tracing`` (a file, the OpenTelemetry plugin's
logging bridge) collects them in one place.
"""

from __future__ import annotations

import logging

from monarch_core.telemetry import traced

__all__ = ["TracingForwarder", "traced"]

#: where forwarded records go
FORWARD_TO = "monarch.tracing"


class TracingForwarder(logging.Handler):
    """A handler that forwards records to the ``monarch.tracing`` logger, each
    tagged with ``actor_id`` (the running actor's id, when in an actor)."""

    def emit(self, record: logging.LogRecord) -> None:
        """Tag ``record`` and pass it to ``monarch.tracing``'s handlers (levels of handlers apply)."""
        try:
            from monarch_core._proc import _state

            host = _state.current_actor.get()
            if host is not None and not hasattr(record, "actor_id"):
                record.actor_id = str(host.actor_id)
            target = logging.getLogger(FORWARD_TO)
            if record.name == FORWARD_TO or record.name.startswith(FORWARD_TO + "."):
                return  # a record of the target itself: forwarding it would loop
            target.handle(record)
        except Exception:  # a handler never raises into the program (logging's contract)
            self.handleError(record)
