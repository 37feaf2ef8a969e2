"""The actor an attacker tries to run on the job's hosts (``tests/security``):
its ``__init__`` records who it runs as in a marker file, so a test can tell
that the attack ran code (the file exists) or not."""

from __future__ import annotations

import os

from monarch_core.actor import Actor, endpoint


class Intruder(Actor):
    def __init__(self, marker: str) -> None:
        with open(marker, "w") as f:
            f.write(str(os.getuid()))

    @endpoint
    def whoami(self) -> int:
        return os.getuid()


class Pid(Actor):
    """Says which process it runs in (the job's own actor)."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Talker(Actor):
    """Prints what it is told (a proc's output, for the log-file tests)."""

    @endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)
