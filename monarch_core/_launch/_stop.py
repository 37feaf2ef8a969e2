"""Stopping procs, the spawner's side: ask, then SIGTERM, then SIGKILL.

:func:`stop_procs` is what ``ProcMesh.stop`` calls.  Each proc is asked to
stop (``stop_proc``: it runs its actors' ``__cleanup__`` within the grace
period); one still alive when the grace period ends gets SIGTERM, and one
alive a second after that SIGKILL -- signalled directly when this process is
its parent, through its host's worker loop (``host_kill``) otherwise.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from monarch_core._proc import _control as C
from monarch_core._kernel import _wire as W
from monarch_core._launch._spawn import host_proc_id

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel
    from monarch_core._proc._future import Cell
    from monarch_core._proc._slot import ProcSlot

logger = logging.getLogger("monarch.mesh")

#: Seconds between SIGTERM and SIGKILL, and after SIGKILL before giving up waiting.
SIGNAL_WAIT = 1.0


def stop_procs(kernel: Kernel, slots: list[ProcSlot], reason: str, grace: float, cell: Cell, mesh: str = "") -> None:
    """Stop the procs of ``slots`` (any thread; the work runs on the kernel
    loop): each gets ``grace`` seconds to stop by itself, then the signals;
    ``cell`` resolves once all are gone (or the last wait ended), after the
    output they sent before stopping (``_reporting.after_procs_stopped``)."""
    kernel.call_soon(kernel.start_task, _stop, kernel, slots, reason, grace, cell, mesh)


async def _stop(kernel: Kernel, slots: list[ProcSlot], reason: str, grace: float, cell: Any, mesh: str) -> None:
    import trio

    from monarch_core._proc import _reporting

    header = C.encode(C.StopProc(reason, max(0.5, grace - 0.5)))
    for s in slots:
        kernel.expect_exit(s.proc_id)
        if s.proc_id not in kernel.dead:
            kernel.send(s.proc_id, None, W.K_CONTROL, 0, header, b"", [], None)

    async def all_gone() -> None:
        for s in slots:
            await kernel.wait_dead(s.proc_id)

    with trio.move_on_after(grace):
        await all_gone()
    for sig_name in ("terminate", "kill"):
        alive = [s for s in slots if s.proc_id not in kernel.dead]
        if not alive:
            break
        for s in alive:
            logger.warning("%s did not stop within the grace period; sending %s", s.proc_id, sig_name)
            child = kernel.child(s.proc_id)
            if child is not None:
                getattr(child, sig_name)()
            elif s.host is not None:
                kernel.send(host_proc_id(s.host), s.host, W.K_CONTROL, 0,
                            C.encode(C.HostKill([s.proc_id], sig_name)), b"", [], None)
        with trio.move_on_after(SIGNAL_WAIT):
            await all_gone()
    await _reporting.after_procs_stopped(kernel, mesh)
    cell.set_result(None)
