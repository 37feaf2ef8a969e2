"""The debug controller: the client's record of every rank stopped at a breakpoint.

``DebugController`` is an actor, spawned on the root client with
``get_or_spawn_controller("monarch.debug", ...)`` by the first proc that hits
``breakpoint()``; procs reach it over their ordinary actor channels (same
transport, same authentication: workers open no port for debugging).  It
holds one :class:`Session` per stopped rank, and starts the TCP server that
``monarch debug`` talks to (``_server.DebugServer``).  Everything runs on the
controller's own asyncio loop: the endpoints, and the server's connections.

A proc's session calls ``pdb_read(id, info, output)`` at every pdb prompt
(a concurrent endpoint: its answer, the next command, comes when the
debugger sends one) and ``pdb_end(id, output, why)`` when it is over;
``source(filename)`` serves the client's source of a file the proc lacks.
"""

from __future__ import annotations

import linecache
import logging
import os
import sys

from monarch_debugger._registry import Registry
from monarch_debugger._server import DebugServer
from monarch_core.actor import Actor, concurrent_endpoint, endpoint

__all__ = ["DebugController"]

logger = logging.getLogger("monarch.debug")

#: Largest source the controller sends a proc for one file, in characters.
MAX_SOURCE = 8 << 20


class DebugController(Actor):
    """The program's debug controller (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = Registry()
        self.disabled = os.environ.get("PYTHONBREAKPOINT", "").strip() == "0"
        self.server: DebugServer | None = None
        if not self.disabled:
            self.server = DebugServer(self.registry)
            self.registry.on_new_stop = self.server.new_stop

    @concurrent_endpoint
    async def pdb_read(self, sid: str, info: dict, output: str) -> tuple[str, str]:
        """A rank is at a pdb prompt: show ``output``; answer with ``(kind, line)``."""
        if self.disabled:
            return ("release", "the client runs with PYTHONBREAKPOINT=0")
        if self.server is None or self.server.error is not None:
            return ("release", f"the debug server could not start: {self.server.error if self.server else ''}")
        self.server.ensure_serving()
        return await self.registry.stopped(sid, info, output)

    @endpoint
    def pdb_end(self, sid: str, output: str, why: str) -> None:
        """The session ``sid`` is over (continued, quit, its endpoint returned)."""
        self.registry.ended(sid, output, why)

    @endpoint
    def source(self, filename: str) -> list[str] | None:
        """The client's source lines of ``filename`` (its ``linecache``: files on
        this host, and code registered there), or None."""
        lines = linecache.getlines(filename)
        main = sys.modules.get("__main__")
        if not lines and main is not None and getattr(main, "__file__", None) == filename:
            lines = linecache.getlines(filename, vars(main))
        if not lines or sum(map(len, lines)) > MAX_SOURCE:
            return None
        return list(lines)

    async def __cleanup__(self, exc: BaseException | None) -> None:
        self.registry.release_all("the client is shutting down")
        if self.server is not None:
            await self.server.aclose()
