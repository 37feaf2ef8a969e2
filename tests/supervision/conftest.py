"""Fixtures of the supervision suite: ``faults`` (the recording fault hook)
comes from ``tests/conftest.py``; the helpers from ``_helpers``."""

from __future__ import annotations

import pytest

from monarch_core.actor import this_host


@pytest.fixture(scope="session")
def procs():
    """Two long-lived worker procs (``{"gpus": 2}``) for tests that only kill actors."""
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    pm.initialized.get(timeout=60)
    yield pm
    pm.stop().get(timeout=60)
