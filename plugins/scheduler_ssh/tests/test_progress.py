"""The bring-up progress bar: tqdm on a terminal (a real pty), nothing on a
pipe or a file."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import termios

from monarch_scheduler_ssh._progress import Progress
import pytest

pytestmark = pytest.mark.unit


def test_silent_when_not_a_terminal() -> None:
    out = io.StringIO()
    p = Progress(3, "ssh lab: starting worker loops", stream=out)
    assert not p.shown
    p.advance("h1")
    p.close()
    assert out.getvalue() == ""


def test_a_bar_on_a_terminal() -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    try:
        with os.fdopen(os.dup(slave), "w") as stream:
            p = Progress(2, "ssh lab: starting worker loops", stream=stream)
            assert p.shown
            p.advance("h1")
            p.close()
            stream.flush()
        text = os.read(master, 65536).decode(errors="replace")
        assert "ssh lab: starting worker loops" in text and "0/2 [" in text, text
    finally:
        os.close(slave)
        os.close(master)


def test_an_environments_bytes_on_a_terminal_only() -> None:
    """``sync_workspace(conda=True)``: one bar per host counting the bytes that travel."""
    out = io.StringIO()
    p = Progress(10_000_000, "h1: environment venv", stream=out, unit="B")
    assert not p.shown
    p.close()
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    try:
        with os.fdopen(os.dup(slave), "w") as stream:
            p = Progress(10_000_000, "h1: environment venv", stream=stream, unit="B")
            p.advance("site.py", 5_000_000, "copied")
            p.close()
            stream.flush()
        text = os.read(master, 65536).decode(errors="replace")
        assert "h1: environment venv" in text and "/10.0M" in text and "B/s" in text, text  # bytes, scaled
    finally:
        os.close(master)
        os.close(slave)
