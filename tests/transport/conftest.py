"""Fixtures of the multi-host transport suite; they and the helpers behind
them live in ``_helpers.transport`` (tests import that, never ``conftest``)."""

from __future__ import annotations

from _helpers.transport import (  # noqa: F401 - fixtures
    clients,
    links_up,
    netns,
    pki,
    run_client_fixture,
    workers,
)
