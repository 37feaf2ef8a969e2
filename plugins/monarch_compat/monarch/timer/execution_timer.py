"""The reference's ``monarch.timer.execution_timer``: the module its timing
names live in (``remote("monarch.timer.execution_timer.get_time_perfcounter")``
names a function there); each is :mod:`monarch.timer`'s own object."""

from __future__ import annotations

from monarch.timer import (
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
