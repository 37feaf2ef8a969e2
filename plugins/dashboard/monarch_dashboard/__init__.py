"""``monarch-dashboard``: a live web view of a running monarch-core job.

Served by the client process on ``127.0.0.1`` with a random token in the URL it
prints once; pages for the job's tree (host meshes, hosts, procs, actor
meshes), endpoints (calls, errors, p50/p99, bytes, calls/s, histograms, per
rank), failures and supervision events, the streamed proc output, and a span
timeline with a trace download.  Start it with ``MONARCH_DASHBOARD=1`` (the
plugin's ``monarch_telemetry_sinks`` hook) or from Python::

    from monarch_dashboard import dashboard

    with dashboard() as d:       # prints d.url once
        ...                      # the job

Nothing of it is imported by ``monarch_core``; this module imports the server
only when :func:`dashboard` / :func:`start` is called.  See docs/dashboard.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from monarch_dashboard._dashboard import Dashboard

__all__ = ["dashboard", "start", "stop"]


def start(*, port: Optional[int] = None) -> Dashboard:
    """Start this client's dashboard (or return the one running) and print its URL.

    ``port``: the loopback port (default ``MONARCH_DASHBOARD_PORT``; 0: a free one)."""
    from monarch_dashboard import _dashboard

    return _dashboard.start(port=port)


def stop() -> bool:
    """Stop this client's dashboard; False if none runs."""
    from monarch_dashboard import _dashboard

    d = _dashboard.current()
    if d is None:
        return False
    d.stop()
    return True


@contextlib.contextmanager
def dashboard(*, port: Optional[int] = None) -> Iterator[Dashboard]:
    """The dashboard for the ``with`` block (started if none runs, stopped at the end
    if this block started it)."""
    from monarch_dashboard import _dashboard

    running = _dashboard.current()
    d = running or _dashboard.start(port=port)
    try:
        yield d
    finally:
        if running is None:
            d.stop()
