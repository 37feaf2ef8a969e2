"""Shared fixtures of the acceptance suite for ``monarch_core.actor``.

Everything in ``tests/api`` goes through the public API only (tests that need
internals live in the folder of the layer they reach into: ``tests/actor``,
``tests/kernel`` ...).  Proc meshes cost real worker processes (~0.5 s each to
start), so they are shared per session and stopped at teardown.  Test modules
spawn fresh actor meshes (cheap) on them.  The recording fault hook
(``faults``) comes from ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest

from monarch_core.actor import this_host

from _helpers.config import configured_host_mesh


@pytest.fixture(scope="session")
def procs():
    """Four worker procs on this host: ``{"gpus": 4}``."""
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    yield pm
    pm.stop().get()


@pytest.fixture(scope="session")
def procs2d():
    """Four worker procs on this host in two dimensions: ``{"dp": 2, "tp": 2}``."""
    pm = this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
    yield pm
    pm.stop().get()


@pytest.fixture(scope="session")
def hosts2(tmp_path_factory):
    """A two-host mesh (``{"hosts": 2}``) from the project configuration
    (the built-in ``local`` scheduler), named through ``MONARCH_CONFIG``."""
    hm = configured_host_mesh(tmp_path_factory.mktemp("monarch_cfg"), "api_two", hosts=2)
    yield hm
    hm.shutdown().get()
