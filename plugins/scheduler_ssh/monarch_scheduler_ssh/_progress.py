"""The bring-up progress bar: ``tqdm`` on a terminal, nothing otherwise."""

from __future__ import annotations

import sys
import threading
from typing import IO, Any


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """Hosts coming up: a bar on ``stream`` (default: standard error) when it
    is a terminal, silent otherwise (logs, pipes, CI).  Thread-safe."""

    def __init__(self, total: int, desc: str, stream: IO[str] | None = None, unit: str = "host") -> None:
        self._lock = threading.Lock()
        self._bar: Any = None
        stream = sys.stderr if stream is None else stream
        if total > 0 and _isatty(stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=stream, leave=False, dynamic_ncols=True,
                             unit_scale=unit == "B")

    @property
    def shown(self) -> bool:
        return self._bar is not None

    def advance(self, name: str, n: int = 1, what: str = "ready") -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.set_postfix_str(f"{name} {what}", refresh=False)
                self._bar.update(n)

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
