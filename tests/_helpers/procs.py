"""Processes seen through ``/proc``: is a pid running, wait until pids are
gone, descendants, kill what a test left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Iterable, Mapping


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): with the pid, it names one
    process even if the pid is reused later.  None if there is no such process."""
    st = _stat(pid)
    return int(st[19]) if st else None


def parent_of(pid: int) -> int | None:
    st = _stat(pid)
    return int(st[1]) if st else None


def pid_running(pid: int, start: int | None = None) -> bool:
    """True while ``pid`` exists and is not a zombie (and, given ``start``,
    is still the process that started then)."""
    st = _stat(pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return start is None or int(st[19]) == start


def pid_gone(pid: int) -> bool:
    return not pid_running(pid)


def start_times(pids: Iterable[int]) -> dict[int, int]:
    """``{pid: start time}`` of running ``pids`` (for :func:`wait_pids_gone`)."""
    out = {}
    for p in pids:
        st = _stat(p)
        assert st is not None and st[0] not in ("Z", "X"), f"pid {p} is not running when first seen"
        out[p] = int(st[19])
    return out


def wait_pids_gone(pids: Iterable[int] | Mapping[int, int], timeout: float = 5.0) -> list[int]:
    """Poll ``/proc`` until none of ``pids`` runs, or ``timeout``; return the
    ones still running.  A ``{pid: start time}`` mapping guards against pid reuse."""
    starts: Mapping[int, int | None] = pids if isinstance(pids, Mapping) else dict.fromkeys(pids)
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p, st in starts.items() if pid_running(p, st)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)  # polling /proc with a deadline


def descendants(pid: int) -> list[int]:
    """PIDs of every live descendant of ``pid``."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            ppid = parent_of(int(d))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def children_of(pid: int) -> list[int]:
    """Live (non-zombie) direct children of ``pid``."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and parent_of(int(d)) == pid and pid_running(int(d))]


def kill_pids(pids: Iterable[int]) -> None:
    """SIGKILL ``pids`` (clean-up; already gone is fine)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


def kill_tree(popen: subprocess.Popen) -> None:
    """SIGKILL a process this test started and every process below it."""
    kids = descendants(popen.pid) if popen.poll() is None else []
    kill_pids([popen.pid, *kids])
    try:
        popen.wait(10)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass
