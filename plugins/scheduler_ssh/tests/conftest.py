"""Fixtures of the SSH scheduler suite: the testbed's namespace hosts and
their OpenSSH servers (``_helpers.testbed``); the suite's helpers are in
``ssh_helpers`` (import that, never ``conftest``)."""

from __future__ import annotations

import pytest
from _helpers.testbed import links_up, netns, sshd  # noqa: F401 - fixtures

pytest.importorskip("paramiko", reason="the ssh scheduler needs paramiko (pip install ./plugins/scheduler_ssh)")


def _installed() -> bool:
    from importlib import metadata

    return any(ep.name == "scheduler_ssh" for ep in metadata.entry_points(group="monarch"))


@pytest.fixture(autouse=True, scope="session")
def _ssh_plugin_installed() -> None:
    if not _installed():
        pytest.skip("monarch-scheduler-ssh is not installed (pip install -e plugins/scheduler_ssh; scripts/test.sh "
                    "does): clients find the ssh scheduler through its entry point")
