"""The client's output, copied line by line to the dashboard.

The client prints the output its procs stream to it (``[<actor> <host>] text``)
on its own ``sys.stdout`` / ``sys.stderr``; :class:`Tee` replaces both while a
dashboard runs, writes everything through unchanged, and hands each whole line
to the :class:`~monarch_dashboard._model.JobModel`.  (The telemetry sink hook
carries no output lines; see docs/dashboard.md.)
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

MAX_PARTIAL = 64 << 10


class Tee(io.TextIOBase):
    """A text stream that writes to ``original`` and calls ``sink(name, lines)``
    with each completed line (without its newline)."""

    def __init__(self, name: str, original: Any, sink: Callable[[str, Iterable[str]], None]) -> None:
        self._name = name
        self._original = original
        self._sink = sink
        self._partial = ""
        self._lock = threading.Lock()

    @property
    def original(self) -> Any:
        return self._original

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", "utf-8") or "utf-8"

    @property
    def errors(self) -> str:  # type: ignore[override]
        return getattr(self._original, "errors", "strict") or "strict"

    @property
    def buffer(self) -> Any:
        return self._original.buffer

    def fileno(self) -> int:
        return int(self._original.fileno())

    def isatty(self) -> bool:
        return bool(self._original.isatty())

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        n = self._original.write(s)
        lines: list[str] = []
        with self._lock:
            text = self._partial + s
            if "\n" in text:
                *lines, self._partial = text.split("\n")
            else:
                self._partial = text if len(text) < MAX_PARTIAL else ""
        if lines:
            try:
                self._sink(self._name, lines)
            except Exception:  # noqa: BLE001 - the dashboard must never break printing
                pass
        return len(s) if n is None else int(n)

    def flush(self) -> None:
        self._original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


def install(sink: Callable[[str, Iterable[str]], None]) -> tuple[Tee, Tee]:
    """Put tees in front of ``sys.stdout`` and ``sys.stderr``."""
    out = Tee("stdout", sys.stdout, sink)
    err = Tee("stderr", sys.stderr, sink)
    sys.stdout, sys.stderr = out, err
    return out, err


def uninstall(tees: tuple[Tee, Tee]) -> None:
    """Put the original streams back (where nothing replaced the tees meanwhile)."""
    out, err = tees
    if sys.stdout is out:
        sys.stdout = out.original
    if sys.stderr is err:
        sys.stderr = err.original
