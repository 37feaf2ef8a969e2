"""The client's side of a mesh's store (the groups' rendezvous): one
:class:`StoreLink` per controller, the only owner of the store's address in
the client.

The store is started at the first collective, process group or transfer
that needs it (:meth:`StoreLink.ensure`): the mesh's first proc starts it
and every proc is told where it is (``ConnectStore``, in the mesh's command
order).  When a proc of the mesh dies, the client marks it there
(:meth:`StoreLink.mark_dead`), so that the groups waiting for it fail at
once on every living member (``_worker._collectives``).
"""

from __future__ import annotations

import logging
from typing import Any

from monarch_tensor_engine._protocol import DEAD_KEY, TIMEOUT_S, ConnectStore, dead_key, store_client

__all__ = ["StoreLink"]

logger = logging.getLogger("monarch.tensor")


class StoreLink:
    """``address``: the ``(host, port)`` of the mesh's store, None until started."""

    __slots__ = ("address",)

    def __init__(self) -> None:
        self.address: tuple[str, int] | None = None

    def ensure(self, ctl: Any) -> tuple[str, int]:
        """Start the store of ``ctl``'s mesh, once (its first proc serves it;
        the pending commands go first), and tell every proc where it is; its
        address.  A death the store could not be told of yet is marked."""
        if self.address is not None:
            return self.address
        with ctl.lock:
            if self.address is None:
                ctl.flush()
                self.address = tuple(ctl.ranks[0].start_store.call_one().get(timeout=TIMEOUT_S))
                ctl.send(ConnectStore(*self.address))
                if ctl.dead:
                    self.mark_dead(ctl, "; ".join(f"rank {r}: {why}" for r, why in ctl.dead.items()))
        assert self.address is not None
        return self.address

    def mark_dead(self, ctl: Any, why: str) -> None:
        """Tell the mesh's procs (through its store) which of them died:
        :func:`~monarch_tensor_engine._protocol.dead_key` of each dead rank
        (``ctl.dead``), then ``DEAD_KEY``.  Nothing before the store started."""
        if self.address is None:
            return
        try:
            client = store_client(*self.address)
            for r, reason in list(ctl.dead.items()):
                client.set(dead_key(r), reason)
            client.set(DEAD_KEY, why)
        except Exception as e:  # noqa: BLE001 - the store's proc may be the dead one: its members fail on their own
            logger.info("tensor engine: could not mark the death in the store of %r: %s", ctl.mesh_name, e)
