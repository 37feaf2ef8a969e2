"""The job's rendezvous store, hosted by rank 0's proc as torchrun's agent
hosts it.

Under torchrun the ``TCPStore`` server at ``MASTER_ADDR:MASTER_PORT`` lives
in the elastic agent of node 0, and every worker, rank 0's too, is one of
its clients (``TORCHELASTIC_USE_AGENT_STORE=True``): the server outlives
every worker, so a rank that ends (or exits without
``destroy_process_group()``) never pulls the store from under its peers.
Contract of :func:`host`: with torch importable, a new ``TCPStore`` server
listening on ``port`` (every interface), kept alive by the returned object,
with no key in it; ``None`` when torch is not installed in this proc (rank
0's script then hosts the store itself, ``TORCHELASTIC_USE_AGENT_STORE=False``,
which every rank decides alike through :func:`available`).  A port that cannot
be bound raises ``RuntimeError`` saying how to choose another.
"""

from __future__ import annotations

import datetime
import importlib.util
import logging
from typing import Any

logger = logging.getLogger("monarch.spmd")

#: how long a client of the store waits for an answer (torch's default rendezvous timeout)
TIMEOUT_S = 900.0


def available() -> bool:
    """Whether this proc can host the store (torch is installed; nothing is imported)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def host(addr: str, port: int) -> Any:
    """A fresh ``TCPStore`` server on ``port`` (see the module docstring), or ``None`` without torch."""
    if not available():
        return None
    from torch.distributed import TCPStore

    try:
        store = TCPStore(addr, port, None, True, datetime.timedelta(seconds=TIMEOUT_S), wait_for_workers=False)
    except Exception as e:  # torch raises RuntimeError/DistNetworkError for a port in use
        raise RuntimeError(f"rank 0's proc could not host the rendezvous store on port {port} ({addr}): {e}; the "
                           f"port is taken: leave master_port out (a free one is chosen) or give another") from e
    logger.info("hosting the job's rendezvous store at %s:%s", addr, port)
    return store
