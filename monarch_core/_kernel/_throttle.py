"""Rate-limited logging of connections a proc drops.

A peer that keeps reconnecting after being rejected (a certificate this
proc's CA did not sign, a ``tcp://`` client at a TLS port) must not turn
every attempt into a log line.  :class:`ThrottledLog` writes the first line
for a peer host and reason at once, then at most one per ``interval``; that
next line counts the ones left out in between.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

from monarch_core import settings

#: Seconds between two log lines about the same peer host and reason
#: (``MONARCH_DROP_LOG_INTERVAL``; 0 logs every one).
REJECTION_LOG_INTERVAL: float = settings.get("MONARCH_DROP_LOG_INTERVAL")

_PORT = re.compile(r":\d+$")


def peer_host(peer: str) -> str:
    """``host`` of ``host:port`` / ``[v6]:port`` (other forms unchanged)."""
    return _PORT.sub("", peer)


class ThrottledLog:
    """Log lines about peers, at most one per (peer host, reason) per
    ``interval`` seconds (thread-safe).

    The reason is the message with the peer's ``host:port`` replaced by its
    host, so every connection from one host that fails the same way shares a
    line, while a different failure from that host still shows at once."""

    def __init__(self, logger: logging.Logger, interval: float = REJECTION_LOG_INTERVAL, *,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 4096) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self.max_keys = max_keys
        self._lock = threading.Lock()
        # key -> [time of the last line written, lines left out since]
        self._last: dict[tuple[str, str], list] = {}

    def log(self, level: int, peer: str, msg: str) -> None:
        """Log ``msg`` (about a connection from ``peer``) unless a line with
        the same host and reason was logged less than ``interval`` s ago."""
        if not self.logger.isEnabledFor(level):
            return
        host = peer_host(peer)
        key = (host, msg.replace(peer, host) if peer else msg)
        now = self.clock()
        with self._lock:
            entry = self._last.get(key)
            if entry is not None and now - entry[0] < self.interval:
                entry[1] += 1
                return
            left_out = 0
            if entry is not None:
                left_out = entry[1]
                elapsed = now - entry[0]
            if len(self._last) >= self.max_keys:
                self._forget_old(now)
            self._last[key] = [now, 0]
        if left_out:
            self.logger.log(level, "%s (and %d more like it from %s in the last %.0f s)", msg, left_out, host, elapsed)
        else:
            self.logger.log(level, "%s", msg)

    def warning(self, peer: str, msg: str) -> None:
        self.log(logging.WARNING, peer, msg)

    def _forget_old(self, now: float) -> None:
        old = [k for k, (t, _n) in self._last.items() if now - t >= self.interval]
        for k in old or list(self._last)[: len(self._last) // 2]:
            del self._last[k]
