"""The breakpoint hook every proc installs, and the post-mortem check.

Kept light and free of monarch imports: ``_launch._proc_main`` installs
:func:`breakpointhook` at proc start and the actor host calls
:func:`post_mortem` when an endpoint raises, and both sit below the layers
that do the work.  The remote pdb (``monarch_core._debug._session``, which
uses the actor API) is imported by name when a breakpoint is hit: a call up
through a name, like ``_zygote.warm_modules``, not an import arrow.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

__all__ = ["armed", "breakpointhook", "install", "post_mortem"]

_SESSION = "monarch_core._debug._session"

#: Set once a breakpoint was hit in this process (by ``_session``): only then
#: can an exception be a post-mortem stop, so endpoints that raise in a
#: process that never stopped pay one attribute read.
armed = False


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
    session = importlib.import_module(_SESSION)
    return session.set_trace(sys._getframe(1), *args, **kwargs)


def post_mortem(exc: BaseException) -> None:
    """An endpoint raised ``exc`` (called on the actor's thread, before the
    error goes to the caller): if this message already stopped at a
    breakpoint, stop again where it was raised, until continued."""
    if not armed:
        return
    importlib.import_module(_SESSION).post_mortem(exc)
