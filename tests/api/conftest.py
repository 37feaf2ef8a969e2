"""Shared fixtures of the acceptance suite for ``monarch_core.actor``.

Everything here goes through the public API only.  Proc meshes cost real
worker processes (~0.5 s each to start), so they are shared per session and
stopped at teardown.  Test modules spawn fresh actor meshes (cheap) on them.
"""

from __future__ import annotations

import os
import textwrap

import pytest

import monarch_core.actor as mactor
from monarch_core.actor import hosts_from_config, this_host

#: Supervision failures that reached the client during the session.  The
#: spec's default ``unhandled_fault_hook`` exits the client; the suite installs
#: a recorder (the documented way to customise it) so that a test which makes
#: an actor fail on purpose cannot take the whole pytest process down.
UNHANDLED_FAILURES: list = []


def _recording_fault_hook(failure) -> None:  # noqa: ANN001
    UNHANDLED_FAILURES.append(failure)


@pytest.fixture(scope="session", autouse=True)
def _record_unhandled_faults():
    saved = mactor.unhandled_fault_hook
    mactor.unhandled_fault_hook = _recording_fault_hook
    yield UNHANDLED_FAILURES
    mactor.unhandled_fault_hook = saved


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
    cfg = tmp_path_factory.mktemp("monarch_cfg") / "monarch.toml"
    cfg.write_text(
        textwrap.dedent(
            """
            [hosts.api_two]
            scheduler = "local"
            hosts = 2
            """
        )
    )
    saved = os.environ.get("MONARCH_CONFIG")
    os.environ["MONARCH_CONFIG"] = str(cfg)
    try:
        hm = hosts_from_config("api_two")
    finally:
        if saved is None:
            os.environ.pop("MONARCH_CONFIG", None)
        else:
            os.environ["MONARCH_CONFIG"] = saved
    yield hm
    hm.shutdown().get()
