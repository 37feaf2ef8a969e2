"""Fixtures of the security suite (``security_helpers``): ``other_user``, a
second local user created for these tests, and ``shared_tmp``, a folder both
users can write."""

from __future__ import annotations

from security_helpers import other_user, shared_tmp  # noqa: F401 - fixtures
