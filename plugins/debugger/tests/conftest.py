"""Fixtures of the debugger suite: the multi-host ones come from
``_helpers.transport`` (tests import helpers from ``debugger_helpers``)."""

from __future__ import annotations

from _helpers.transport import netns, pki, workers  # noqa: F401 - fixtures
