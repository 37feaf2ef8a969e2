"""Fixtures of the tcp/tls transport's tests: ``pki`` (a CA and certificates
for the ``tls`` tests) comes from ``_helpers.transport``, as do the helpers
(a client interpreter that gets ``tests/transport`` on ``PYTHONPATH``, so the
actors of ``transport_actors`` travel by reference)."""

from __future__ import annotations

from _helpers.transport import pki  # noqa: F401 - fixtures
