"""Small helpers shared by ``run.py`` and ``scaling.py``: statistics and markdown tables.

Standard library only: ``run.py`` imports it and may be run with any Python.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

DASH = "—"


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are numbers; ``None`` when there are none."""
    xs = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    return statistics.median(xs) if xs else None


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, ``q`` in [0, 100] (the anchors' definition)."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def fmt(value: float | None, spec: str = "{:.1f}") -> str:
    """``spec.format(value)``, or a dash for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    try:
        return spec.format(value)
    except (TypeError, ValueError):
        return str(value)


def markdown(headers: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """A markdown table; ``right[i]`` right-aligns column ``i``."""
    right = list(right) if right is not None else [False] + [True] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
