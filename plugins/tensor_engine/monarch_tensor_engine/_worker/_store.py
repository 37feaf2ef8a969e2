"""The mesh's store (the groups' rendezvous), as one proc holds it: one
:class:`MeshStore` per worker, the only owner of its connections.

The mesh's first proc starts the store (:meth:`MeshStore.start`, on a free
port of its host, at the address the other procs already reach it at); the
client sends its address to every proc (``ConnectStore``), which connects
(:meth:`MeshStore.connect`).  Looking for dead members takes a connection of
its own (:meth:`MeshStore.watcher`); a transfer between two meshes meets in
the source mesh's store (:meth:`MeshStore.client`).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch

from monarch_core.runtime import host_address
from monarch_tensor_engine._protocol import TIMEOUT_S, store_client

__all__ = ["MeshStore"]


class MeshStore:
    """``base``: this proc's client of its mesh's store (the server itself on
    the first proc), None until started or connected; ``addr``: its
    ``(host, port)``."""

    __slots__ = ("base", "addr", "_watchers", "_clients")

    def __init__(self) -> None:
        self.base: Any = None
        self.addr: tuple[str, int] | None = None
        self._watchers: dict[tuple[str, int], Any] = {}
        self._clients: dict[tuple[str, int], Any] = {}

    def start(self) -> tuple[str, int]:
        """In the mesh's first proc: start the store on a free port here (once); its address."""
        if self.base is None:
            addr = host_address()
            self.base = torch.distributed.TCPStore(addr, 0, None, True, datetime.timedelta(seconds=TIMEOUT_S),
                                                   wait_for_workers=False)
            self.addr = (addr, int(self.base.port))
        assert self.addr is not None
        return self.addr

    def connect(self, addr: str, port: int) -> None:
        """Connect to the mesh's store at ``addr:port`` (unless started or connected already)."""
        if self.base is None:
            self.base = store_client(addr, port)
            self.addr = (addr, port)

    def watcher(self, addr: tuple[str, int] | None = None) -> Any:
        """This proc's client of the store at ``addr`` (default: its mesh's) for
        looking for deaths: a connection of its own, because a ``TCPStore``
        client holds its lock for the whole of a blocking ``get``, and a group
        that forms waits in one for a member that may be dead."""
        addr = addr or self.addr
        if addr is None:
            raise RuntimeError("the mesh's store is not connected on this proc (no ConnectStore command came)")
        got = self._watchers.get(addr)
        if got is None:
            got = self._watchers[addr] = store_client(*addr)
        return got

    def client(self, addr: tuple[str, int]) -> Any:
        """A client of another mesh's store at ``addr`` (kept: a transfer's pair groups meet there)."""
        got = self._clients.get(addr)
        if got is None:
            got = self._clients[addr] = store_client(*addr)
        return got
