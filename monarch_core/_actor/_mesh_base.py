"""What every mesh shares: ``_ProcSlot`` (one proc of a mesh, its address once known), owner checks."""

from __future__ import annotations

import threading
from typing import Any

from monarch_core import settings
from monarch_core._mesh._shape import Extent
from monarch_core.errors import SupervisionError

#: Seconds to wait for a proc to report its address when a reference to it
#: must be serialized before it has started.
START_TIMEOUT: float = settings.get("MONARCH_PROC_START_TIMEOUT")
_EMPTY_REGION = Extent([], []).region


class _ProcSlot:
    """One proc: its id, its address once known, and whether it said hello."""

    __slots__ = ("proc_id", "address", "ready", "pid", "failed", "host", "host_name", "describe", "stopped")

    def __init__(self, proc_id: str, address: str | None = None) -> None:
        self.proc_id = proc_id
        self.address = address
        self.describe: str | None = None  # "proc <name>{coords}", for reports
        self.host: str | None = None  # worker-loop address for procs on remote hosts
        self.host_name: str | None = None  # HostHandle.name of the host it runs on
        self.ready = threading.Event()
        if address is not None:
            self.ready.set()
        self.pid: int | None = None
        self.failed: str | None = None
        #: "its proc mesh 'x' was stopped: <reason>", once ``ProcMesh.stop`` was called (named in failures)
        self.stopped: str | None = None

    def ref(self) -> tuple[str, str]:
        """``(proc_id, address)``, waiting for the proc to start if needed."""
        if self.address is None:
            if not self.ready.wait(START_TIMEOUT) or self.address is None:
                raise SupervisionError(
                    f"proc {self.proc_id} never reported its address"
                    + (f" ({self.failed})" if self.failed else f" within {START_TIMEOUT:.0f}s")
                )
        return (self.proc_id, self.address)


def _slot_from_ref(ref: tuple) -> _ProcSlot:
    return _ProcSlot(ref[0], ref[1])


def _owner_check(mesh: Any, what: str) -> None:
    if not mesh._owner:
        kind = type(mesh).__name__
        raise RuntimeError(
            f"cannot {what} {kind} {mesh._name!r}: this object is a reference (a slice, or received from "
            f"another actor), not the owner. Only the owner can {what} it: call {what}() on the "
            f"{kind} returned by the spawn call."
        )
