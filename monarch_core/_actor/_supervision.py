"""Supervision types: ``MeshFailure`` and ``unhandled_fault_hook``."""

from __future__ import annotations

import logging
import os
import signal
import threading
import _thread
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monarch_core._actor._agent import ProcAgent
    from monarch_core._actor._host import ActorHost

logger = logging.getLogger("monarch.supervision")


class MeshFailure:
    """A failure of (part of) an actor mesh, delivered to its owner.

    ``mesh`` is the failed mesh (a reference), ``mesh_name`` its name;
    ``report()`` is the full human-readable report.  ``str()`` names the
    actor, the crashed ranks and the cause.
    """

    def __init__(self, mesh: Any, mesh_name: str, ranks: list[str], cause: str, category: str = "user") -> None:
        self.mesh = mesh
        self.mesh_name = mesh_name
        self.ranks = ranks
        self.cause = cause
        self.category = category

    def report(self) -> str:
        ranks = ", ".join(self.ranks) if self.ranks else "(all ranks)"
        return (
            f"actor mesh {self.mesh_name!r} failed ({self.category} error) on rank(s) {ranks}:\n{self.cause}"
        )

    def __str__(self) -> str:
        return self.report()

    def __repr__(self) -> str:
        return f"MeshFailure(mesh_name={self.mesh_name!r}, ranks={self.ranks!r})"


def _default_unhandled_fault_hook(failure: MeshFailure) -> None:
    """Log the failure and end the client with exit code 1 by delivering
    ``KeyboardInterrupt`` to the main thread."""
    logger.error("unhandled supervision failure; exiting with code 1:\n%s", failure.report())
    global _exit_code
    _exit_code = 1
    _thread.interrupt_main()


_exit_code = 0


def unhandled_fault_hook(failure: MeshFailure) -> None:
    """Called with a ``MeshFailure`` nobody handled, in the client.

    Assign ``monarch_core.actor.unhandled_fault_hook = my_hook`` to replace
    it.  The default logs the report and ends the client with exit code 1 by
    delivering ``KeyboardInterrupt`` to the main thread."""
    _default_unhandled_fault_hook(failure)


def actor_failed(agent: ProcAgent, host: ActorHost, why: str, err: BaseException) -> None:
    """An actor in this proc died: record it so later calls fail with the cause."""
    agent.gone.setdefault(host.key, f"failed: {why}: {err}")
