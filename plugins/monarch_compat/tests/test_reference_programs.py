"""What the reference's own example programs need of monarch-compat and the
tensor engine, each with a small program of our own (real procs, no mocks):
``spawn_tensor_engine(mesh)`` and ``DeviceMesh.exit()`` (its
``rapid_spawn_exit_stress.py``), the CPU substitution of its CUDA examples
(``MONARCH_COMPAT_CPU``), and the runner of those programs
(``run_reference_examples.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("monarch_tensor_engine")

import monarch  # noqa: E402,F401
import monarch_core  # noqa: E402
from monarch_core.actor import this_host  # noqa: E402

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def procs():  # type: ignore[no-untyped-def]
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=60)


def test_spawn_tensor_engine_then_exit_stops_the_workers_and_keeps_the_procs(procs) -> None:  # type: ignore[no-untyped-def]
    from monarch.mesh_controller import spawn_tensor_engine
    from monarch_tensor_engine._client import _controller

    dm = spawn_tensor_engine(procs)
    assert dm is procs
    ctl = _controller._controllers[tuple(procs.proc_ids)]  # spawned now, not at the first activate()
    workers = ctl.workers
    with dm.activate():
        t = torch.ones(2) * 2
    assert monarch_core.inspect(t, gpus=1).tolist() == [2.0, 2.0]
    dm.exit()
    assert tuple(procs.proc_ids) not in _controller._controllers
    with pytest.raises(Exception, match="stopped|gone"):
        workers.slice(gpus=0).run.call_one(b"").get(timeout=30)  # the workers' actors are stopped ...
    with pytest.raises(RuntimeError, match="stopped|gone"):
        monarch_core.inspect(t, gpus=0)  # ... and so are the tensors that lived there
    dm.exit()  # again: nothing to stop
    for i in range(3):  # the procs keep running: a new engine each time (the reference's stress loop)
        dm = spawn_tensor_engine(procs)
        with dm.activate():
            u = torch.ones(2) * i
        assert monarch_core.inspect(u, gpus=0).tolist() == [float(i)] * 2
        dm.exit()


CUDA_PROGRAM = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import monarch
    from monarch.actor import Actor, endpoint, this_host

    class Trainer(Actor):
        @endpoint
        def step(self, rank: int, port: int) -> str:
            dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
            torch.cuda.set_device(rank)
            model = nn.Linear(4, 1).cuda()
            x = torch.randn(3, 4, device="cuda").to("cuda")
            y = model(x).sum()
            dist.all_reduce(y.detach())
            out = f"{model.weight.device} {x.device} {dist.get_backend()}"
            dist.destroy_process_group()
            return out

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    trainers = procs.spawn("t", Trainer)
    print(trainers.slice(gpus=0).step.call_one(0, port), trainers.slice(gpus=1).step.call_one(1, port).get(timeout=120))
    torch.set_default_device("cuda")
    print("default", torch.get_default_device(), torch.cuda.is_available())
    with procs.activate():
        torch.set_default_device("cuda")  # inside a mesh: the CPU is the default already
        t = torch.rand(3, 4, device="cuda")
    print("engine", monarch.inspect(t, gpus=1).device)
    try:
        torch.rand(1, 1 << 30, device="cuda")
    except torch.OutOfMemoryError as e:
        print("OOM", "MONARCH_COMPAT_CPU_TENSOR_MB" in str(e))
    with procs.activate():
        big = torch.rand(1, 1 << 30, device="cuda")  # over the limit: the procs fail to make it
        ok = torch.ones(2, device="cuda")
    try:
        monarch.inspect(big, gpus=0)
    except Exception as e:
        print("procs refused", type(e).__name__)
    print("after", monarch.inspect(ok, gpus=0).tolist())
    procs.stop().get(timeout=60)
""")


def test_cpu_substitution_maps_cuda_and_nccl_in_the_client_and_the_procs() -> None:
    r = subprocess.run([sys.executable, "-c", CUDA_PROGRAM], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MONARCH_COMPAT_CPU": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cpu cpu gloo" in r.stdout
    assert "default cpu False" in r.stdout  # is_available() still tells the truth
    assert "engine cpu" in r.stdout
    assert "OOM True" in r.stdout
    assert "procs refused" in r.stdout and "after [1.0, 1.0]" in r.stdout


def test_without_the_variable_nothing_is_substituted() -> None:
    r = subprocess.run([sys.executable, "-c", "import monarch, torch; torch.zeros(1).cuda()"],
                       capture_output=True, text=True, timeout=300,
                       env={k: v for k, v in os.environ.items() if k != "MONARCH_COMPAT_CPU"})
    assert r.returncode != 0 and ("CUDA" in r.stderr or "cuda" in r.stderr)


def test_the_cpu_runner_reaches_processes_that_never_import_monarch(tmp_path: Path) -> None:
    # torchrun's ranks run a plain script: the runner's sitecustomize installs the substitution there too
    child = tmp_path / "child.py"
    child.write_text("import torch\nprint('child', torch.ones(2).cuda().device)\n")
    main = tmp_path / "main.py"
    main.write_text(f"import subprocess, sys\nsubprocess.run([sys.executable, {str(child)!r}], check=True)\n"
                    "import sys; print('argv', sys.argv[1:])\n")
    r = subprocess.run([sys.executable, "-m", "monarch_compat.cpu", str(main), "a", "b"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path,
                       env={k: v for k, v in os.environ.items() if k != "MONARCH_COMPAT_CPU"})
    assert r.returncode == 0, r.stderr
    assert "child cpu" in r.stdout and "argv ['a', 'b']" in r.stdout


class Shard(monarch_core.actor.Actor):
    """Answers with what it received: a distributed tensor arrives as its own proc's tensor."""

    def __init__(self) -> None:
        self.w = torch.eye(3) * 2

    @monarch_core.actor.endpoint
    def describe(self, x=None) -> tuple:  # type: ignore[no-untyped-def]
        return (type(x).__name__, x.tolist(), monarch_core.actor.current_rank().rank)

    @monarch_core.actor.endpoint(propagate=lambda x: x)
    def forward(self, x):  # type: ignore[no-untyped-def]
        return x @ self.w


def test_distributed_tensors_outside_activate_run_on_their_mesh_and_reach_actors(procs) -> None:  # type: ignore[no-untyped-def]
    # the reference's getting_started: `dtrainers.step.call(dist_compute[0])` and `linear.forward.rref(t)`,
    # both outside `with mesh.activate():`
    with procs.activate():
        t = torch.ones(3, 3) * (1 + procs.rank_tensor("gpus"))
    d = t @ t.T  # outside the block: on t's mesh
    assert monarch_core.inspect(d, gpus=1).tolist() == [[12.0] * 3] * 3
    actors = procs.spawn("shards", Shard)
    got = actors.describe.call(d[0]).get(timeout=60)  # each actor gets its own proc's row
    assert sorted(got.values(), key=lambda v: v[2]) == [("Tensor", [3.0] * 3, 0), ("Tensor", [12.0] * 3, 1)]
    o = torch.relu(actors.forward.rref(t))  # rref outside the block: the mesh of its tensor argument
    assert monarch_core.inspect(o, gpus=0).tolist() == [[2.0] * 3] * 3
    with pytest.raises(RuntimeError, match="inspect"):
        d.sum().item()  # reading a value in the client is still an error that says what to do
    other = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        strangers = other.spawn("strangers", Shard)
        with pytest.raises(Exception, match="not one of that mesh's procs"):
            strangers.describe.call_one(d[0]).get(timeout=60)
    finally:
        other.stop().get(timeout=60)


def test_the_runner_judges_what_an_interrupted_program_prints_on_the_way_out(tmp_path: Path) -> None:
    # inbound_ordering_workload.py sleeps until Ctrl+C, then prints "Shutting down..." and kills its job:
    # an interrupt program (it never exits by itself), and what it prints after Ctrl+C is judged too
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_reference_examples", HERE / "run_reference_examples.py")
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner  # (its dataclasses look their module up there)
    try:
        spec.loader.exec_module(runner)
    finally:
        del sys.modules[spec.name]
    program = textwrap.dedent("""
        import asyncio, sys
        async def main():
            try:
                print("ready", flush=True)
                await asyncio.sleep(float("inf"))
            finally:
                if sys.argv[0].endswith("polite.py"):
                    print("Shutting down...", flush=True)
        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            pass
    """)
    for name in ("polite.py", "silent.py"):
        (tmp_path / name).write_text(program)
    results = {}
    for name in ("polite.py", "silent.py"):
        ex = runner.Example(name, "interrupt", timeout_s=60, run_s=1, grace_s=30, expect=("ready",),
                            after=("Shutting down",))
        results[name] = runner.run_one(ex, str(tmp_path), str(tmp_path / f"{name}.log"))
    assert results["polite.py"][:2] == (True, "")
    assert results["silent.py"][0] is False and "Shutting down" in results["silent.py"][1]
    # a runner started in the background (`cmd &`, nohup) has SIGINT ignored: its programs still get Ctrl+C
    import signal

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ex = runner.Example("polite.py", "interrupt", timeout_s=60, run_s=1, grace_s=20, expect=("ready",),
                            after=("Shutting down",))
        assert runner.run_one(ex, str(tmp_path), str(tmp_path / "ignored.log"))[:2] == (True, "")
    finally:
        signal.signal(signal.SIGINT, previous)
    inbound = next(e for e in runner.EXAMPLES if "inbound_ordering" in e.path)
    assert inbound.mode == "interrupt" and inbound.after == ("Shutting down",)
