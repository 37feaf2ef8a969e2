"""The reference's ``monarch._src.actor.bootstrap``: ``attach_to_workers`` and
``run_worker_loop_forever`` are ``monarch_core.actor``'s (docs/multi-host.md)."""

from __future__ import annotations

from monarch_core.actor import attach_to_workers, run_worker_loop_forever

__all__ = ["attach_to_workers", "run_worker_loop_forever"]
