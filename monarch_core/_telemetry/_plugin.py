"""``telemetry_files``: the built-in plugin of the sinks that ship with
monarch-core, loaded through monarch-core's own ``monarch`` entry point like
any installed plugin (``monarch plugins`` lists it;
``MONARCH_DISABLED_PLUGINS=telemetry_files`` turns it off).

Its ``monarch_telemetry_sinks`` gives a :class:`~._sinks.ChromeTraceSink` for
``MONARCH_TRACE_FILE`` and a :class:`~._sinks.JsonLinesSink` for
``MONARCH_TELEMETRY_JSONL``, when set.  A path that cannot be opened is logged
(ERROR, ``monarch.telemetry``) and that sink is left out; the run goes on.
"""

from __future__ import annotations

import logging
from typing import Any

from monarch_core import settings
from monarch_core.hookspecs import hookimpl

logger = logging.getLogger("monarch.telemetry")

#: setting -> the sink class it makes
FILE_SINKS = (("MONARCH_TRACE_FILE", "ChromeTraceSink"), ("MONARCH_TELEMETRY_JSONL", "JsonLinesSink"))


@hookimpl
def monarch_telemetry_sinks() -> list[Any]:
    from monarch_core._telemetry import _sinks

    out = []
    for name, cls in FILE_SINKS:
        if settings.is_set(name):
            path = settings.get(name)
            try:
                out.append(getattr(_sinks, cls)(path))
            except (OSError, TypeError, ValueError) as e:
                logger.error("%s=%r: %s; no telemetry is written there", name, path, e)
    return out
