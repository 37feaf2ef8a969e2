"""The port-handler interface (kept free of trio so the API imports fast)."""

from __future__ import annotations

from typing import Any


class PortHandler:
    """Receives messages addressed to one port id.  Methods may be called from
    any thread (the kernel loop, or a sender in the same process)."""

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:  # pragma: no cover
        raise NotImplementedError

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:  # pragma: no cover
        raise NotImplementedError
