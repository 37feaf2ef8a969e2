"""The allocator seam: the scheduler contract, run through the core's allocation path.

Real worker loops (``python -m monarch_core.worker``) on this machine, over the
test process's transport (``ipc``).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
import uuid

import pytest
import trio

from monarch_core._actor import _mesh
from monarch_core._builtins._local import LocalScheduler
from monarch_core._launch import _alloc
from monarch_core.actor import Actor, endpoint, this_host
from monarch_core.errors import AllocationError, ConfigError
from monarch_core.hookspecs import Allocation, AllocationRequest, HostHandle, Scheduler
from monarch_core.testing import check_scheduler

from _helpers import client_runtime
from _helpers.procs import wait_pids_gone

REPO = pathlib.Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "plugin-authors.md"


def _kill_worker(host: HostHandle) -> None:
    os.kill(int(host.labels["pid"]), signal.SIGKILL)


def _request(params: dict, name: str = "t") -> AllocationRequest:
    return AllocationRequest(name=name, params=params, source=f"<test {name}>")


def _allocate(scheduler: Scheduler, params: dict, timeout: float = 60.0):
    rt = client_runtime()
    return _alloc.allocate(scheduler, _request(params), rt, timeout)


class Where(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


# ---------------------------------------------------------------- conformance


def test_local_scheduler_passes_check_scheduler() -> None:
    check_scheduler(LocalScheduler(), {"hosts": 2}, bad_params={"hosts": 0}, lose_host=_kill_worker, timeout=90)


def _doc_scheduler_module() -> types.ModuleType:
    """The complete scheduler of docs/plugin-authors.md, exactly as written there."""
    text = DOC.read_text()
    section = text[text.index("A complete scheduler"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    mod = types.ModuleType("fixed_workers_from_docs")
    exec(compile(code, str(DOC), "exec"), mod.__dict__)
    return mod


def test_the_documented_third_party_scheduler_passes_check_scheduler() -> None:
    mod = _doc_scheduler_module()
    tag = uuid.uuid4().hex[:8]
    workers = [f"ipc://@fixed-{tag}-{i}" for i in range(2)]
    check_scheduler(mod.FixedWorkers(), {"workers": workers}, bad_params={"workers": []}, lose_host=_kill_worker,
                    timeout=90)


# ---------------------------------------------------------------- shapes, names, labels


class Racks(Scheduler):
    """Four local worker loops shaped ``{"racks": 2, "hosts": 2}`` (built on the local scheduler)."""

    name = "racks"

    def allocate(self, request, launch):
        inner = LocalScheduler().allocate(_request({"hosts": 4}), launch)
        outer = self

        class A(Allocation):
            hosts = [HostHandle(f"r{i // 2}h{i % 2}", h.address, {"rack": f"r{i // 2}", **h.labels})
                     for i, h in enumerate(inner.hosts)]
            extent = {"racks": 2, "hosts": 2}

            def release(self):
                outer.released = True
                inner.release()

        return A()


def test_multi_dimensional_host_mesh_names_and_labels_reach_the_tables() -> None:
    from monarch_core._mesh._shape import Extent

    record = _allocate(Racks(), {})
    hm = _mesh.host_mesh_of(record, "racks")
    try:
        assert hm.extent == Extent(["racks", "hosts"], [2, 2])
        table = hm.to_table()
        for name in ("r0h0", "r0h1", "r1h0", "r1h1"):
            assert name in table
        assert "rack=r1" in table
        pm = hm.spawn_procs(per_host={"gpus": 1})
        pids = pm.spawn("w", Where).pid.call().get(timeout=60)
        assert pids.extent == Extent(["racks", "hosts", "gpus"], [2, 2, 1])
        assert "r1h1" in pm.to_table().splitlines()[-1]
        assert [h.name for h in hm.slice(racks=1).hosts] == ["r1h0", "r1h1"]
    finally:
        hm.shutdown().get(timeout=60)


# ---------------------------------------------------------------- readiness, transport, errors


class Ghost(Scheduler):
    """One real worker loop and one address nobody listens on."""

    name = "ghost"

    def allocate(self, request, launch):
        inner = LocalScheduler().allocate(_request({"hosts": 1}), launch)
        self.inner = inner
        this = self

        class A(Allocation):
            hosts = [inner.hosts[0], HostHandle("ghost-host", f"ipc://@nobody-{uuid.uuid4().hex}")]

            def release(self):
                this.released = True
                inner.release()

        return A()


def test_readiness_fails_naming_the_host_that_did_not_answer_and_releases() -> None:
    s = Ghost()
    with pytest.raises(AllocationError) as ei:
        _allocate(s, {}, timeout=5)
    msg = str(ei.value)
    assert "1 of 2 worker loops did not answer" in msg and "ghost-host" in msg and "local0" not in msg
    assert s.released
    assert wait_pids_gone([s.inner.procs[0].pid], 10) == []


class WrongScheme(Scheduler):
    name = "wrong"

    def allocate(self, request, launch):
        class A(Allocation):
            hosts = [HostHandle("h0", "tcp://127.0.0.1:1")]

            def release(self):
                WrongScheme.released = True

        return A()


def test_a_worker_scheme_other_than_the_clients_is_a_clear_error_before_anything_is_sent() -> None:
    with pytest.raises(AllocationError) as ei:
        _allocate(WrongScheme(), {})
    msg = str(ei.value)
    assert "'tcp'" in msg and "'ipc'" in msg and "h0" in msg
    assert WrongScheme.released


class Raises(Scheduler):
    name = "raises"

    def allocate(self, request, launch):
        raise OSError("no route to the cluster")


def test_a_foreign_exception_from_allocate_becomes_an_allocation_error_naming_the_scheduler() -> None:
    with pytest.raises(AllocationError, match=r"scheduler 'raises' \(<test t>\) could not allocate hosts: "
                                              r"OSError: no route to the cluster"):
        _allocate(Raises(), {})


# ---------------------------------------------------------------- off the loop, timeout, cancellation


class Blocks(Scheduler):
    """Blocks (time.sleep) until told, or until the core cancels it."""

    name = "blocks"

    def __init__(self) -> None:
        self.go = threading.Event()
        self.started = threading.Event()
        self.saw_cancel = threading.Event()

    def allocate(self, request, launch):
        self.started.set()
        while not self.go.is_set():
            if launch.cancelled.is_set():
                self.saw_cancel.set()
                break
            time.sleep(0.05)
        return LocalScheduler().allocate(_request({"hosts": 1}), launch)


def test_a_blocking_allocate_does_not_stall_messaging_of_an_existing_mesh() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    mesh = pm.spawn("w", Where)
    mesh.pid.call().get(timeout=60)
    s = Blocks()
    box: dict = {}

    def run() -> None:
        try:
            box["record"] = _allocate(s, {})
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    try:
        assert s.started.wait(30)
        for _ in range(20):  # the kernel keeps serving while allocate sleeps
            mesh.pid.call().get(timeout=10)
        assert not box
    finally:
        s.go.set()
        t.join(60)
        pm.stop().get(timeout=30)
    hm = _mesh.host_mesh_of(box["record"], "blocks")
    hm.shutdown().get(timeout=30)


def test_allocate_past_its_timeout_is_cancelled_and_a_late_result_released() -> None:
    s = Blocks()
    with pytest.raises(AllocationError, match=r"did not allocate hosts within 1s; it was cancelled"):
        _allocate(s, {}, timeout=1)
    assert s.saw_cancel.wait(10)


class AsyncForever(Scheduler):
    name = "async-forever"
    cancelled = False

    async def allocate(self, request, launch):
        try:
            await trio.sleep_forever()
        finally:
            AsyncForever.cancelled = True


def test_an_async_allocate_runs_off_the_loop_and_is_cancelled_at_its_timeout() -> None:
    with pytest.raises(AllocationError, match="within 1s"):
        _allocate(AsyncForever(), {}, timeout=1)
    deadline = time.monotonic() + 10
    while not AsyncForever.cancelled and time.monotonic() < deadline:
        time.sleep(0.05)
    assert AsyncForever.cancelled


class Legacy(Scheduler):
    """The first contract: ``async def allocate(self, request)``, hosts without workers."""

    name = "legacy"

    async def allocate(self, request):
        class A(Allocation):
            hosts = [HostHandle("old0"), HostHandle("old1")]

            async def release(self):
                Legacy.released = True

        return A()


def test_a_scheduler_of_the_first_contract_still_works() -> None:
    hm = _mesh.host_mesh_of(_allocate(Legacy(), {}), "legacy")
    pm = hm.spawn_procs()
    assert len(pm.spawn("w", Where).pid.call().get(timeout=60)) == 2
    hm.shutdown().get(timeout=30)
    assert Legacy.released


# ---------------------------------------------------------------- configuration


def test_defaults_keys_a_scheduler_does_not_take_are_left_out(tmp_path, monkeypatch) -> None:
    from monarch_core.actor import hosts_from_config

    cfg = tmp_path / "monarch.toml"
    cfg.write_text('[defaults]\npartition = "gpu"\n\n[hosts.dev]\nscheduler = "local"\nhosts = 1\n')
    monkeypatch.setenv("MONARCH_CONFIG", str(cfg))
    hm = hosts_from_config("dev", timeout=60)
    try:
        assert [h.name for h in hm.hosts] == ["local0"]
    finally:
        hm.shutdown().get(timeout=30)
    cfg.write_text('[hosts.dev]\nscheduler = "local"\npartition = "gpu"\n')
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) \['partition'\] for scheduler 'local'"):
        hosts_from_config("dev")


# ---------------------------------------------------------------- release on every exit path

CLIENT = textwrap.dedent(
    """
    import json, os, sys, time
    from monarch_core._actor import _mesh
    from monarch_core._launch import _start
    from monarch_core._proc import _state
    from monarch_core._builtins._local import LocalScheduler
    from monarch_core._launch import _alloc
    from monarch_core.actor import Actor, endpoint
    from monarch_core.hookspecs import AllocationRequest

    class Marked(LocalScheduler):  # the local scheduler, noting its release in a file
        def allocate(self, request, launch):
            alloc = super().allocate(request, launch)
            release = alloc.release
            def marked():
                release()
                open(sys.argv[2], "w").write("released")
            alloc.release = marked
            return alloc

    class Dies(Actor):
        @endpoint
        def die(self):
            os._exit(3)

    _start.ensure_runtime()
    record = _alloc.allocate(Marked(), AllocationRequest("two", {"hosts": 2}, "<client>"), _state.current(), 60)
    hm = _mesh.host_mesh_of(record, "two")
    pids = [int(h.labels["pid"]) for h in hm.hosts]
    pm = hm.spawn_procs()
    mesh = pm.spawn("d", Dies)
    print(json.dumps(pids), flush=True)
    if sys.argv[1] == "fault":
        mesh.die.broadcast()   # the proc dies: an unhandled supervision failure ends this client
    time.sleep(120)
    """
)


@pytest.mark.parametrize("how", ["fault", "sigterm"])
def test_the_client_releases_its_hosts_when_it_ends_on_a_fault_or_sigterm(tmp_path, how) -> None:
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    marker = tmp_path / "released"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    p = subprocess.Popen([sys.executable, str(script), how, str(marker)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, text=True)
    try:
        pids = json.loads(p.stdout.readline())
        assert len(pids) == 2
        if how == "sigterm":
            p.send_signal(signal.SIGTERM)
        rc = p.wait(60)
        err = p.stderr.read()
        assert rc == (1 if how == "fault" else 128 + signal.SIGTERM), err
        assert marker.exists(), f"Allocation.release() did not run before the client exited:\n{err}"
        assert wait_pids_gone(pids, 10) == []
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_the_monarch_schedulers_docstring_example_passes_check_scheduler() -> None:
    import monarch_core.hookspecs as hs

    doc = hs.monarch_schedulers.__doc__
    block = doc[doc.index("# my_sched/plugin.py"):doc.index("    with ``[project.entry-points")]
    code = textwrap.dedent("        " + block)
    mod = types.ModuleType("my_sched_from_docstring")
    exec(compile(code, "hookspecs.monarch_schedulers", "exec"), mod.__dict__)
    check_scheduler(mod.LoopbackWorkers(), {"hosts": 2}, bad_params={"hosts": 0}, lose_host=_kill_worker,
                    timeout=90)
