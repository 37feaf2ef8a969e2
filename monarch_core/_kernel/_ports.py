"""The port-handler interface (kept free of trio so the API imports fast)."""

from __future__ import annotations

from typing import Any, Protocol


class PortReceiver(Protocol):
    """What the kernel needs of a port's handler (``Kernel.add_port``): a
    :class:`PortHandler` subclass, or any object with these two methods."""

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        """One message for this port: ``rank`` of the sender, ``status`` (``_wire.S_*``)."""

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        """The port will get no (more) messages from ``proc_id`` (None: from anyone)."""


class PortHandler:
    """Receives messages addressed to one port id.  Methods may be called from
    any thread (the kernel loop, or a sender in the same process)."""

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:  # pragma: no cover
        raise NotImplementedError

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:  # pragma: no cover
        raise NotImplementedError
