"""``Channel``: a (Port, PortReceiver) pair opened in the running actor or the client."""

from __future__ import annotations

from typing import Generic, TypeVar

from monarch_core._launch import _start
from monarch_core._proc import _state
from monarch_core._proc._port import Port, PortReceiver, RankedPortReceiver, QueueHandler

__all__ = ["Channel"]

R = TypeVar("R")


class Channel(Generic[R]):
    """Low-level message passing: open a (Port, PortReceiver) pair in the
    current actor (or the client)."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port[R], PortReceiver[R]]:
        """Open a channel.  With ``once=True`` the port accepts one message."""
        _start.ensure_runtime()
        kernel = _state.current().kernel
        h = QueueHandler(once)
        h.port_id = kernel.add_port(h)
        port: Port[R] = Port((kernel.proc_id, kernel.address, h.port_id), None, None)
        return port, PortReceiver(None, h)

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port[R], RankedPortReceiver[R]]:
        """Like :meth:`open`, but the receiver yields ``(rank, value)``."""
        port: Port[R]
        recv: PortReceiver[R]
        port, recv = Channel.open(once)
        return port, recv.ranked()
