"""The tensor engine on real procs (CPU, gloo; nothing of torch is mocked):
element-wise work, ranks as tensors, every reduction with and without
``scatter`` over each subset of a 2-D mesh's dimensions, autograd and an
optimizer step, remote functions, contained failures, and the errors that
say what to do.  The oracle is the same computation done locally per rank."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import monarch_core as monarch  # noqa: E402
from monarch_core.actor import Actor, ActorError, current_rank, endpoint, this_host  # noqa: E402
from monarch_tensor_engine.api import TensorOpError, remote  # noqa: E402


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
    yield pm
    pm.stop().get(timeout=60)


def per_rank(dp: int, tp: int) -> "torch.Tensor":
    """Each proc's input, as the local oracle computes it."""
    r = dp * 2 + tp
    return torch.arange(8.0).reshape(4, 2) * (r + 1) + r


def distributed_input(mesh):  # type: ignore[no-untyped-def]
    r = mesh.rank_tensor("dp") * 2 + mesh.rank_tensor("tp")
    return torch.arange(8.0).reshape(4, 2) * (r + 1) + r


COORDS = [(dp, tp) for dp in range(2) for tp in range(2)]


def test_element_wise_work_on_every_rank_equals_the_local_computation(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        x = distributed_input(mesh)
        y = (x.sin() * 2 + x.pow(2)).sum(1) - torch.ones(4)
        assert y.shape == (4,) and y.dtype == torch.float32  # known locally, without a round trip
        got = {c: monarch.inspect(y, dp=c[0], tp=c[1]) for c in COORDS}
    for (dp, tp), value in got.items():
        x = per_rank(dp, tp)
        assert torch.equal(value, (x.sin() * 2 + x.pow(2)).sum(1) - torch.ones(4))


def test_repeated_operations_reuse_their_metadata_and_keep_torchs_type_rules(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        i = torch.arange(3) + mesh.rank_tensor("tp")           # int64
        first, again = i + 1, i + 1                            # the second one from the metadata cache
        as_float = i + 1.0                                     # 1.0 is not 1: float32
        flag = i + True                                        # nor is True
        assert (first.dtype, again.dtype, as_float.dtype, flag.dtype) == (torch.int64, torch.int64,
                                                                          torch.float32, torch.int64)
        chained = (again * 2).float().sum(0)                   # a cached result in an operation run on fakes
        assert chained.shape == () and chained.dtype == torch.float32
        got = [monarch.inspect(t, dp=1, tp=1).tolist() for t in (again, as_float, chained)]
    assert got == [[2, 3, 4], [2.0, 3.0, 4.0], 18.0]


def test_rank_tensors_hold_each_procs_coordinates(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        ranks = mesh.rank_tensors()
        assert set(ranks) == {"dp", "tp"}
        got = {c: (int(monarch.inspect(ranks["dp"], dp=c[0], tp=c[1])),
                   int(monarch.inspect(ranks["tp"], dp=c[0], tp=c[1]))) for c in COORDS}
    assert got == {c: c for c in COORDS}


def _expected(reduction: str, values: list) -> "torch.Tensor":
    stacked = torch.stack(values)
    return {"sum": stacked.sum(0), "avg": stacked.mean(0), "product": stacked.prod(0), "min": stacked.min(0).values,
            "max": stacked.max(0).values, "stack": stacked}[reduction]


@pytest.mark.parametrize("dims", [("tp",), ("dp",), ("dp", "tp")])
@pytest.mark.parametrize("reduction", ["sum", "avg", "product", "min", "max", "stack"])
@pytest.mark.parametrize("scatter", [False, True])
def test_every_reduction_over_every_subset_of_dimensions(mesh, dims, reduction, scatter) -> None:  # type: ignore[no-untyped-def]
    n = 4 if len(dims) == 2 else 2
    with mesh.activate():
        x = distributed_input(mesh)
        if reduction == "stack" and scatter:
            x = x[:n]  # all-to-all: a first dimension of the group's size
        out = x.reduce(dims, reduction, scatter=scatter)
        got = {c: monarch.inspect(out, dp=c[0], tp=c[1]) for c in COORDS}
    for dp, tp in COORDS:
        group = [(d, t) for d, t in COORDS if all((d, t)[i] == (dp, tp)[i] for i, name in enumerate(("dp", "tp"))
                                                  if name not in dims)]
        me = group.index((dp, tp))
        values = [per_rank(d, t) for d, t in group]
        if reduction == "stack" and scatter:
            want = torch.stack([v[:n][me] for v in values])
        else:
            want = _expected(reduction, values)
            if scatter:
                want = want.chunk(n)[me] if reduction != "stack" else want
        assert torch.allclose(got[(dp, tp)], want), (dp, tp)


def test_bitwise_reductions_and_reduce_in_place_and_out(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        r = mesh.rank_tensor("dp") * 2 + mesh.rank_tensor("tp")
        bits = torch.ones(3, dtype=torch.int64) << r
        b_or = bits.reduce(("dp", "tp"), "bor")
        b_and = (bits | 1).reduce(("dp", "tp"), "band")
        b_xor = bits.reduce(("dp", "tp"), "bxor")
        x = torch.ones(2) * (r + 1)
        x.reduce_("tp")  # in place: 1+2 on dp=0, 3+4 on dp=1
        out = torch.zeros(2)
        (torch.ones(2) * r).reduce("dp", "max", out=out)
        got = [monarch.inspect(t, dp=1, tp=1) for t in (b_or, b_and, b_xor, x, out)]
    assert got[0].tolist() == [15] * 3 and got[1].tolist() == [1] * 3 and got[2].tolist() == [15] * 3
    assert got[3].tolist() == [7.0, 7.0] and got[4].tolist() == [3.0, 3.0]


def test_reduce_to_a_sub_mesh_leaves_each_groups_result_on_the_sub_mesh_only(mesh) -> None:  # type: ignore[no-untyped-def]
    first_row = mesh.slice(dp=0)
    with mesh.activate():
        x = distributed_input(mesh)
        total = x.reduce("dp", "sum", mesh=first_row)        # a reduce (not an all-reduce) to dp=0
        gathered = x.reduce("tp", "stack", mesh=mesh.slice(tp=1))
        assert total.mesh is not mesh and total.shape == (4, 2) and gathered.shape == (2, 4, 2)
        with pytest.raises(RuntimeError, match="used inside mesh"):
            total + 1                                          # it lives on the sub-mesh now
        with pytest.raises(ValueError, match="reduce_\\(\\) keeps the tensor on its mesh"):
            x.reduce_("dp", mesh=first_row)
    with first_row.activate():
        got = [monarch.inspect(total * 1, tp=t) for t in range(2)]
        out = torch.zeros(4, 2)
    with mesh.activate():
        x.reduce("dp", "max", mesh=first_row, out=out)
    with mesh.slice(tp=1).activate():
        stacked = [monarch.inspect(gathered, dp=d) for d in range(2)]
    with first_row.activate():
        maxed = monarch.inspect(out, tp=1)
    for t in range(2):
        assert torch.equal(got[t], per_rank(0, t) + per_rank(1, t))
    for d in range(2):
        assert torch.equal(stacked[d], torch.stack([per_rank(d, 0), per_rank(d, 1)]))
    assert torch.equal(maxed, torch.maximum(per_rank(0, 1), per_rank(1, 1)))
    other = this_host().spawn_procs(per_host={"tp": 2})
    try:
        with mesh.activate(), pytest.raises(ValueError, match="is not a sub-mesh"):
            torch.ones(1).reduce("dp", mesh=other)
    finally:
        other.stop().get(timeout=60)


def test_renamed_flattened_and_split_views_of_the_procs_share_their_tensors(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        x = distributed_input(mesh)
    flat = mesh.flatten("all")
    with flat.activate():                                   # the same procs, one dimension
        assert monarch.get_active_mesh() is flat
        everything = x.reduce("all", "sum")
        ranks = flat.rank_tensor("all")
        got_flat = [monarch.inspect(x, all=i) for i in range(4)]
        got_ranks = [int(monarch.inspect(ranks, all=i)) for i in range(4)]
    renamed = mesh.rename(dp="rows", tp="cols")
    with renamed.activate():
        per_row = x.reduce("cols", "sum")
        with pytest.raises(ValueError, match=r"unknown dimension\(s\) \['tp'\]"):
            x.reduce("tp")
    split = flat.split(all=("a", "b"), b=2)                  # {a: 2, b: 2} again, from the flat view
    with split.activate():
        columns = x.reduce("a", "max")
        got_cols = monarch.inspect(columns, a=0, b=1)
    with mesh.activate():
        got_total = monarch.inspect(everything, dp=1, tp=1)
        got_row = monarch.inspect(per_row, dp=1, tp=0)
    values = {c: per_rank(*c) for c in COORDS}
    assert [torch.equal(got_flat[i], values[COORDS[i]]) for i in range(4)] == [True] * 4
    assert got_ranks == [0, 1, 2, 3]
    assert torch.equal(got_total, sum(values.values()))
    assert torch.equal(got_row, values[(1, 0)] + values[(1, 1)])
    assert torch.equal(got_cols, torch.maximum(values[(0, 1)], values[(1, 1)]))


def test_bad_reductions_are_refused_in_the_client_saying_why(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        x = torch.ones(3, 2)
        with pytest.raises(ValueError, match="unknown dimension.*'hosts'"):
            x.reduce("hosts")
        with pytest.raises(ValueError, match="unknown reduction 'median'"):
            x.reduce("tp", "median")
        with pytest.raises(ValueError, match="divisible by the group's size 2"):
            x.reduce("tp", scatter=True)
        with pytest.raises(TypeError, match="'avg' needs a floating-point tensor"):
            torch.ones(2, dtype=torch.int64).reduce("tp", "avg")
        with pytest.raises(ValueError, match="works in place"):
            x.reduce_("tp", "stack")


def test_a_linear_layer_backward_and_an_sgd_step_match_the_local_run(mesh) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    w0 = torch.randn(2, 2)
    with mesh.activate():
        lin = torch.nn.Linear(2, 2)
        with torch.no_grad():
            lin.weight.copy_(torch.zeros(2, 2) + w0.tolist()[0][0])
            lin.bias.zero_()
        opt = torch.optim.SGD(lin.parameters(), lr=0.5)
        loss = lin(distributed_input(mesh)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        w = {c: monarch.inspect(lin.weight, dp=c[0], tp=c[1]) for c in COORDS}
    for dp, tp in COORDS:
        ref = torch.nn.Linear(2, 2)
        with torch.no_grad():
            ref.weight.fill_(w0.tolist()[0][0])
            ref.bias.zero_()
        o = torch.optim.SGD(ref.parameters(), lr=0.5)
        ref(per_rank(dp, tp)).pow(2).mean().backward()
        o.step()
        assert torch.allclose(w[(dp, tp)], ref.weight.detach()), (dp, tp)


def boom_on_rank_3(x):  # type: ignore[no-untyped-def]
    """Fails on the proc whose shard starts with 3 (rank 3), works on the others."""
    if int(x.flatten()[0]) == 3:
        raise ValueError("bad shard")
    return x * 10


def test_a_failed_op_poisons_its_results_and_the_work_after_it_goes_on(mesh) -> None:  # type: ignore[no-untyped-def]
    fail = remote(boom_on_rank_3, propagate=lambda x: x * 10)
    with mesh.activate():
        r = (mesh.rank_tensor("dp") * 2 + mesh.rank_tensor("tp")).float()
        x = torch.ones(2) * r
        y = fail(x)            # raises on the proc whose x starts with 3: dp=1, tp=1
        z = y + 1              # depends on it: poisoned there too
        fine = x * 2           # unrelated: runs everywhere
        with pytest.raises(ActorError) as info:
            monarch.inspect(z, dp=1, tp=1)
        assert monarch.inspect(z, dp=0, tp=1).tolist() == [11.0, 11.0]
        assert monarch.inspect(fine, dp=1, tp=1).tolist() == [6.0, 6.0]
    err = info.value.exception
    assert isinstance(err, TensorOpError) and err.coords == {"dp": 1, "tp": 1}
    assert "boom_on_rank_3 failed on the proc at {'dp': 1, 'tp': 1}: ValueError: bad shard" in str(err)


def test_shape_errors_are_raised_at_once_in_the_client(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        a, b = torch.ones(3, 4), torch.ones(5, 2)
        with pytest.raises(RuntimeError, match="same reduction dim|cannot be multiplied"):
            a @ b
        assert monarch.inspect(a + 1).tolist() == [[2.0] * 4] * 3  # the mesh carries on


def test_values_local_tensors_and_other_meshes_are_errors_that_say_what_to_do(mesh) -> None:  # type: ignore[no-untyped-def]
    local = torch.ones(2)
    with mesh.activate():
        t = torch.ones(2)
        assert torch.ones(()).add(1).item() == 2.0  # a scalar the client computed itself (_known): no round trip
        with pytest.raises(RuntimeError, match="reads a value.*inspect"):
            t.sum().item()  # computed from a tensor of more than one element: the procs' value
        with pytest.raises(RuntimeError, match="reads a value.*inspect"):
            (t * mesh.rank_tensor("dp")).sum().item()  # the procs' own values
        with pytest.raises(RuntimeError, match="local tensor .* mixed"):
            t + local
        assert (local * 2).tolist() == [2.0, 2.0]  # local tensors only: torch as usual
        assert monarch.get_active_mesh() is mesh
        with monarch.no_mesh():
            assert monarch.get_active_mesh() is None
            assert isinstance(torch.ones(1) + 1, torch.Tensor) and not isinstance(torch.ones(1), monarch.Tensor)
        assert isinstance(torch.ones(1), monarch.Tensor)
    # outside its block an operation runs on the tensor's own mesh (the reference's rule) ...
    assert monarch.inspect(t + 1, dp=1, tp=0).tolist() == [2.0, 2.0]
    with pytest.raises(RuntimeError, match="inspect"):
        (t * 3).tolist()  # ... and reading its value there is still an error that says what to do
    assert t.shape == (2,)  # metadata stays readable
    with pytest.raises(IndexError, match="out of range"):
        monarch.fetch_shard(t, dp=5)
    with pytest.raises(ValueError, match="unknown mesh dimension"):
        monarch.fetch_shard(t, hosts=0)


def test_without_the_engine_activate_says_which_plugin_to_install() -> None:
    code = textwrap.dedent("""
        import monarch_core as monarch
        from monarch_core.actor import this_host
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        for what in (lambda: pm.activate(), lambda: monarch.inspect):
            try:
                what()
            except ImportError as e:
                print("error", e)
        pm.stop().get()
    """)
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**env, "MONARCH_DISABLED_PLUGINS": "tensor_engine"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("needs the distributed tensor engine") == 2, out.stdout
    assert "pip install . ./plugins/tensor_engine" in out.stdout


def test_without_torch_activate_says_to_install_it() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None          # this interpreter has no torch
        import monarch_core as monarch
        from monarch_core.actor import this_host
        pm = this_host().spawn_procs(per_host={"gpus": 1})
        try:
            pm.activate()
        except ImportError as e:
            print("error", e)
        pm.stop().get()
    """)
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "error ProcMesh.activate(): the distributed tensor engine needs torch (pip install torch==2.13.0)" \
        in out.stdout, out.stdout


def batch_of(rank):  # type: ignore[no-untyped-def]
    """Rank r's rows of a fixed data set (runs on the procs, through remote())."""
    g = torch.Generator().manual_seed(1234)
    x, y = torch.randn(16, 3, generator=g, dtype=torch.float64), torch.randn(16, 1, generator=g, dtype=torch.float64)
    r = int(rank)
    return x[r * 4:(r + 1) * 4].clone(), y[r * 4:(r + 1) * 4].clone()


def test_one_ddp_step_with_grad_generator_equals_single_process_sgd_on_the_whole_batch() -> None:
    pm = this_host().spawn_procs(per_host={"dp": 4})
    init_w = torch.arange(3, dtype=torch.float64).reshape(1, 3) / 8
    try:
        with pm.activate():
            load = remote(batch_of, propagate=lambda r: (torch.empty(4, 3, dtype=torch.float64),
                                                         torch.empty(4, 1, dtype=torch.float64)))
            x, y = load(pm.rank_tensor("dp"))
            model = torch.nn.Linear(3, 1, dtype=torch.float64)
            with torch.no_grad():
                model.weight.copy_(torch.arange(3, dtype=torch.float64).reshape(1, 3) / 8)
                model.bias.fill_(0.25)
            loss = torch.nn.functional.mse_loss(model(x), y)
            params = list(model.parameters())
            for p, grad in zip(reversed(params), monarch.grad_generator(loss, list(reversed(params)))):
                grad.reduce_("dp", "avg")  # DDP: each gradient averaged as it comes
                with torch.no_grad():
                    p -= 0.1 * grad
            got = [[monarch.inspect(p, dp=r) for p in params] for r in range(4)]
    finally:
        pm.stop().get(timeout=60)
    g = torch.Generator().manual_seed(1234)
    X, Y = torch.randn(16, 3, generator=g, dtype=torch.float64), torch.randn(16, 1, generator=g, dtype=torch.float64)
    ref = torch.nn.Linear(3, 1, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(init_w)
        ref.bias.fill_(0.25)
    torch.nn.functional.mse_loss(ref(X), Y).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= 0.1 * p.grad
    for r in range(4):  # every replica holds the single-process parameters
        torch.testing.assert_close(got[r][0], ref.weight.detach(), rtol=0, atol=1e-14)
        torch.testing.assert_close(got[r][1], ref.bias.detach(), rtol=0, atol=1e-14)


def test_a_pipeline_of_three_stages_on_sliced_meshes_matches_the_local_run() -> None:
    pm = this_host().spawn_procs(per_host={"stage": 3, "dp": 2})
    try:
        stages = [pm.slice(stage=i) for i in range(3)]
        with stages[0].activate():
            w = torch.arange(4.0) / 4
            x = (torch.ones(4) * (stages[0].rank_tensor("dp") + 1)) * w   # stage 0's work
            h = x.to_mesh(stages[1])
        with stages[1].activate():
            h = (h + 10).relu() * 2                                        # stage 1's
            out = h.to_mesh(stages[2])
        with stages[2].activate():
            out = out.sum(0, keepdim=True)                                 # stage 2's
            got = [monarch.inspect(out, dp=d).tolist() for d in range(2)]
        with pm.activate():
            whole = torch.ones(2) * (pm.rank_tensor("stage") * 2 + pm.rank_tensor("dp"))
            part = monarch.slice_mesh(whole, stage=2)                      # the same values, on the slice
        with stages[2].activate():
            sliced = [monarch.inspect(part, dp=d).tolist() for d in range(2)]
        with pytest.raises(ValueError, match="do not line up"):
            with pm.activate():
                torch.ones(1).to_mesh(stages[0])
    finally:
        pm.stop().get(timeout=60)
    for d in range(2):
        x = torch.ones(4) * (d + 1) * (torch.arange(4.0) / 4)
        assert got[d] == ((x + 10).relu() * 2).sum(0, keepdim=True).tolist()
    assert sliced == [[4.0, 4.0], [5.0, 5.0]]


class Scaler(Actor):
    """An actor whose endpoint takes and returns tensors (used with rref)."""

    def __init__(self) -> None:
        self.calls = 0
        self.r = current_rank().rank  # this actor's rank in its mesh

    @endpoint(propagate=lambda x: x * 2)
    def scale(self, x):  # type: ignore[no-untyped-def]
        self.calls += 1
        return x * 2 + self.r

    @endpoint
    def count(self) -> int:
        return self.calls


def test_rref_calls_actors_and_their_tensor_results_stay_on_the_procs(mesh) -> None:  # type: ignore[no-untyped-def]
    actors = mesh.spawn("scalers", Scaler)
    with mesh.activate():
        x = torch.ones(3) * (mesh.rank_tensor("dp") * 2 + mesh.rank_tensor("tp"))
        y = actors.scale.rref(x)            # a distributed tensor, shape from propagate
        assert isinstance(y, monarch.Tensor) and y.shape == (3,)
        z = y + 1                           # and it takes part in later work
        got = [monarch.inspect(z, dp=d, tp=t).tolist() for d, t in COORDS]
    assert got == [[r * 2 + r + 1.0] * 3 for r in range(4)]
    assert actors.count.call().get(timeout=60).values() == [1, 1, 1, 1]
    plain = mesh.spawn("plain_scalers", Plain)
    with mesh.activate():
        assert plain.one.rref() == 1  # no tensor among the results: the first proc's value


class Plain(Actor):
    @endpoint
    def one(self) -> int:
        return 1


def proc_pid():  # type: ignore[no-untyped-def]
    import os

    return torch.tensor(os.getpid())


def test_a_proc_that_dies_is_a_supervision_event_and_the_other_procs_go_on() -> None:
    import os
    import signal
    import time

    import monarch_core.actor as mactor
    from monarch_core.errors import SupervisionError

    seen: list = []
    saved = mactor.unhandled_fault_hook
    mactor.unhandled_fault_hook = seen.append
    pm = this_host().spawn_procs(per_host={"gpus": 3})
    try:
        with pm.activate():
            x = torch.ones(2) * pm.rank_tensor("gpus")
            pid = int(monarch.inspect(remote(proc_pid, propagate=lambda: torch.empty((), dtype=torch.int64))(), gpus=2))
            os.kill(pid, signal.SIGKILL)
            total = x.reduce("gpus")                 # at once: its group lost a member, maybe before it formed
            with pytest.raises(ActorError, match="died|will not come|Connection|closed"):
                monarch.fetch_shard(total, gpus=0).get(timeout=120)   # poisoned, not a 300 s wait
            with pytest.raises((SupervisionError, ActorError), match="SIGKILL|died|stopped"):
                monarch.fetch_shard(x, gpus=2).get(timeout=60)
            y = x + 1                                # the other procs' work goes on
            assert monarch.inspect(y, gpus=1).tolist() == [2.0, 2.0]
            with pytest.raises(ActorError, match="died"):
                monarch.fetch_shard(y.reduce("gpus"), gpus=1).get(timeout=60)   # known dead now: at once
            part = monarch.slice_mesh(y, gpus=1)     # a transfer between live procs goes on too
            with pytest.raises(RuntimeError, match=r"rank\(s\) \[2\] of mesh .* died"):
                monarch.slice_mesh(y, gpus=slice(1, 3))  # a transfer from the dead proc
        with pm.slice(gpus=1).activate():
            assert monarch.inspect(part).tolist() == [2.0, 2.0]
        deadline = time.monotonic() + 60
        while not any("SIGKILL" in str(f) for f in seen):
            assert time.monotonic() < deadline, f"no supervision event for the killed proc: {seen}"
            time.sleep(0.05)
    finally:
        pm.stop().get(timeout=60)
        mactor.unhandled_fault_hook = saved
