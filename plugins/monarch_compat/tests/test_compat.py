"""monarch-compat: every name it maps, with small programs of our own (real
procs, no mocks), and the check that refuses a second provider of ``monarch``."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import monarch
import monarch_core
import monarch_core.actor
from monarch_compat import _alias, _shadow
from monarch_core.actor import Actor, context, endpoint, this_host

HERE = Path(__file__).resolve().parent


# --- modules that are monarch-core's own ---------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("name, real", sorted(_alias.ALIASES.items()))
def test_aliased_module_is_the_core_module(name: str, real: str) -> None:
    if importlib.util.find_spec(real) is None:
        pytest.skip(f"{real} is not part of this checkout yet")
    assert importlib.import_module(name) is importlib.import_module(real)
    assert sys.modules[name] is sys.modules[real]
    assert sys.modules[real].__spec__.name == real  # the core module's own spec is left alone


@pytest.mark.unit
def test_reference_actor_names_are_the_core_objects() -> None:
    from monarch.actor import Actor as A, ProcMesh, endpoint as e, this_host as th, unhandled_fault_hook  # noqa: F401

    assert A is monarch_core.actor.Actor and e is monarch_core.actor.endpoint and th is this_host
    assert ProcMesh is monarch_core.actor.ProcMesh
    import monarch.actor

    assert monarch.actor.unhandled_fault_hook is monarch_core.actor.unhandled_fault_hook


@pytest.mark.unit
def test_job_submodules_are_the_core_ones() -> None:
    if importlib.util.find_spec("monarch_core.job") is None:
        pytest.skip("monarch_core.job is not part of this checkout yet")
    import monarch.job
    import monarch_core.job

    assert monarch.job is monarch_core.job
    for name in ("ProcessJob", "LocalJob", "SlurmJob", "SSHJob", "JobTrait", "TelemetryConfig"):
        assert getattr(monarch.job, name) is getattr(monarch_core.job, name)
    from monarch._src.job.job import JobState, JobTrait
    from monarch._src.job.process import ProcessJob

    assert (JobState, JobTrait, ProcessJob) == (monarch_core.job.JobState, monarch_core.job.JobTrait,
                                                monarch_core.job.ProcessJob)
    if importlib.util.find_spec("monarch_core.job.spmd") is not None:
        from monarch.job.spmd import serve

        assert serve is importlib.import_module("monarch_core.job.spmd").serve
        assert sys.modules["monarch.job.spmd"] is sys.modules["monarch_core.job.spmd"]


@pytest.mark.unit
@pytest.mark.parametrize("name", ["monarch.job.meta", "monarch.gather_mount", "monarch._rust_bindings.x",
                                  "monarch.simulator.interface"])
def test_refused_module_says_why(name: str) -> None:
    with pytest.raises(ModuleNotFoundError, match="monarch-compat does not provide") as info:
        importlib.import_module(name)
    assert name.startswith(info.value.name)  # the refused package, or the name itself


@pytest.mark.unit
def test_an_unknown_module_is_not_found() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("monarch.no_such_module")


# --- modules of the compatibility layer --------------------------------------------------------

@pytest.mark.unit
def test_config_names() -> None:
    from monarch.config import ChannelTransport, configure, configured

    assert ChannelTransport is monarch_core.ChannelTransport
    assert configure is monarch_core.config.configure and configured is monarch_core.config.configured
    assert monarch.configure is monarch_core.config.configure
    with configured(delivery_timeout=7):
        assert os.environ["MONARCH_DELIVERY_TIMEOUT"] == "7"


@pytest.mark.unit
def test_top_level_names() -> None:
    assert monarch.Future is monarch_core.actor.Future and monarch.Extent is monarch_core.actor.Extent
    assert monarch.__version__ == monarch_core.__version__
    with pytest.raises(AttributeError, match="docs/compat.md"):
        monarch.no_such_name  # noqa: B018


@pytest.mark.unit
def test_private_actor_mesh_names() -> None:
    from monarch._src.actor.actor_mesh import ActorMesh, Channel, Port, PortReceiver

    assert (Channel, Port, PortReceiver) == (monarch_core.actor.Channel, monarch_core.actor.Port,
                                             monarch_core.actor.PortReceiver)
    assert ActorMesh is monarch_core.actor.ActorMesh
    from monarch._src.actor.bootstrap import attach_to_workers, run_worker_loop_forever

    assert attach_to_workers is monarch_core.actor.attach_to_workers
    assert run_worker_loop_forever is monarch_core.actor.run_worker_loop_forever
    from monarch._src.actor.mock import patch_actor, patch_tensor_engine
    from monarch_core import testing

    assert (patch_actor, patch_tensor_engine) == (testing.patch_actor, testing.patch_tensor_engine)


@pytest.mark.unit
def test_execution_timer_cpu() -> None:
    from monarch.timer import ExecutionTimer, execution_timer_start, execution_timer_stop

    ExecutionTimer.reset()
    for _ in range(3):
        with ExecutionTimer.time("work", use_cpu=True):
            sum(range(10_000))
    execution_timer_start("other", use_cpu=True)
    execution_timer_stop("other", use_cpu=True)
    summary = ExecutionTimer.summary()
    assert summary["work"]["count"] == 3 and summary["other"]["count"] == 1
    assert 0 < summary["work"]["min_ms"] <= summary["work"]["mean_ms"] <= summary["work"]["max_ms"]
    assert ExecutionTimer.get_latest_measurement("work") > 0
    with pytest.raises(RuntimeError, match="was not started"):
        ExecutionTimer.stop("never", use_cpu=True)
    ExecutionTimer.reset()
    assert ExecutionTimer.summary() == {}


@pytest.mark.unit
def test_execution_timer_modules_and_float64_readings() -> None:
    """``monarch.timer.execution_timer`` (the reference's module of the timer's
    functions) and ``remote_execution_timer`` (the name its example_monarch.py
    imports) name monarch.timer's objects; readings are float64 scalars, as
    the reference's (its example propagates them as float64)."""
    torch = pytest.importorskip("torch")
    import monarch.timer as timer
    from monarch.timer import execution_timer, remote_execution_timer

    for name in execution_timer.__all__:
        assert getattr(execution_timer, name) is getattr(timer, name)
        assert getattr(remote_execution_timer, name) is getattr(timer, name)
    timer.ExecutionTimer.reset()
    execution_timer.execution_timer_start(use_cpu=True)
    execution_timer.execution_timer_stop(use_cpu=True)
    t0 = execution_timer.get_time_perfcounter()
    avg = execution_timer.get_execution_timer_average_ms()
    assert t0.dtype == avg.dtype == torch.float64 and t0.dim() == avg.dim() == 0
    assert avg.item() > 0 and execution_timer.get_execution_timer_summary()["default"]["count"] == 1
    assert execution_timer.get_latest_timer_measurement().dtype == torch.float64
    assert execution_timer.get_time_perfcounter().item() >= t0.item()
    timer.ExecutionTimer.reset()


@pytest.mark.unit
def test_fetch_module_and_spawn_tensor_engine() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("monarch_tensor_engine")
    from monarch.fetch import fetch_shard, inspect
    from monarch.mesh_controller import spawn_tensor_engine

    assert fetch_shard is monarch_core.fetch_shard and inspect is monarch_core.inspect
    assert callable(spawn_tensor_engine)  # on real procs: test_reference_programs.py


@pytest.mark.unit
def test_tracing_forwarder_on_the_client() -> None:
    from monarch._src.actor.telemetry import TracingForwarder, traced

    assert traced is monarch_core.telemetry.traced
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep()
    target = logging.getLogger("monarch.tracing")
    target.addHandler(keep)
    log = logging.getLogger("compat_test_forwarder")
    log.addHandler(TracingForwarder())
    log.setLevel(logging.INFO)
    try:
        log.info("hello %s", "there")
    finally:
        target.removeHandler(keep)
    assert [r.getMessage() for r in seen] == ["hello there"]
    assert not hasattr(seen[0], "actor_id")  # not in an actor


# --- in actors, on real procs ------------------------------------------------------------------

class Real(Actor):
    def __init__(self, x: int) -> None:
        self.x = x

    @endpoint
    def who(self) -> tuple:
        return ("real", self.x)


class Fake(Actor):
    def __init__(self, x: int) -> None:
        self.x = x

    @endpoint
    def who(self) -> tuple:
        return ("fake", self.x)


class Inspector(Actor):
    @endpoint
    def attributes(self) -> tuple:
        inst = context().actor_instance
        return (inst.proc_mesh.proc_ids == inst.proc.proc_ids, inst.proc_mesh._labels)

    @endpoint
    def forwarded(self) -> list:
        from monarch._src.actor.telemetry import TracingForwarder

        seen: list = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                seen.append((record.getMessage(), getattr(record, "actor_id", None)))

        logging.getLogger("monarch.tracing").addHandler(Keep())
        log = logging.getLogger("compat_in_actor")
        log.addHandler(TracingForwarder())
        log.setLevel(logging.INFO)
        log.info("from the actor")
        return seen + [str(context().actor_instance.actor_id)]


@pytest.fixture(scope="module")
def procs():
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=60)


def test_mesh_labels(procs) -> None:
    assert procs._labels == ("gpus",)
    assert procs.slice(gpus=0)._labels == procs.slice(gpus=0).extent.labels


def test_proc_mesh_and_labels_in_actors(procs) -> None:
    # the actor's module never imports `monarch`: the plugin adds the names in every proc
    got = procs.spawn("inspector", Inspector).attributes.call().get(timeout=60)
    assert list(got.values()) == [(True, ()), (True, ())]
    assert context().actor_instance.proc_mesh.proc_ids == context().actor_instance.proc.proc_ids


def test_tracing_forwarder_tags_the_actor(procs) -> None:
    (message, actor_id), own = procs.slice(gpus=1).spawn("fwd", Inspector).forwarded.call_one().get(timeout=60)
    assert message == "from the actor" and actor_id == own


def test_patch_actor(procs) -> None:
    from monarch._src.actor.mock import patch_actor

    with patch_actor(Real, Fake) as mock:
        assert mock is Fake
        with patch_actor(Real, Real):  # nested: the inner one wins, leaving it restores the outer
            inner = procs.spawn("inner", Real, 0)
        patched = procs.spawn("patched", Real, 1)
    plain = procs.spawn("plain", Real, 2)

    @patch_actor(Real, Fake)
    def spawn_in_function() -> object:
        return procs.spawn("decorated", Real, 3)

    decorated = spawn_in_function()
    assert set(inner.who.call().get(timeout=60).values()) == {("real", 0)}
    assert set(patched.who.call().get(timeout=60).values()) == {("fake", 1)}
    assert set(plain.who.call().get(timeout=60).values()) == {("real", 2)}
    assert set(decorated.who.call().get(timeout=60).values()) == {("fake", 3)}
    with pytest.raises(TypeError, match="an Actor subclass is needed"):
        patch_actor(Real, object)


def test_patch_actor_async_forms(procs) -> None:
    import asyncio

    from monarch_core.testing import patch_actor

    @patch_actor(Real, Fake)
    async def spawn_async() -> object:
        return procs.spawn("async_decorated", Real, 4)

    async def spawn_async_with() -> object:
        async with patch_actor(Real, Fake):
            return procs.spawn("async_with", Real, 5)

    a = asyncio.run(spawn_async())
    b = asyncio.run(spawn_async_with())
    assert set(a.who.call().get(timeout=60).values()) == {("fake", 4)}
    assert set(b.who.call().get(timeout=60).values()) == {("fake", 5)}


class Engine(Actor):
    """Activates the proc mesh it runs on, in ``__init__`` and in an endpoint."""

    def __init__(self) -> None:
        proc = context().actor_instance.proc_mesh
        with proc.activate():
            self.init_mesh = monarch.get_active_mesh().proc_ids

    @endpoint
    def meshes(self) -> tuple:
        proc = context().actor_instance.proc_mesh
        with proc.activate():
            now = monarch.get_active_mesh().proc_ids
        return (self.init_mesh, now, proc.proc_ids)


def test_patch_tensor_engine(procs) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("monarch_tensor_engine")
    from monarch._src.actor.mock import patch_tensor_engine

    one = procs.slice(gpus=0)
    with patch_tensor_engine(Engine):
        patched = one.spawn("engine_patched", Engine)
    init_mesh, now, own = patched.meshes.call_one().get(timeout=120)
    assert init_mesh == now  # one mesh per actor, made once (in __init__)
    assert now != own and len(now) == 1  # the default factory: procs of the actor's own
    plain = one.spawn("engine_plain", Engine)
    init_mesh, now, own = plain.meshes.call_one().get(timeout=120)
    assert init_mesh == now == own


# --- the shadowing check -----------------------------------------------------------------------

def _fake_dist(root: Path, name: str, version: str, *, top_level: bool) -> None:
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if top_level:
        (info / "top_level.txt").write_text("monarch\n")
    else:
        (info / "RECORD").write_text("monarch/__init__.py,,\nmonarch/actor/__init__.py,,\n")


@pytest.mark.unit
def test_others_providing_finds_top_level_and_record(tmp_path: Path) -> None:
    from importlib import metadata

    _fake_dist(tmp_path / "a", "torchmonarch", "0.7.0", top_level=True)
    _fake_dist(tmp_path / "b", "some_fork", "1.0", top_level=False)
    _fake_dist(tmp_path / "c", "monarch_compat", "0.1.0", top_level=True)  # this distribution: not another
    dists = list(metadata.distributions(path=[str(tmp_path / d) for d in "abc"]))
    assert _shadow.others_providing(dists) == ["some_fork 1.0", "torchmonarch 0.7.0"]


def test_import_refuses_beside_torchmonarch(tmp_path: Path) -> None:
    _fake_dist(tmp_path, "torchmonarch", "0.7.0", top_level=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    code = "import monarch"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "ShadowError" in r.stderr and "torchmonarch 0.7.0" in r.stderr and "monarch-compat" in r.stderr
    assert "pip uninstall monarch-compat" in r.stderr and "pip uninstall torchmonarch" in r.stderr
    ok = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.unit
def test_attribute_aliases_never_hide_a_core_attribute(monkeypatch) -> None:
    from monarch_compat import _attributes
    from monarch_core._mesh._shape import MeshTrait

    monkeypatch.setattr(MeshTrait, "_labels", "core's own", raising=False)
    with pytest.raises(RuntimeError, match="now defined by monarch-core"):
        _attributes.install()


def test_simulator_runs_for_real_on_local_procs_and_display_writes_the_trace(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``monarch.Simulator(hosts, gpus)``: local CPU procs of dimensions host
    and gpu, the run recorded as a Chrome trace that ``display()`` writes and
    names; what needs the reference's model of GPUs is refused."""
    import json

    import monarch
    from monarch.actor import Actor, endpoint
    from monarch_core import telemetry

    # display() prints this process's top endpoints by time: in a test process that ran others first,
    # theirs would crowd out this run's (the table is the process's, as the reference's is)
    telemetry.reset_metrics()

    class Echo(Actor):
        @endpoint
        def echo(self, x: int) -> int:
            return x

    for bad, match in (({"simulate_mode": "command_history"}, "command history"), ({"build_ir": True}, "IR"),
                       ({"upload_trace": True}, "Meta-internal"), ({"trace_mode": "nonsense"}, "stream_only")):
        with pytest.raises(ValueError, match=match):
            monarch.Simulator(1, 2, **bad)
    path = tmp_path / "sim.json"
    sim = monarch.Simulator(hosts=1, gpus=2, trace_mode="stream_only", trace_path=str(path))
    try:
        assert dict(sim.mesh.rename(gpu="dp").extent.items()) == {"host": 1, "dp": 2}
        actors = sim.mesh.spawn("echo", Echo)
        assert list(actors.echo.call(3).get(timeout=60).values()) == [3, 3]
        sim.display()
        out = capsys.readouterr().out
        assert str(path) in out and "ran for real" in out and "echo.echo" in out
        events = json.loads(path.read_text())
        assert any("echo" in str(e.get("name", "")) for e in events)  # the call's spans
        with pytest.raises(RuntimeError, match="Meta-internal"):
            sim.upload()
    finally:
        sim.mesh.stop().get(timeout=60)
