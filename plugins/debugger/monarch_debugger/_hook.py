"""The breakpoint hook every proc installs, and the post-mortem check.

Kept light: the plugin's ``monarch_proc_setup`` hook installs
:func:`breakpointhook` in every new proc and its ``monarch_endpoint_raised``
hook calls :func:`post_mortem`; the remote pdb (:mod:`._session`, which uses
the actor API) is imported only when a breakpoint is hit.  What the two share
(armed, why the process stops) lives in :mod:`._state`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from monarch_debugger import _state
from monarch_debugger._state import STATE

__all__ = ["breakpointhook", "install", "post_mortem", "stopping"]


def install() -> None:
    """Make ``breakpoint()`` in this proc a remote pdb session (called once, at proc start)."""
    sys.breakpointhook = breakpointhook


def breakpointhook(*args: Any, **kwargs: Any) -> Any:
    """``sys.breakpointhook`` of a proc.

    ``PYTHONBREAKPOINT`` keeps its meaning: ``0`` disables ``breakpoint()``,
    another value (``ipdb.set_trace``...) is run as Python's own hook runs it;
    unset or empty, the caller's frame stops in a pdb session that
    ``monarch debug`` attaches to, until it is continued."""
    hookname = os.environ.get("PYTHONBREAKPOINT", "").strip()
    if hookname == "0":
        return None
    if hookname:
        return sys.__breakpointhook__(*args, **kwargs)
    # lazy: the remote pdb uses the actor API, too heavy for every proc's start; loaded at the first breakpoint
    from monarch_debugger import _session

    return _session.set_trace(sys._getframe(1), *args, **kwargs)


def post_mortem(exc: BaseException) -> None:
    """An endpoint raised ``exc`` (called on the actor's thread, before the
    error goes to the caller): if this message already stopped at a
    breakpoint, stop again where it was raised, until continued."""
    if not STATE.armed:  # set by _session.set_trace (_state.arm)
        return
    from monarch_debugger import _session  # lazy, as in breakpointhook

    _session.post_mortem(exc)


def stopping(why: str) -> None:
    """This process begins to stop: release every rank stopped here."""
    _state.stop(why)
