"""What a PyTorch user reaches for first, inside ``with mesh.activate():``, on
real procs (CPU, gloo; nothing of torch is mocked): seeding and the
generators' states reach the procs (``torch.manual_seed``,
``monarch_core.random``), the default dtype follows the client's (autocast
and a default device are refused, not silently wrong), stock optimizers
(``Adam``, ``AdamW``, ``Adagrad``, ...) give what local torch gives per rank,
and ``mesh.process_group(dims)`` serves ``torch.distributed`` inside remote
functions.  The oracle is the same computation done locally per rank."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import monarch_core as monarch  # noqa: E402
from monarch_core.actor import this_host  # noqa: E402

COORDS = [(dp, tp) for dp in range(2) for tp in range(2)]


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
    yield pm
    pm.stop().get(timeout=60)


def every(t) -> dict:  # type: ignore[no-untyped-def]
    """Each proc's value of ``t``."""
    return {c: monarch.inspect(t, dp=c[0], tp=c[1]) for c in COORDS}


# ---------------------------------------------------------------- random number generators

def test_manual_seed_inside_a_mesh_seeds_every_proc_with_the_same_stream(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        torch.manual_seed(1234)
        first = torch.rand(3)
        torch.manual_seed(1234)
        again = torch.randn(2, 2)
        got_first, got_again = every(first), every(again)
    torch.manual_seed(1234)
    expected_first = torch.rand(3)
    torch.manual_seed(1234)
    expected_again = torch.randn(2, 2)
    for c in COORDS:
        assert torch.equal(got_first[c], expected_first), c
        assert torch.equal(got_again[c], expected_again), c


def test_manual_seed_of_a_distributed_tensor_gives_each_proc_its_own_stream(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        torch.manual_seed(1000 + mesh.rank_tensor("dp"))  # per dp rank; the same along tp
        x = torch.rand(4)
        got = every(x)
        with pytest.raises(TypeError, match="integer scalar"):
            torch.manual_seed(torch.ones(2))
    for dp, tp in COORDS:
        torch.manual_seed(1000 + dp)
        assert torch.equal(got[(dp, tp)], torch.rand(4)), (dp, tp)
    assert not torch.equal(got[(0, 0)], got[(1, 0)])


def test_random_states_are_the_procs_and_come_back(mesh) -> None:  # type: ignore[no-untyped-def]
    import monarch_core.random as mrandom

    with mesh.activate():
        mrandom.make_deterministic()
        torch.manual_seed(7)
        state = mrandom.get_state()
        assert state.cpu.dtype == torch.uint8 and state.cuda is None  # CPU procs
        first = torch.rand(2)
        mrandom.set_state(state)
        second = torch.rand(2)
        seed = 4 + mesh.rank_tensor("dp") * 2 + mesh.rank_tensor("tp")
        s2, s3 = mrandom.new_state(seed), mrandom.new_state(seed)
        mrandom.set_state(s2)
        r2 = torch.rand(2)
        mrandom.set_state(s3)
        r3 = torch.rand(2)
        cpu = torch.get_rng_state()  # the procs' CPU generators, as a distributed tensor
        assert isinstance(cpu, monarch.Tensor)
        with torch.random.fork_rng():  # get_rng_state/set_rng_state reach the procs
            torch.rand(100)
        after_fork = torch.rand(2)
        torch.set_rng_state(cpu)
        replay = torch.rand(2)
        got = {name: every(t) for name, t in
               (("first", first), ("second", second), ("r2", r2), ("r3", r3), ("after", after_fork),
                ("replay", replay))}
    assert monarch.random.get_state is mrandom.get_state
    for dp, tp in COORDS:
        c = (dp, tp)
        assert torch.equal(got["first"][c], got["second"][c])
        assert torch.equal(got["r2"][c], got["r3"][c])
        assert torch.equal(got["after"][c], got["replay"][c])
        torch.manual_seed(4 + dp * 2 + tp)
        assert torch.equal(got["r2"][c], torch.rand(2))  # new_state(seed) is the stream of that seed
    assert not torch.equal(got["r2"][(0, 0)], got["r2"][(0, 1)])


# ---------------------------------------------------------------- global state that changes metadata

def test_the_default_dtype_reaches_the_procs_before_their_next_operation(mesh) -> None:  # type: ignore[no-untyped-def]
    try:
        with mesh.activate():
            before = torch.ones(2)                       # float32, and the factory's metadata is cached
            torch.set_default_dtype(torch.float64)
            after = torch.ones(2) + torch.arange(2)      # the cache does not answer float32 any more
            assert (before.dtype, after.dtype) == (torch.float32, torch.float64)
            got_before, got_after = monarch.inspect(before, dp=1, tp=1), monarch.inspect(after, dp=1, tp=1)
        torch.set_default_dtype(torch.float32)           # changed outside the block: reaches the procs too
        with mesh.activate():
            back = torch.zeros(3)
            assert back.dtype == torch.float32
            got_back = monarch.inspect(back, dp=0, tp=1)
    finally:
        torch.set_default_dtype(torch.float32)
    assert got_before.dtype == torch.float32
    assert got_after.dtype == torch.float64 and torch.equal(got_after, torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert got_back.dtype == torch.float32


def test_autocast_and_a_default_device_are_refused_with_the_working_form(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        x = torch.ones(2, 2)
        with pytest.raises(RuntimeError, match=r"autocast.*not forwarded.*remote function"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                x @ x
        with pytest.raises(RuntimeError, match=r"set_default_device.*not forwarded.*device="):
            torch.set_default_device("meta")
        assert (x @ x).dtype == torch.float32            # nothing was left behind
    torch.set_default_device("meta")
    try:
        with pytest.raises(RuntimeError, match=r"default device is meta.*set_default_device\(None\)"):
            mesh.activate()
    finally:
        torch.set_default_device(None)


# ---------------------------------------------------------------- optimizers

def _train_locally(make_opt, dp: int, tp: int, steps: int):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    opt = make_opt([w])
    x = torch.arange(12.0).reshape(3, 4) / 10 + dp * 2 + tp
    for _ in range(steps):
        loss = (x @ w).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return w.detach()


OPTIMIZERS = {
    "Adam": lambda p: torch.optim.Adam(p, lr=0.05),
    "AdamW": lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1),
    "Adam(amsgrad)": lambda p: torch.optim.Adam(p, lr=0.05, amsgrad=True),
    "Adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01),
    "Adamax": lambda p: torch.optim.Adamax(p, lr=0.05),
    "NAdam": lambda p: torch.optim.NAdam(p, lr=0.05),
    "RAdam": lambda p: torch.optim.RAdam(p, lr=0.05),
    "ASGD": lambda p: torch.optim.ASGD(p, lr=0.05),
    "Adam(foreach)": lambda p: torch.optim.Adam(p, lr=0.05, foreach=True),
    "Adagrad(fused)": lambda p: torch.optim.Adagrad(p, lr=0.1, fused=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_stock_optimizers_step_on_the_mesh_as_local_torch_does_per_rank(mesh, name: str) -> None:  # type: ignore[no-untyped-def]
    make_opt, steps = OPTIMIZERS[name], 3
    with mesh.activate():
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(4, 3))
        opt = make_opt([w])
        r = mesh.rank_tensor("dp") * 2 + mesh.rank_tensor("tp")
        x = torch.arange(12.0).reshape(3, 4) / 10 + r
        for _ in range(steps):
            loss = (x @ w).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        step = opt.state[w]["step"]
        if "fused" not in name:  # a fused kernel takes the step tensor and may write it: no longer known
            assert step.item() == steps  # the step count is known in the client
        assert monarch.inspect(step, dp=1, tp=1).item() == steps
        got = every(w)
    for dp, tp in COORDS:
        torch.testing.assert_close(got[(dp, tp)], _train_locally(make_opt, dp, tp, steps), rtol=1e-5, atol=1e-6)


def test_values_the_client_computes_are_read_and_others_still_refused(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        count = torch.tensor(0.0)
        count += 1
        count.mul_(3)
        half = (count / 2).item()
        assert (count.item(), half, int(torch.zeros(()) + 5), torch.ones(1).tolist()) == (3.0, 1.5, 5, [1.0])
        with pytest.raises(RuntimeError, match="reads a value"):
            torch.ones(3).tolist()                       # only scalars are known (MAX_NUMEL)
        drawn = torch.rand(())                           # random: the procs' own values
        with pytest.raises(RuntimeError, match="reads a value"):
            drawn.item()
        summed = torch.tensor(1.0)
        summed.reduce_("dp")                             # a collective writes it on the procs
        with pytest.raises(RuntimeError, match="reads a value"):
            summed.item()
        aliased = torch.tensor(2.0)
        alias = aliased.detach()                         # shares its storage, and so do the client's copies
        alias.add_(1)
        assert aliased.item() == 3.0
        alias.reduce_("dp")                              # writes both on the procs: both are forgotten
        with pytest.raises(RuntimeError, match="reads a value"):
            aliased.item()
        viewed = torch.tensor(5.0)
        view = viewed.view(1)                            # a view: writes through it are not followed
        view.add_(1)
        with pytest.raises(RuntimeError, match="reads a value"):
            viewed.item()
        assert [monarch.inspect(t).item() for t in (summed, aliased, viewed)] == [2.0, 6.0, 6.0]
        assert monarch.inspect(count, dp=1, tp=1).item() == 3.0


# ---------------------------------------------------------------- process groups

def test_process_group_serves_torch_distributed_inside_remote_functions(mesh) -> None:  # type: ignore[no-untyped-def]
    @monarch.remote
    def collectives(t, tp_group, all_group):  # type: ignore[no-untyped-def]
        summed = t.clone()
        dist.all_reduce(summed, group=tp_group)
        gathered = [torch.empty_like(t) for _ in range(all_group.size())]
        dist.all_gather(gathered, t, group=all_group)
        first = t.clone()
        dist.broadcast(first, group=all_group, group_src=0)
        dist.barrier(group=tp_group)
        ranks = torch.tensor([tp_group.rank(), tp_group.size(), all_group.rank(), all_group.size()])
        return summed, torch.stack(gathered), first, ranks

    tp_group = mesh.process_group("tp")
    all_group = mesh.process_group(("tp", "dp"))  # ranked in the mesh's order of dimensions
    assert (tp_group.size(), all_group.size(), all_group.dims) == (2, 4, ("dp", "tp"))
    with mesh.activate():
        t = (mesh.rank_tensor("dp") * 10 + mesh.rank_tensor("tp")).float().reshape(1)
        summed, gathered, first, ranks = collectives(t, tp_group, all_group)
        assert (summed.shape, gathered.shape, ranks.shape) == ((1,), (4, 1), (4,))  # found on fakes
        got = {name: every(x) for name, x in
               (("summed", summed), ("gathered", gathered), ("first", first), ("ranks", ranks))}
    for dp, tp in COORDS:
        c = (dp, tp)
        assert got["summed"][c].tolist() == [dp * 20 + 1]
        assert got["gathered"][c].flatten().tolist() == [0.0, 1.0, 10.0, 11.0]
        assert got["first"][c].tolist() == [0.0]
        assert got["ranks"][c].tolist() == [tp, 2, dp * 2 + tp, 4]


def test_process_group_errors_name_the_fix(mesh) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=r"unknown dimension\(s\) \['pp'\]"):
        mesh.process_group("pp")
    with pytest.raises(ValueError, match="'gloo', 'nccl' or None"):
        mesh.process_group("dp", backend="mpi")
    pg = mesh.process_group("dp")
    with pytest.raises(RuntimeError, match=r"pass it to a remote function"):
        dist.all_reduce(torch.ones(2), group=pg)
    assert isinstance(pg, monarch.RemoteProcessGroup)


# ---------------------------------------------------------------- the doc's examples

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "tensors.md"


def test_the_docs_section_on_torch_features_runs() -> None:
    text = DOC.read_text()
    section = re.search(r"## PyTorch's global state, optimizers and process groups\n(.*?)\n## ", text, re.S).group(1)
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert blocks
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_")}
    out = subprocess.run([sys.executable, "-c", "\n".join(blocks)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "same stream on every proc: True" in out.stdout
    assert "Adam on the mesh matches local torch: True" in out.stdout
    assert "all_reduce over tp: [1.0, 1.0, 5.0, 5.0]" in out.stdout
