"""Fixtures of the Slurm suite: the testbed's real cluster (``slurm``,
``netns`` from ``_helpers.testbed``) and ``cluster``, which also ends every
job this suite submitted and checks that nothing it started is left in the
hosts (helpers: ``slurm_helpers``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _helpers.testbed import SlurmTestbed, Testbed, netns, slurm  # noqa: E402,F401 - fixtures

import slurm_helpers as H  # noqa: E402


@pytest.fixture(scope="module")
def cluster(slurm: SlurmTestbed, netns: Testbed) -> Iterator[SlurmTestbed]:  # noqa: F811
    """The cluster, for one module: at its end every job of this suite is
    cancelled and no process the tests started may be left on its nodes (h5..h7)."""
    H.cancel_our_jobs()
    yield slurm
    H.cancel_our_jobs()
    left = H.leftovers(netns)
    assert not left, f"processes left in the Slurm nodes after the module: {left}"
