"""``monarch_core.testing.check_scheduler`` fails the schedulers it must:
one that never calls ``WorkerLaunch.report_lost`` (the core still sees the
procs die, so a ``MeshFailure`` alone proves nothing), one whose
``Allocation.release()`` never returns (bounded by
``MONARCH_RELEASE_TIMEOUT``), and one that reports a healthy host lost while
the mesh is idle (the long-idle check).  Each is the built-in ``local``
scheduler (real worker loops on this machine, over the test process's
``ipc`` transport) broken in one way; the unbroken one passes, the long-idle
check included.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from monarch_core._builtins._local import LocalScheduler
from monarch_core._launch import _alloc
from monarch_core.hookspecs import Allocation, HostHandle, Scheduler
from monarch_core.testing import check_scheduler


def _kill_worker(host: HostHandle) -> None:
    os.kill(int(host.labels["pid"]), signal.SIGKILL)


class _Wrapped(Scheduler):
    """The local scheduler, its launch and allocation changed by the subclass."""

    name = "broken"
    params = LocalScheduler.params

    def validate(self, request: Any) -> None:
        LocalScheduler().validate(request)

    def launch_for(self, launch: Any) -> Any:
        return launch

    def allocate(self, request: Any, launch: Any) -> Any:
        return LocalScheduler().allocate(request, self.launch_for(launch))


class NeverReportsLost(_Wrapped):
    """Its workers die unreported: ``report_lost`` is never called."""

    def launch_for(self, launch: Any) -> Any:
        return dataclasses.replace(launch, report_lost=lambda host, reason: None)


class ReleaseNeverReturns(_Wrapped):
    """``release()`` stops the workers, then waits forever (until the test
    opens ``gate``, so no thread outlives the test)."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def allocate(self, request: Any, launch: Any) -> Any:
        inner = super().allocate(request, launch)
        gate = self.gate

        class Stuck(Allocation):
            hosts = inner.hosts
            extent = inner.extent

            def release(self) -> None:
                inner.release()
                gate.wait()

        return Stuck()


class LosesIdleHosts(_Wrapped):
    """Reports every host lost ``after`` s after bring-up, though nothing is
    wrong (what a channel read timeout taken for end of file did to every SSH
    mesh a minute after bring-up).  ``after`` leaves the kit's first steps
    (about 3 s here) time to finish: only a longer life shows it."""

    after = 10.0

    def allocate(self, request: Any, launch: Any) -> Any:
        alloc = super().allocate(request, launch)

        def lose() -> None:
            if not alloc.released.wait(self.after):
                for h in alloc.hosts:
                    launch.report_lost(h.name, "its channel was silent for 10s (read as its end)")

        threading.Thread(target=lose, daemon=True).start()
        return alloc


@pytest.fixture
def short_release(monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    """``MONARCH_RELEASE_TIMEOUT`` = 3 s for this test (the core reads it at release)."""
    monkeypatch.setattr(_alloc, "RELEASE_TIMEOUT", 3.0)
    yield 3.0


def test_a_scheduler_that_never_calls_report_lost_fails_the_kit() -> None:
    with pytest.raises(AssertionError) as e:
        check_scheduler(NeverReportsLost(), {"hosts": 2}, bad_params={"hosts": 0}, lose_host=_kill_worker, timeout=15)
    msg = str(e.value)
    assert "did not call WorkerLaunch.report_lost('local1', reason)" in msg, msg
    assert "launch.report_lost(host_name, reason)" in msg, msg


def test_a_release_that_never_returns_fails_the_kit(short_release: float) -> None:
    sched = ReleaseNeverReturns()
    try:
        t0 = time.monotonic()
        with pytest.raises(AssertionError) as e:
            check_scheduler(sched, {"hosts": 2}, bad_params={"hosts": 0}, timeout=30)
        msg = str(e.value)
        assert "Allocation.release() did not return within 3s (MONARCH_RELEASE_TIMEOUT)" in msg, msg
        assert time.monotonic() - t0 < 120, "the kit waited far past the release timeout"  # a hang check
    finally:
        sched.gate.set()


def test_a_scheduler_that_loses_idle_hosts_fails_the_long_idle_check() -> None:
    with pytest.raises(AssertionError) as e:
        check_scheduler(LosesIdleHosts(), {"hosts": 2}, bad_params={"hosts": 0}, timeout=30, idle=20)
    msg = str(e.value)
    assert "with the host mesh idle for 20s, the scheduler reported" in msg, msg
    assert "its channel was silent" in msg, msg


def test_the_local_scheduler_passes_the_kit_with_the_long_idle_check() -> None:
    check_scheduler(LocalScheduler(), {"hosts": 2}, bad_params={"hosts": 0}, lose_host=_kill_worker, timeout=60,
                    idle=3)
