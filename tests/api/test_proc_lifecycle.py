"""Proc meshes: ``spawn_procs(bootstrap=...)``, ``initialized``, ``stop``,
and ``shutdown_context()`` (in a subprocess, since it ends the context)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time

import pytest

from monarch_core.actor import Actor, ProcMesh, endpoint, this_host

from _helpers import fresh


BOOT_VAR = "MC_API_BOOTSTRAP_MARK"
#: set by the bootstrap functions inside the worker procs
BOOT_LOG: list = []


def sync_bootstrap() -> None:
    os.environ[BOOT_VAR] = f"sync:{os.getpid()}"
    BOOT_LOG.append("sync")


async def async_bootstrap() -> None:
    await asyncio.sleep(0)
    os.environ[BOOT_VAR] = f"async:{os.getpid()}"
    BOOT_LOG.append("async")


class BootReader(Actor):
    def __init__(self) -> None:
        # captured in __init__: bootstrap must have run before any actor
        self.at_init = (os.environ.get(BOOT_VAR), list(BOOT_LOG))

    @endpoint
    def seen(self) -> tuple:
        return (self.at_init, os.getpid())


def test_spawn_procs_returns_a_proc_mesh_and_initializes() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        assert isinstance(pm, ProcMesh)
        assert pm.sizes == {"gpus": 2}
        assert pm.initialized.get(timeout=60) is True
        assert pm.initialized.get() is True  # observing again
    finally:
        pm.stop().get()


def test_sync_bootstrap_runs_in_each_proc_before_actors() -> None:
    assert BOOT_VAR not in os.environ
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=sync_bootstrap)
    try:
        r = pm.spawn(fresh("boot"), BootReader)
        got = r.seen.call().get().values()
        assert [g[0] for g in got] == [(f"sync:{pid}", ["sync"]) for (_a, pid) in got]
        assert len({pid for (_a, pid) in got}) == 2
    finally:
        pm.stop().get()
    # it ran in the workers, not here
    assert BOOT_VAR not in os.environ
    assert BOOT_LOG == []


def test_async_bootstrap_runs_in_each_proc_before_actors() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=async_bootstrap)
    try:
        assert pm.initialized.get(timeout=60) is True
        r = pm.spawn(fresh("boot"), BootReader)
        got = r.seen.call().get().values()
        assert [g[0] for g in got] == [(f"async:{pid}", ["async"]) for (_a, pid) in got]
    finally:
        pm.stop().get()


def test_no_bootstrap_leaves_procs_untouched(procs) -> None:
    r = procs.spawn(fresh("boot"), BootReader)
    assert [g[0] for g in r.seen.call().get().values()] == [(None, [])] * 4


def test_stop_completes_and_can_be_repeated() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    r = pm.spawn(fresh("boot"), BootReader)
    assert len(r.seen.call().get().values()) == 1
    assert pm.stop().get(timeout=60) is None
    assert pm.stop().get(timeout=60) is None


def test_procs_survive_an_idle_period() -> None:
    """Procs must stay up while the client is idle.  (The sleep is the
    condition under test, not synchronisation: it outlasts any idle-thread
    timeout in the client.)"""
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        r = pm.spawn(fresh("boot"), BootReader)
        before = [pid for (_a, pid) in r.seen.call().get().values()]
        time.sleep(12)
        after = [pid for (_a, pid) in r.seen.call().get(timeout=30).values()]
        assert after == before
    finally:
        pm.stop().get()


_SHUTDOWN_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {here!r})
    from monarch_core.actor import Future, shutdown_context, this_host
    from test_proc_lifecycle import BootReader

    pm = this_host().spawn_procs(per_host={{"gpus": 2}})
    r = pm.spawn("boot", BootReader)
    assert len(r.seen.call().get().values()) == 2
    f1 = shutdown_context()
    assert isinstance(f1, Future), type(f1)
    assert f1.get(timeout=60) is None
    f2 = shutdown_context()
    assert isinstance(f2, Future), type(f2)
    assert f2.get(timeout=5) is None
    assert shutdown_context().get(timeout=5) is None
    print("SHUTDOWN-OK", flush=True)
    """
)


def test_shutdown_context_is_idempotent_in_subprocess() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run(
        [sys.executable, "-c", _SHUTDOWN_SCRIPT.format(here=here)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SHUTDOWN-OK" in proc.stdout


_SHUTDOWN_NOTHING_SCRIPT = textwrap.dedent(
    """
    from monarch_core.actor import shutdown_context
    assert shutdown_context().get(timeout=30) is None
    assert shutdown_context().get(timeout=30) is None
    print("EMPTY-SHUTDOWN-OK", flush=True)
    """
)


def test_shutdown_context_without_any_mesh() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SHUTDOWN_NOTHING_SCRIPT],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    assert "EMPTY-SHUTDOWN-OK" in proc.stdout


class _Tracker:
    """A module global whose ``__del__`` writes a file: run by the interpreter's finalization."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __del__(self, _open=open) -> None:  # (module teardown: builtins may be gone, as in any program)
        with _open(self.path, "wb") as f:  # binary: a text file would look up its encoding, maybe torn down by now
            f.write(b"del")


def _write_atexit(path: str) -> None:
    with open(path, "w") as f:
        f.write("atexit")


class Finalizers(Actor):
    @endpoint
    def arm(self, path: str) -> int:
        import atexit

        global _TRACKER
        atexit.register(_write_atexit, path + ".atexit")
        _TRACKER = _Tracker(path + ".del")
        return os.getpid()


@pytest.mark.parametrize("how", ["forked", "exec"])
def test_a_stopped_proc_runs_atexit_handlers_and_module_finalizers(how: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from monarch_core.actor import BootstrapCommand

    cmd = None if how == "forked" else BootstrapCommand(sys.executable, arg0=sys.executable)  # arg0: no fork server
    pm = this_host().spawn_procs(per_host={"gpus": 1}, bootstrap_command=cmd)
    base = str(tmp_path / "proc")
    pid = pm.spawn("fin", Finalizers).arm.call_one(base).get(timeout=60)
    pm.stop().get(timeout=60)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "proc.atexit").read_text() == "atexit"
    assert (tmp_path / "proc.del").read_text() == "del"


def test_a_stopped_proc_of_a_worker_loop_runs_atexit_handlers_and_module_finalizers(configured_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A worker loop forks its procs from a zygote forked from itself: such a
    proc still ends through normal interpreter finalization."""
    hm = configured_hosts("one", hosts=1)
    pm = hm.spawn_procs(per_host={"gpus": 1})
    base = str(tmp_path / "proc")
    pid = pm.spawn("fin", Finalizers).arm.call_one(base).get(timeout=60)
    zygote = _parent(pid)
    assert open(f"/proc/{zygote}/comm").read().strip() == "monarch-zygote"
    worker = _parent(zygote)
    assert open(f"/proc/{worker}/cmdline", "rb").read() == open(f"/proc/{zygote}/cmdline", "rb").read()  # forked
    pm.stop().get(timeout=60)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "proc.atexit").read_text() == "atexit"
    assert (tmp_path / "proc.del").read_text() == "del"
    assert os.path.exists(f"/proc/{worker}"), "the worker loop ended with its proc"


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])
