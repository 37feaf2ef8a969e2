"""Fixtures of the telemetry suite: real procs on this host (shared per module,
stopped at teardown) and, for the multi-host tests, the network-namespace
worker loops of ``_helpers.transport``."""

from __future__ import annotations

import pytest

from _helpers.transport import netns, workers  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def procs():
    """Two worker procs on this host: ``{"gpus": 2}``."""
    from monarch_core.actor import this_host

    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=60)
