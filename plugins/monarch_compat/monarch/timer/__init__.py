"""The reference's ``monarch.timer``: :class:`ExecutionTimer` and its functions.

A monarch-core implementation of the same interface (the reference's is a
torch utility with no actor part): named sections timed with
``time.perf_counter`` on the CPU, or, where CUDA is available and
``use_cpu`` is false, with CUDA events on the current stream (read when the
summary is asked for, so timing never waits for the GPU).  Class-level state,
as the reference's: one set of measurements per process (each proc of a mesh
has its own).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator, Optional

__all__ = [
    "ExecutionTimer",
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_execution_timer_summary",
    "get_latest_timer_measurement",
    "get_time_perfcounter",
]

DEFAULT = "default"


def _cuda() -> Any:
    """torch.cuda when CUDA is usable, else None (torch is not needed for CPU timing)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda if torch.cuda.is_available() else None


class ExecutionTimer:
    """Named timing sections: ``with ExecutionTimer.time("step"): ...``, or
    ``start(name)``/``stop(name)`` (nested starts of one name pair last-in
    first-out); ``summary()`` gives count, mean, total, min and max in ms."""

    _lock = threading.Lock()
    _times: dict[str, list[float]] = {}
    _open: dict[str, list[tuple[str, Any]]] = {}  # name -> started: ("cpu", t0) or ("cuda", (start, end))
    _pending: dict[str, list[tuple[Any, Any]]] = {}  # name -> CUDA event pairs not yet read

    @classmethod
    @contextlib.contextmanager
    def time(cls, name: Optional[str] = None, use_cpu: bool = False) -> Iterator[None]:
        """Time the block as section ``name`` (default ``"default"``)."""
        cls.start(name, use_cpu)
        try:
            yield
        finally:
            cls.stop(name, use_cpu)

    @classmethod
    def start(cls, name: Optional[str] = None, use_cpu: bool = False) -> None:
        """Start timing ``name``: CUDA events when CUDA is available and not ``use_cpu``, else the CPU clock."""
        name = name or DEFAULT
        cuda = None if use_cpu else _cuda()
        with cls._lock:
            cls._times.setdefault(name, [])
            if cuda is None:
                cls._open.setdefault(name, []).append(("cpu", time.perf_counter()))
                return
        begin, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        begin.record()
        with cls._lock:
            cls._open.setdefault(name, []).append(("cuda", (begin, end)))

    @classmethod
    def stop(cls, name: Optional[str] = None, use_cpu: bool = False) -> None:
        """Stop the latest start of ``name``; ``RuntimeError`` if it was not started."""
        name = name or DEFAULT
        now = time.perf_counter()
        with cls._lock:
            started = cls._open.get(name)
            if not started:
                raise RuntimeError(f"ExecutionTimer.stop({name!r}): {name!r} was not started (call start first, "
                                   f"or use `with ExecutionTimer.time({name!r}):`)")
            kind, value = started.pop()
            if kind == "cpu":
                cls._times[name].append((now - value) * 1000.0)
                return
        begin, end = value
        end.record()
        with cls._lock:
            cls._pending.setdefault(name, []).append((begin, end))

    @classmethod
    def _collect(cls) -> None:
        """Read the CUDA measurements (waits for their end events)."""
        with cls._lock:
            pending, cls._pending = cls._pending, {}
        for name, pairs in pending.items():
            for begin, end in pairs:
                end.synchronize()
                with cls._lock:
                    cls._times.setdefault(name, []).append(float(begin.elapsed_time(end)))

    @classmethod
    def reset(cls) -> None:
        """Forget every measurement and open section."""
        with cls._lock:
            cls._times, cls._open, cls._pending = {}, {}, {}

    @classmethod
    def summary(cls) -> dict[str, dict[str, float]]:
        """``{name: {"count", "mean_ms", "total_ms", "min_ms", "max_ms"}}`` of every measured section."""
        cls._collect()
        with cls._lock:
            return {name: {"count": len(ts), "mean_ms": sum(ts) / len(ts), "total_ms": sum(ts), "min_ms": min(ts),
                           "max_ms": max(ts)}
                    for name, ts in cls._times.items() if ts}

    @classmethod
    def get_latest_measurement(cls, name: Optional[str] = None) -> float:
        """The last measurement of ``name`` in ms (0.0 when there is none)."""
        cls._collect()
        with cls._lock:
            ts = cls._times.get(name or DEFAULT)
            return ts[-1] if ts else 0.0


def execution_timer_start(name: Optional[str] = None, use_cpu: bool = False) -> None:
    """``ExecutionTimer.start`` (for remote functions)."""
    ExecutionTimer.start(name, use_cpu)


def execution_timer_stop(name: Optional[str] = None, use_cpu: bool = False) -> None:
    """``ExecutionTimer.stop`` (for remote functions)."""
    ExecutionTimer.stop(name, use_cpu)


def get_latest_timer_measurement(name: Optional[str] = None) -> Any:
    """The last measurement of ``name`` in ms, as a float64 torch scalar tensor (as the reference returns it)."""
    import torch

    return torch.tensor(ExecutionTimer.get_latest_measurement(name), dtype=torch.float64)


def get_execution_timer_average_ms(name: str = DEFAULT) -> Any:
    """The mean of ``name``'s measurements in ms, as a float64 torch scalar tensor (0.0 when none)."""
    import torch

    return torch.tensor(ExecutionTimer.summary().get(name, {}).get("mean_ms", 0.0), dtype=torch.float64)


def get_execution_timer_summary() -> dict[str, dict[str, float]]:
    """``ExecutionTimer.summary()`` (for remote functions)."""
    return ExecutionTimer.summary()


def get_time_perfcounter() -> Any:
    """``time.perf_counter()`` as a float64 torch scalar tensor (a remote function's clock reading)."""
    import torch

    return torch.tensor(time.perf_counter(), dtype=torch.float64)
