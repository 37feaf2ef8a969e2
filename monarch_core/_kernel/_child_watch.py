"""The kernel's watch over the child OS processes the launch layer hands it
(``Kernel.adopt_child``): an exit it was not told to expect
(``Kernel.expect_exit``) fails the proc, naming the exit status, and is
logged (a WARNING; DEBUG while the proc is starting under a spawn that
reports its failures once: ``Kernel.child_starting``).  An exit is reported
once what the child sent before it ended was routed (``inbound_drained``,
at most :data:`DRAIN_WAIT`): a reply it sent just before it ended resolves
its call rather than losing a race with the exit.

:class:`ChildProcess` is what the kernel needs of such a process (the launch
layer's exec'd ``_launch._children.Child`` and the fork server's
``ForkedChild`` have it), so the kernel never imports the launch layer.
:class:`ChildWatch` is a component the ``Kernel`` holds (``Kernel._child_watch``;
the kernel's methods of the same names delegate to it): it keeps the adopted
children and the procs whose exit is expected, and calls back only what
:class:`ChildWatchOwner` describes (``expect_proc``, ``proc_failed``,
``start_task``, ``inbound_drained``).  This module does not import ``_runtime`` (which imports it).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

logger = logging.getLogger("monarch.kernel")


#: Seconds an ended child's connections get to be read to their end before
#: its end is reported (they close with it; a descendant may hold one open).
DRAIN_WAIT = 2.0


class ChildProcess(Protocol):
    """What :meth:`Kernel.adopt_child` watches: a child OS process started by
    the launch layer (``monarch_core._launch``), exec'd or forked."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class ChildWatchOwner(Protocol):
    """What a :class:`ChildWatch` calls back on its owner (the ``Kernel``)."""

    def expect_proc(self, proc_id: str) -> None:
        """``proc_id``'s address will be learned later (loop thread)."""

    def proc_failed(self, proc_id: str, reason: str, stopped: bool = False) -> None:
        """``proc_id`` is gone, for ``reason`` (``stopped``: on purpose); loop thread."""

    def start_task(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run ``await afn(*args)`` in the background on the loop (loop thread)."""

    async def inbound_drained(self, proc_id: str, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until what ``proc_id`` sent before its
        connections closed was routed (loop thread)."""


class ChildWatch:
    """The kernel's watch over its adopted child processes (see the module
    docstring).  Loop thread, except where a method says otherwise."""

    def __init__(self, owner: ChildWatchOwner) -> None:
        self._owner = owner
        #: proc id -> its entry: ``proc`` (the :class:`ChildProcess`), ``describe``,
        #: ``expected`` (its exit is a stop), and ``starting`` / ``hung`` / ``status`` once known
        self._children: dict[str, dict[str, Any]] = {}
        self._expected_exits: set[str] = set()

    def adopt_child(self, proc_id: str, proc: ChildProcess, *, describe: str) -> None:
        """Watch ``proc``, the OS process of ``proc_id`` that this process
        started (loop thread; see ``monarch_core._launch``).

        When it exits without :meth:`expect_exit` having been called,
        :meth:`proc_failed` is called with its exit status."""
        self._owner.expect_proc(proc_id)
        entry: dict[str, Any] = {"proc": proc, "expected": False, "describe": describe}
        self._children[proc_id] = entry
        self._owner.start_task(self._watch_child, proc_id, entry)

    def child_starting(self, proc_id: str) -> None:
        """``proc_id`` (an adopted child) is starting, and whoever started it
        reports a failure to start once for all its procs (a spawn's summary):
        until :meth:`child_started`, its unexpected exit is logged at DEBUG, not
        as a WARNING line of its own.  Call it right after :meth:`adopt_child`,
        with no checkpoint between (loop thread)."""
        e = self._children.get(proc_id)
        if e is not None:
            e["starting"] = True

    def child_started(self, proc_id: str) -> None:
        """``proc_id`` has started (its bootstrap ran): from now on its
        unexpected exit is a WARNING again (any thread: one flag is set)."""
        e = self._children.get(proc_id)
        if e is not None:
            e["starting"] = False

    def expect_exit(self, proc_id: str) -> None:
        """``proc_id`` is being stopped on purpose: its end is not a failure."""
        self._expected_exits.add(proc_id)
        e = self._children.get(proc_id)
        if e is not None:
            e["expected"] = True

    def exit_expected(self, proc_id: str) -> bool:
        """Whether ``proc_id``'s end was announced as a stop (:meth:`expect_exit`)."""
        return proc_id in self._expected_exits

    def kill_hung(self, proc_id: str, silent_for: float) -> None:
        """Kill a child proc that stopped answering heartbeats (loop thread)."""
        e = self._children.get(proc_id)
        if e is None or e["proc"].returncode is not None:
            return
        e["hung"] = silent_for
        logger.error("%s answered no heartbeat for %.0fs; killing it", e["describe"], silent_for)
        e["proc"].kill()

    def child(self, proc_id: str) -> ChildProcess | None:
        """The adopted OS process of ``proc_id`` (None: none, or it ended and was reported)."""
        e = self._children.get(proc_id)
        return e["proc"] if e is not None else None

    async def _watch_child(self, proc_id: str, entry: dict[str, Any]) -> None:
        proc = entry["proc"]
        rc = await proc.wait()
        # What it sent just before it ended (its last replies) may still be unread on its
        # connections: route it first, so that its end fails only what it never answered.
        await self._owner.inbound_drained(proc_id, DRAIN_WAIT)
        if rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = f"signal {-rc}"
            status = f"was killed by {sig}"
        else:
            status = f"exited with code {rc}"
        if getattr(proc, "exit_note", None):  # e.g. its fork server died
            status = f"{status} ({proc.exit_note})"
        if entry.get("hung"):
            reason = (
                f"{entry['describe']} (pid {proc.pid}) was hung: it answered no heartbeat for "
                f"{entry['hung']:.0f}s and was killed (MONARCH_HEARTBEAT_TIMEOUT)"
            )
        elif entry["expected"]:
            reason = f"{entry['describe']} (pid {proc.pid}) was stopped"
        else:
            reason = f"{entry['describe']} (pid {proc.pid}) {status}"
            # a proc that dies while starting is reported once, by its spawn (``child_starting``)
            level = logging.INFO if rc == 0 else logging.DEBUG if entry.get("starting") else logging.WARNING
            logger.log(level, "%s", reason)
        entry["status"] = status
        self._owner.proc_failed(proc_id, reason, stopped=entry["expected"])
        if self._children.get(proc_id) is entry:  # it ended and was reported: nothing keeps it here
            del self._children[proc_id]
        self._expected_exits.discard(proc_id)

    def children(self) -> dict[str, dict[str, Any]]:
        """The adopted children still watched: proc id -> its entry (see ``__init__``)."""
        return self._children
