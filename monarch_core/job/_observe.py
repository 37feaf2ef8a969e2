"""``TelemetryConfig`` / ``MeshAdminConfig``: the reference's job services,
mapped onto ours.

The reference starts, per job, a sidecar process with a SQL telemetry store,
a dashboard and a "mesh admin" HTTP server.  Here:

* telemetry (endpoint metrics, spans, lifecycle events) is recorded in every
  program anyway and read with ``monarch_core.telemetry``;
* the dashboard and the admin view are one thing, the monarch-dashboard
  plugin (``pip install ./plugins/dashboard``), served by the client process
  on loopback with a token in its URL: ``state.admin_url``,
  ``state.dashboard_url`` and ``state.telemetry_url`` are that URL.  It lives
  as long as the client does (no sidecar outlives it).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional, Protocol, TypeVar

logger = logging.getLogger("monarch.job")

_INSTALL = "pip install ./plugins/dashboard"


@dataclasses.dataclass
class TelemetryConfig:
    """Telemetry services started by :meth:`JobTrait.enable_telemetry` on
    the next ``state()``.

    ``include_dashboard``: log the dashboard's URL (it is started either way
    and is ``state.dashboard_url``).  ``dashboard_port``: the preferred
    loopback port (a free one when it is taken; 0: a free one).
    ``retention_secs`` and ``snapshot_interval_secs`` are the reference's
    knobs of its SQL store and topology snapshots, which do not exist here:
    accepted and checked, without effect (the dashboard keeps the job's
    recent history in memory and shows the live topology)."""

    retention_secs: int = 3600
    include_dashboard: bool = False
    dashboard_port: int = 8265
    snapshot_interval_secs: float = 30.0

    def __post_init__(self) -> None:
        for field, value in (("retention_secs", self.retention_secs),
                             ("snapshot_interval_secs", self.snapshot_interval_secs)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"TelemetryConfig({field}=...) must be a number >= 0, got {value!r}")
        _check_port("TelemetryConfig(dashboard_port=...)", self.dashboard_port)


@dataclasses.dataclass
class MeshAdminConfig:
    """The admin view started by :meth:`JobTrait.enable_admin` on the next
    ``state()``.  ``admin_addr``: ``"127.0.0.1:PORT"`` (or ``"localhost:PORT"``,
    ``":PORT"``, ``"[::1]:PORT"``) to choose its loopback port; ``None``:
    ``MONARCH_DASHBOARD_PORT`` (default: a free port).  It serves loopback
    only; reach it from elsewhere with ``ssh -L``."""

    admin_addr: Optional[str] = None

    def port(self) -> Optional[int]:
        """The port ``admin_addr`` names (``None``: the dashboard's default)."""
        if self.admin_addr is None:
            return None
        host, sep, port = self.admin_addr.rpartition(":")
        host = host.strip("[]")
        if not sep or not port.isdigit() or host not in ("", "127.0.0.1", "localhost", "::1"):
            raise ValueError(
                f"MeshAdminConfig(admin_addr={self.admin_addr!r}): the admin view serves this machine's loopback "
                "only; give '127.0.0.1:PORT' (or None for a free port) and reach it from another machine with "
                "`ssh -L PORT:127.0.0.1:PORT <host>`"
            )
        value = int(port)
        _check_port("MeshAdminConfig(admin_addr=...)", value)
        return value


def _check_port(what: str, port: Any) -> None:
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
        raise ValueError(f"{what} takes a TCP port 0-65535 (0: a free one), got {port!r}")


def _dashboard_module() -> Any:
    try:
        import monarch_dashboard
    except ImportError:
        raise ImportError(
            "the job's admin view and dashboard (enable_admin / enable_telemetry) come with the monarch-dashboard "
            f"plugin, which is not installed here; install it in a monarch-core checkout with `{_INSTALL}`"
        ) from None
    from monarch_core import settings
    from monarch_core._plugins import DISABLE_ENV

    if "dashboard" in set(settings.get(DISABLE_ENV)):
        raise RuntimeError(
            f"the job's admin view and dashboard come with the plugin 'dashboard', which {DISABLE_ENV} turns off "
            f"here; take 'dashboard' out of {DISABLE_ENV}, or do not call enable_admin / enable_telemetry"
        )
    return monarch_dashboard


def _start_dashboard(port: Optional[int]) -> str:
    """The URL of this client's dashboard, started now if none runs (on
    ``port`` when it is free, else on a free one)."""
    dashboard = _dashboard_module()
    try:
        return str(dashboard.start(port=port).url)
    except OSError as e:
        if not port:
            raise
        logger.warning("dashboard port %d is taken (%s); serving on a free port", port, e)
        return str(dashboard.start(port=0).url)


class ServiceURLs(Protocol):
    """What :func:`start_services` fills in (a ``JobState``)."""

    admin_url: Optional[str]
    dashboard_url: Optional[str]
    telemetry_url: Optional[str]


S = TypeVar("S", bound=ServiceURLs)


def start_services(state: S, telemetry: Optional[TelemetryConfig], admin: Optional[MeshAdminConfig]) -> S:
    """``state`` with the URLs of the services the job enabled (started now
    if they do not run yet in this client)."""
    if telemetry is None and admin is None:
        return state
    port: Optional[int] = admin.port() if admin is not None else None
    if port is None and telemetry is not None:
        port = telemetry.dashboard_port
    url = _start_dashboard(port)
    state.admin_url = url
    if telemetry is not None:
        from monarch_core import settings

        if not settings.get("MONARCH_TELEMETRY"):
            logger.warning("enable_telemetry(): MONARCH_TELEMETRY=0 turns instrumentation off in this program; "
                           "the dashboard will show no endpoint metrics")
        state.dashboard_url = state.telemetry_url = url
        if telemetry.include_dashboard:
            logger.info("Monarch Dashboard: %s", url)
    return state
