"""The lifecycle seam of the plugin contract: events of a running proc.

:func:`monarch_actor_stopped`, :func:`monarch_proc_stopping`,
:func:`monarch_proc_stopped` and :func:`monarch_endpoint_raised`, called inside the process where the event
happens (a proc, a worker loop's proc, or the client).  With
:func:`~monarch_core.hookspecs.monarch_proc_setup` (the bootstrap seam) they
are how a plugin keeps per-proc state -- registrations, sessions, open files
-- in step with the actors that own it.  The proc runtime dispatches them
through one registry (``monarch_core._proc._lifecycle``), never per message.

Public through :mod:`monarch_core.hookspecs`; import from there.
"""

from __future__ import annotations

from monarch_core._contract._common import hookspec

__all__ = ["monarch_actor_stopped", "monarch_endpoint_raised", "monarch_proc_stopped", "monarch_proc_stopping"]


@hookspec
def monarch_actor_stopped(actor_key: str, actor_name: str, why: str) -> None:
    """An actor of this process stopped (its ``__cleanup__`` has run).

    ``actor_key`` identifies the actor within its proc (the key its
    registrations were made under: ``context().actor_instance.key``),
    ``actor_name`` is its display name (``trainers[3]``), ``why`` says why it
    stopped, in words.  Called on the proc's kernel thread: do not block.  An
    exception is logged with the plugin's name; stopping goes on.

    Complete example -- close what an actor opened::

        from monarch_core.hookspecs import hookimpl

        _open: dict[str, list] = {}   # actor key -> files

        @hookimpl
        def monarch_actor_stopped(actor_key, actor_name, why):
            for f in _open.pop(actor_key, []):
                f.close()
    """


@hookspec
def monarch_proc_stopping(why: str) -> None:
    """This process begins to stop (``why``, in words): its actors are about
    to be asked to stop and get their stop grace.  Let go of what would keep
    an actor from stopping (a debugger releases its sessions).  Called once
    per process, on the thread that stops it, before
    :func:`monarch_proc_stopped`; an exception is logged with the plugin's
    name and stopping goes on."""


@hookspec
def monarch_proc_stopped(why: str) -> None:
    """This process's actors stopped (or their stop grace ran out): release
    what the process still holds (memory registrations, host allocations).
    Called once per process, on the thread that stops it, also when
    stopping failed half-way; an exception is logged with the plugin's name."""


@hookspec
def monarch_endpoint_raised(exc: BaseException) -> None:
    """An endpoint of this process raised ``exc`` (called on the actor's
    thread, after the endpoint's frames unwound and before the error goes to
    its caller).  For debuggers and error trackers; it must return quickly
    unless it means to hold the call (a post-mortem debugger).  An exception
    it raises is logged with the plugin's name; the endpoint's error goes to
    its caller unchanged."""
