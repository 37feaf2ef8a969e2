"""One proc of a mesh as its owner sees it: its id, its address once known."""

from __future__ import annotations

import threading

from monarch_core import settings
from monarch_core._mesh._shape import Extent
from monarch_core.errors import SupervisionError

__all__ = ["START_TIMEOUT", "EMPTY_REGION", "ProcSlot", "slot_from_ref"]

#: Seconds to wait for a proc to report its address when a reference to it
#: must be serialized before it has started.
START_TIMEOUT: float = settings.get("MONARCH_PROC_START_TIMEOUT")
EMPTY_REGION = Extent([], []).region


class ProcSlot:
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


def slot_from_ref(ref: tuple) -> ProcSlot:
    return ProcSlot(ref[0], ref[1])
