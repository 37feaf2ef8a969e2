"""Helpers of the supervision suite (imported by conftest and the tests).

Real processes and signals only.  Synchronisation is always on something the
library delivers (futures, ports, the recorded ``unhandled_fault_hook``) with
generous timeouts, so that a hang fails instead of blocking the suite; a few
checks poll ``/proc`` with a deadline.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import monarch_core.actor as mactor
from monarch_core.actor import this_host

#: generous timeout for anything that must arrive (a hang fails the test)
T = 10.0

_names = itertools.count()
REPO = Path(__file__).resolve().parents[2]


def fresh(prefix: str) -> str:
    """A mesh name unique in this session (so failures can be told apart)."""
    return f"{prefix}_{os.getpid()}_{next(_names)}"


# ----------------------------------------------------------------------- fault recorder


class FaultRecorder:
    """The ``unhandled_fault_hook`` installed for the whole session: records
    every failure that reaches the client and lets tests wait for one."""

    def __init__(self) -> None:
        self.failures: list[Any] = []
        self.threads: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, failure: Any) -> None:
        with self._cond:
            self.failures.append(failure)
            self.threads.append(threading.current_thread().name)
            self._cond.notify_all()

    def for_mesh(self, name: str) -> list[Any]:
        with self._cond:
            return [f for f in self.failures if f.mesh_name == name]

    def wait_for(self, pred: Callable[[Any], bool], timeout: float = T, what: str = "a failure") -> Any:
        """The first recorded failure satisfying ``pred`` (waits up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for f in self.failures:
                    if pred(f):
                        return f
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"unhandled_fault_hook was not called with {what} within {timeout}s; "
                        f"got {[repr(f) for f in self.failures]}"
                    )
                self._cond.wait(left)

    def wait_mesh(self, name: str, timeout: float = T, n: int = 1) -> list[Any]:
        """Wait until ``n`` failures of mesh ``name`` were recorded; return them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                got = [f for f in self.failures if f.mesh_name == name]
                if len(got) >= n:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"expected {n} failure(s) of mesh {name!r} within {timeout}s, got {len(got)}: "
                        f"{[repr(f) for f in self.failures]}"
                    )
                self._cond.wait(left)


RECORDER = FaultRecorder()


@pytest.fixture(scope="session", autouse=True)
def _record_unhandled_faults():
    """Install the recorder (the documented way: assign
    ``monarch_core.actor.unhandled_fault_hook``) so that failures made on
    purpose cannot end pytest; restore the previous hook afterwards."""
    saved = mactor.unhandled_fault_hook
    mactor.unhandled_fault_hook = RECORDER
    yield RECORDER
    mactor.unhandled_fault_hook = saved


@pytest.fixture
def faults() -> FaultRecorder:
    return RECORDER


def join_hook_threads(timeout: float = T) -> None:
    """Let hook calls already started finish (they run on helper threads)."""
    deadline = time.monotonic() + timeout
    for t in threading.enumerate():
        if t is not threading.current_thread() and "fault-hook" in t.name:
            t.join(max(0.0, deadline - time.monotonic()))


# ----------------------------------------------------------------------- procs


@pytest.fixture(scope="session")
def procs():
    """Two long-lived worker procs (``{"gpus": 2}``) for tests that only kill actors."""
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    pm.initialized.get(timeout=60)
    yield pm
    pm.stop().get(timeout=60)


# ----------------------------------------------------------------------- /proc


def pid_gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (absent, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    state = stat.rsplit(")", 1)[1].split()[0]
    return state in ("Z", "X")


def wait_pids_gone(pids: list[int], deadline_s: float = 5.0) -> list[int]:
    """Poll /proc until every pid is gone; return those still alive at the deadline."""
    deadline = time.monotonic() + deadline_s
    alive = [p for p in pids if not pid_gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if not pid_gone(p)]
    return alive


def kill_leftovers(pids: list[int]) -> None:
    import signal

    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass


# ----------------------------------------------------------------------- subprocess clients


def client_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MONARCH_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def write_script(tmp_path: Path, body: str, name: str = "client.py") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def run_client(script: Path, *args: str, timeout: float = 60.0, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=str(script.parent),
        env=client_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
