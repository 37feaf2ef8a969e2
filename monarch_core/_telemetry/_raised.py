"""``endpoint.raised``: the message and traceback of an exception an endpoint raised.

Endpoint metrics count errors by exception type only.  So that a viewer (the
dashboard, a JSON-lines file) can say *what* went wrong, a server-side stat
that records a failed call from inside the ``except`` block that caught the
exception (what ``ActorHost`` does) also records one ``endpoint.raised``
lifecycle event with the exception's type, message and formatted traceback --
in the actor's process, shipped to the root with the next batch like any
lifecycle event.

Bounded: at most :data:`PER_WINDOW` events per endpoint and rank per
``MONARCH_TELEMETRY_INTERVAL`` window (an endpoint raising in a tight loop costs
a counter, not a traceback per call; ``skipped`` on the next event says how many
were left out), the message cut to :data:`MAX_MESSAGE` characters and the
traceback -- from the endpoint's own frame: the proc runtime's frames that called it are left
out -- to its last :data:`MAX_TRACEBACK`.  ``BaseException`` s that are not
``Exception`` s (cancellation, ``SystemExit``) are not reported here: they end the
actor, and ``actor.failed`` says so.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from types import TracebackType
from typing import Any, Optional

from monarch_core._telemetry._core import lifecycle, state

#: most ``endpoint.raised`` events of one endpoint and rank per telemetry interval
PER_WINDOW = 8
#: characters of the exception's message kept (the start)
MAX_MESSAGE = 2000
#: characters of the formatted traceback kept (the end: where it was raised)
MAX_TRACEBACK = 8000
#: frames of files under here (the proc runtime that runs the endpoint) are left out of the traceback's start
_RUNTIME = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep + "_proc" + os.sep


def _user_frames(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """``tb`` from its first frame outside monarch-core's runtime (the endpoint's
    own code), so that the traceback starts where the user's code does."""
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_RUNTIME):
        tb = tb.tb_next
    return tb


def note(stat: Any, err: str) -> None:
    """``stat`` (a server-side ``EndpointStat``) just counted a call that failed
    with an exception of type ``err``: if that exception is the one being handled
    (``sys.exc_info()``, same type name), record its ``endpoint.raised`` event,
    unless this window's quota of them is spent."""
    if not state.enabled:
        return
    exc = sys.exc_info()[1]
    if exc is None or not isinstance(exc, Exception) or type(exc).__name__ != err:
        return
    now = time.monotonic()
    w = stat.raised
    if w is None or now - w[0] >= max(state.interval, 0.05):
        skipped = w[2] if w is not None else 0
        w = stat.raised = [now, 0, 0]
    else:
        skipped = 0
    if w[1] >= PER_WINDOW:
        w[2] += 1  # (told with the first event of a later window)
        return
    w[1] += 1
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a __str__ that raises: the type says what we can
        message = f"<{err}: str() raised>"
    try:
        tb = "".join(traceback.format_exception(type(exc), exc, _user_frames(exc.__traceback__)))
    except Exception:  # noqa: BLE001 - a traceback that cannot be formatted
        tb = ""
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "…"
    if len(tb) > MAX_TRACEBACK:
        tb = "…" + tb[-MAX_TRACEBACK:]
    _side, mesh_key, mesh, endpoint, rank, _adverb = stat.key
    lifecycle("endpoint.raised", mesh=mesh, mesh_key=mesh_key, endpoint=endpoint, rank=rank, error_type=err,
              message=message, traceback=tb, skipped=skipped)
