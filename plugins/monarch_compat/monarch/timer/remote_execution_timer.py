"""``monarch.timer.remote_execution_timer``: the module the reference's own
``python/monarch/timer/example_monarch.py`` names its remote functions in
(``remote("monarch.timer.remote_execution_timer.execution_timer_start")``).
torchmonarch 0.7.0's wheel has no such module (its functions are in
``monarch.timer.execution_timer``), so that example fails there; here the
name is :mod:`monarch.timer.execution_timer` under the example's name, so
that it runs unchanged (docs/compat.md)."""

from __future__ import annotations

from monarch.timer.execution_timer import (
    ExecutionTimer,
    execution_timer_start,
    execution_timer_stop,
    get_execution_timer_average_ms,
    get_execution_timer_summary,
    get_latest_timer_measurement,
    get_time_perfcounter,
)

__all__ = [
    "ExecutionTimer", "execution_timer_start", "execution_timer_stop", "get_execution_timer_average_ms",
    "get_execution_timer_summary", "get_latest_timer_measurement", "get_time_perfcounter",
]
