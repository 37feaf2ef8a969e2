"""Fixtures of the supervision suite (the helpers live in ``supervision_helpers``)."""

from __future__ import annotations

from supervision_helpers import (  # noqa: F401 - fixtures
    _record_unhandled_faults,
    faults,
    procs,
)
