"""The proc specification: everything needed to start one proc, anywhere.

A :class:`ProcSpec` is built by the spawning client (``HostMesh.spawn_procs``)
and either started on this host (:func:`~._spawn.start_proc`) or pickled to
the worker loop of a remote host, which starts it there.  The environment a
proc gets is the *starting* host's, plus the command's overrides, plus the
``monarch_proc_env`` hook results; nothing of the client's environment
travels except ``env`` (the ``BootstrapCommand`` overrides).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from monarch_core._launch._bootstrap import BootstrapCommand

__all__ = ["ProcSpec"]

#: ``(proc_id, address)`` of a proc; ``(proc_id, address, port)`` of a port.
Ref = tuple


@dataclasses.dataclass(frozen=True)
class ProcSpec:
    """One proc to start (picklable; sent to worker loops as is)."""

    proc_id: str
    #: The proc mesh's name.
    name: str
    #: Rank in the proc mesh, and the mesh's dimensions.
    rank: int
    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    #: ``"proc <name>{coords}"`` (and the host, when it has a name), for reports.
    describe: str
    #: The ``BootstrapCommand`` to run.
    command: BootstrapCommand
    #: The command is the default one: the *starting* host's Python runs it
    #: (a worker loop's own interpreter, not the client's path).
    default_program: bool
    #: ``proc_bind`` entry (``cpus``/``cpunodebind``/``membind``) or ``None``.
    bind: dict[str, str] | None
    #: The port the proc's ``hello``/``ready`` go to: ``(proc_id, address, port)``.
    status: Ref
    #: The proc's owner (its death ends the proc) and the root client.
    parent: Ref
    root: Ref
    #: The transport's name (``ipc``, ``tcp``, ``tls``...).
    transport: str
    log_level: Any = "WARNING"
    #: The host's name in its host mesh (``HostHandle.name``): how the proc's output and telemetry name it.
    host_name: str = ""
    #: Where its stdout/stderr go (``monarch_core._proc._output``): ``"direct"`` (inherited),
    #: ``"stream"`` (to the client), ``"file"`` (a per-host log file).
    output: str = "direct"
    sys_path: tuple[str, ...] = dataclasses.field(default_factory=lambda: tuple(p for p in sys.path if p))

    def argv_for_errors(self) -> list[str]:
        """The command line, as error messages show it."""
        return [self.command.program, *self.command.args]
