"""Built-in plugins, registered through the same hooks as external ones
(built-ins are plugins, as in pytest; an installed plugin may replace one):

* the ``ipc`` transport (Unix-domain sockets; the default), :mod:`._ipc`;
* the ``inproc`` transport (connections inside one process, over socket
  pairs; used for tests and by the conformance kit), :mod:`._inproc`;
* the ``local`` scheduler (hosts on this machine, procs as child
  processes), :mod:`._local`.

(``RDMABuffer`` and its ``channel`` fallback come with
``monarch-transport-rdma``.)

``pip install monarch-core`` alone therefore runs every single-host program;
``monarch-transport-tcp`` adds ``tcp`` and ``tls``.
"""

from __future__ import annotations

from monarch_core._builtins._local import LocalScheduler
from monarch_core.hookspecs import SchedulerSpec, TransportSpec, hookimpl

__all__ = ["LocalScheduler", "monarch_schedulers", "monarch_transports"]


@hookimpl
def monarch_transports() -> list[TransportSpec]:
    return [
        TransportSpec(
            name="inproc",
            schemes=("inproc",),
            # (imported when first used, like ipc: building the registry
            # then imports no trio, and a client can reach its hosts while trio loads)
            factory="monarch_core._builtins._inproc:InprocTransport",
            description="connections inside one process (tests, conformance kit)",
        ),
        TransportSpec(
            name="ipc",
            schemes=("ipc",),
            aliases=("unix",),
            factory="monarch_core._builtins._ipc:IpcTransport",
            description="Unix-domain sockets (ipc:///path, ipc://@abstract-name); the default",
        ),
    ]


@hookimpl
def monarch_schedulers() -> list[SchedulerSpec]:
    return [SchedulerSpec("local", LocalScheduler, "hosts on this machine; procs are child processes")]

