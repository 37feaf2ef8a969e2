"""The breakpoint hook every proc installs, and the post-mortem check.

Kept light: the plugin's ``monarch_proc_setup`` hook installs
:func:`breakpointhook` in every new proc and its ``monarch_endpoint_raised``
hook calls :func:`post_mortem`; the remote pdb (:mod:`._session`, which uses
the actor API) is imported only when a breakpoint is hit.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["armed", "breakpointhook", "install", "post_mortem", "stopping", "stopping_why"]

#: Set once a breakpoint was hit in this process (by ``_session``): only then
#: can an exception be a post-mortem stop, so endpoints that raise in a
#: process that never stopped pay one attribute read.
armed = False
#: Why this process stops, once it began to (``monarch_proc_stopping``):
#: ranks waiting at a breakpoint are released then.
stopping_why: str | None = None


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
    from monarch_debugger import _session

    return _session.set_trace(sys._getframe(1), *args, **kwargs)


def post_mortem(exc: BaseException) -> None:
    """An endpoint raised ``exc`` (called on the actor's thread, before the
    error goes to the caller): if this message already stopped at a
    breakpoint, stop again where it was raised, until continued."""
    if not armed:
        return
    from monarch_debugger import _session

    _session.post_mortem(exc)


def stopping(why: str) -> None:
    """This process begins to stop: release every rank stopped here."""
    global stopping_why
    stopping_why = why
