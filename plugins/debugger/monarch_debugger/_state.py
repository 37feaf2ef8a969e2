"""This process's debugger state, in one place: whether a breakpoint was hit
here (:attr:`ProcState.armed`) and why the process stops, once it began to
(:attr:`ProcState.stopping_why`).

The hook (:mod:`._hook`, imported in every proc) reads it; the remote pdb
(:mod:`._session`, imported only when a breakpoint is hit) arms it and reads
the stop reason.  Both import this module, neither the other's globals: the
one writer of each field is the function below that names it.
"""

from __future__ import annotations

__all__ = ["STATE", "ProcState", "arm", "stop"]


class ProcState:
    """``armed``: a breakpoint was hit in this process, so an exception may be
    a post-mortem stop (until then an endpoint that raises pays one attribute
    read); ``stopping_why``: why this process stops, once it began to
    (``monarch_proc_stopping``): ranks waiting at a breakpoint are released."""

    __slots__ = ("armed", "stopping_why")

    def __init__(self) -> None:
        self.armed = False
        self.stopping_why: str | None = None


#: the state of this process (one per process: the hooks run in every proc)
STATE = ProcState()


def arm() -> None:
    """A breakpoint was hit in this process (``_session.set_trace``)."""
    STATE.armed = True


def stop(why: str) -> None:
    """This process begins to stop, for ``why`` (``_hook.stopping``)."""
    STATE.stopping_why = why
