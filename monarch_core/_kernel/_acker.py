"""Acknowledgements of one inbound session read on the kernel's loop
(:class:`_Acker`), and the throttled warning about dropped inbound
connections.  The sessions themselves are served by ``Kernel``
(``_runtime``); plain-socket ones are read by the poller thread
(``_inbound``, ``_poller``), which acknowledges synchronously.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from monarch_core._kernel import _wire as W
from monarch_core._kernel._inbound import ACK_DELAY, ACK_EVERY
from monarch_core._kernel._throttle import ThrottledLog

if TYPE_CHECKING:
    from monarch_core.hookspecs import Stream

logger = logging.getLogger("monarch.kernel")


#: Warnings about dropped inbound connections: one line per peer host and
#: reason every 10 s, counting the ones left out (a rejected client retries).
_dropped = ThrottledLog(logger)


class _Acker:
    """Sends cumulative acknowledgements for one inbound session.

    Acknowledgements are off the critical path: one goes out when the read
    buffer drains and ``ACK_EVERY`` messages are unacknowledged, otherwise
    after ``ACK_DELAY`` seconds, so a request/reply exchange costs no extra
    write on either side."""

    ACK_EVERY = ACK_EVERY
    ACK_DELAY = ACK_DELAY

    def __init__(self, stream: Stream, last: int, sender: str = "", eager: bool = False) -> None:
        self.stream = stream
        self.sender = sender
        self.acked = last
        self.last = last
        self.eager = eager  # acknowledge at once (the sender is stopping, or this proc is)
        self.wake = trio.Event()
        self.hurry = False  # the sender asked for the next acknowledgement at once (F_ACK_SOON)
        self.hurried: trio.Event | None = None  # set to cut a delayed acknowledgement's wait short

    def delivered(self, seq: int, drained: bool) -> None:
        self.last = seq
        if drained or seq - self.acked >= self.ACK_EVERY:
            self.wake.set()

    def now(self) -> None:
        """Acknowledge what was delivered without waiting (loop thread)."""
        self.eager = True
        self.wake.set()

    def soon(self) -> None:
        """Acknowledge what is delivered by the time this task runs, without
        the delay, once (loop thread; a message flagged ``F_ACK_SOON``)."""
        self.hurry = True
        self.wake.set()
        if self.hurried is not None:
            self.hurried.set()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake = trio.Event()
            if self.last - self.acked < self.ACK_EVERY and not self.eager and not self.hurry:
                self.hurried = trio.Event()
                with trio.move_on_after(self.ACK_DELAY):
                    await self.hurried.wait()
                self.hurried = None
            self.hurry = False
            last = self.last
            if last > self.acked:
                await self.stream.send_all(W.FIXED.pack(W.K_ACK, 0, 0, 0, 0, last))
                self.acked = last
