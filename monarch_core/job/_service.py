"""Service ids of worker loops (the reference's ``new_service_proc_id``).

A worker loop started at ``ID@tls://host:29500`` (``python -m
monarch_core.worker --address ID@ADDRESS``, ``run_worker_loop_forever``)
serves at ``tls://host:29500`` and tells whoever attaches its id;
``attach_to_workers(["ID@tls://host:29500"])`` refuses a worker loop at that
address that was started with another id or none (a stale worker from an
earlier job, a port reused by another user's loop).
"""

from __future__ import annotations

from monarch_core._launch._worker import new_service_id


def new_service_proc_id() -> str:
    """A fresh service id (``service-`` and 16 hex digits) to start a worker
    loop with and attach to it by: ``f"{new_service_proc_id()}@tcp://127.0.0.1:{port}"``."""
    return new_service_id()
