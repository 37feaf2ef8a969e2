"""The client's state of the tensor engine, on real procs (CPU; nothing of
torch is mocked): in-place operations that change a tensor's metadata keep
the client, its op cache and the procs in step; the op cache stays bounded
in a long job; a stopped mesh leaves nothing alive in the client; and the
errors name what to do (two slices of one mesh, an index that is a
distributed scalar, a shape mismatch, a remote function's traceback)."""

from __future__ import annotations

import gc
import logging
import time
import weakref

import pytest

torch = pytest.importorskip("torch")

import monarch_core as monarch  # noqa: E402
from monarch_core.actor import ActorError, this_host  # noqa: E402
from monarch_tensor_engine._client import _controller  # noqa: E402
from monarch_tensor_engine.api import TensorOpError, remote  # noqa: E402


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
    yield pm
    pm.stop().get(timeout=60)


def same_on_procs(t, **coords) -> bool:  # type: ignore[no-untyped-def]
    """The client's shape and strides of ``t`` are the procs'."""
    value = monarch.inspect(t, **coords)
    return (tuple(t.shape), t.stride()) == (tuple(value.shape), value.stride())


# ---------------------------------------------------------------- A: in-place metadata changes

def test_in_place_views_and_resizes_change_the_client_and_the_procs_alike(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        c = torch.ones(3, 4) * 2                # a result of the op cache (no fake until needed)
        c.unsqueeze_(0)
        assert c.shape == (1, 3, 4) and same_on_procs(c, dp=1, tp=1)
        c.squeeze_(0)
        assert c.shape == (3, 4) and same_on_procs(c)
        s = torch.ones(4, 4) * 2
        s.t_()
        assert s.stride() == (1, 4) and same_on_procs(s)
        s.transpose_(0, 1)
        assert s.stride() == (4, 1) and same_on_procs(s)
        r = torch.ones(2, 3) * 1
        r.resize_(4, 5)                          # larger than its storage was
        assert r.shape == (4, 5) and same_on_procs(r)
        a = torch.arange(12.0)
        a.as_strided_((3, 2), (4, 2), 1)
        assert a.shape == (3, 2) and a.stride() == (4, 2)  # (a fetch copies it densely)
        assert monarch.inspect(a).tolist() == [[1.0, 3.0], [5.0, 7.0], [9.0, 11.0]]
        o = torch.zeros(0)
        torch.add(torch.ones(3, 3), 1, out=o)   # out= resized to the result's shape
        assert o.shape == (3, 3) and same_on_procs(o)
        assert monarch.inspect(o).tolist() == [[2.0] * 3] * 3


def test_an_in_place_change_leaves_other_tensors_cache_entries_alone(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        c = torch.ones(3, 4) * 2
        c.unsqueeze_(0)
        d = c * 3                                # keyed by c's new metadata, (1, 3, 4)
        e = torch.ones(3, 4) * 2                 # an unrelated (3, 4) float32 * int
        f = e * 3
        assert (d.shape, e.shape, f.shape) == ((1, 3, 4), (3, 4), (3, 4))
        total = f.sum(1)
        assert total.shape == (3,) and same_on_procs(total)
        assert monarch.inspect(total, dp=0, tp=1).tolist() == [24.0] * 3


def test_after_an_in_place_transpose_the_client_refuses_a_view_the_procs_would_refuse(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        (torch.ones(4, 4) * 2) * 2               # fills the cache for a contiguous (4, 4) input
        t = torch.ones(4, 4) * 2
        t.t_()
        u = t * 2                                # keeps t's layout, as torch does on the procs
        assert u.stride() == (1, 4) and same_on_procs(u)
        with pytest.raises((RuntimeError, ValueError), match="view"):
            u.view(16)                           # torch's own error, in the client
        assert monarch.inspect(u.reshape(16)).tolist() == [4.0] * 16


# ---------------------------------------------------------------- B: bounded client state

def test_scalars_that_change_every_step_reuse_one_cache_entry(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        ctl = _controller.active()
        y = torch.ones(3, 4)
        y = y * 0.5 + 1                          # the entries of (3, 4) float32 * float, + int
        before = len(ctl.op_cache)
        for step in range(200):                  # a learning-rate schedule and a step counter
            y = y * (1.0 / (step + 1)) + step
        assert len(ctl.op_cache) == before
        i = torch.ones(3, dtype=torch.int64) * 1
        assert (i + 1).dtype == torch.int64 and (i + 1.5).dtype == torch.float32 and (i + True).dtype == torch.int64
        assert (i + 2**63).dtype == torch.int64  # past int64 the value is in the key: the fakes check it
        got = monarch.inspect(y, dp=1, tp=0)
        half = monarch.inspect(i + 1.5).tolist()
    want = torch.ones(3, 4) * 0.5 + 1
    for step in range(200):
        want = want * (1.0 / (step + 1)) + step
    assert torch.allclose(got, want) and half == [2.5] * 3


def _engine_listeners() -> int:
    """How many proc-failure listeners of the engine the client's kernel holds."""
    from monarch_core._proc import _state

    kernel = _state.current_runtime_or_none().kernel
    return sum(1 for cb in kernel.events.listeners("proc_failed")
               if getattr(cb, "__module__", "") == _controller.__name__
               or type(getattr(cb, "__self__", None)) is _controller.Controller)


def _add_k(x, k):  # type: ignore[no-untyped-def]
    return x + k


def test_the_caches_are_bounded_and_a_stopped_mesh_leaves_nothing_alive(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MONARCH_TENSOR_OP_CACHE_SIZE", "8")
    refs = []
    for round_ in range(2):                      # meshes spawned in a loop (elastic restarts, tests)
        pm = this_host().spawn_procs(per_host={"dp": 2})
        with pm.activate():
            ctl = _controller.active()
            x = torch.ones(3)
            for p in range(20):                  # pow keeps its exponent in the key: 20 entries offered
                x.pow(p)
            add_k = remote(_add_k, propagate="cached")
            for k in range(12):                  # the remote signatures hold k's value
                add_k(x, k)
            assert len(ctl.op_cache) <= 8 and len(ctl.propagations) <= 8
            assert monarch.inspect(add_k(x, 3), dp=1).tolist() == [4.0] * 3
            assert monarch.inspect(x.pow(2) * 3).tolist() == [3.0] * 3
        refs.append(weakref.ref(ctl))
        if round_ == 0:
            listeners = _engine_listeners()
        del ctl, x, add_k
        pm.stop().get(timeout=60)
        with pytest.raises(RuntimeError, match="stopped"):
            with pm.activate():
                torch.ones(1)
        del pm
    assert _engine_listeners() == listeners <= 1  # one listener for every mesh: none per controller
    deadline = time.monotonic() + 30
    while any(r() is not None for r in refs) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.1)
    alive = [r() for r in refs if r() is not None]
    assert not alive, [gc.get_referrers(c) for c in alive]


# ---------------------------------------------------------------- C, D, E: errors that say what to do

def test_mixing_two_slices_of_one_mesh_names_each_slices_procs(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.slice(tp=0).activate():
        t = torch.ones(2)
    with mesh.slice(tp=1).activate():
        with pytest.raises(RuntimeError) as info:
            t + 1
    msg = str(info.value)
    assert "ranks 0, 2 of 'procs" in msg and "ranks 1, 3 of 'procs" in msg, msg
    assert msg.index("ranks 0, 2") < msg.index("used inside") < msg.index("ranks 1, 3"), msg


def test_indexing_by_a_distributed_scalar_names_a_fix_that_works(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        x = torch.arange(12.0).reshape(3, 4)
        i = mesh.rank_tensor("tp")
        with pytest.raises(RuntimeError, match=r"x\[i.reshape\(1\)\]") as info:
            x[i]
        assert "DataDependent" not in str(info.value)
        with pytest.raises(RuntimeError, match=r"torch.where\(mask, x, 0\)"):
            x[x > 3]                              # a mask: the result's shape depends on values
        row = x[i.reshape(1)][0]                  # the fixes the error names
        picked = torch.index_select(x, 0, i.reshape(1)).squeeze(0)
        y = x.clone()
        y[i.reshape(1)] = torch.zeros(1, 4)
        assert row.shape == picked.shape == (4,)
        got = [(monarch.inspect(row, tp=tp), monarch.inspect(picked, tp=tp), monarch.inspect(y, tp=tp))
               for tp in range(2)]
    local = torch.arange(12.0).reshape(3, 4)
    for tp, (r, p, yv) in enumerate(got):
        assert torch.equal(r, local[tp]) and torch.equal(p, local[tp])
        want = local.clone()
        want[tp] = 0
        assert torch.equal(yv, want)


def test_a_shape_error_raised_in_the_client_logs_nothing(mesh) -> None:  # type: ignore[no-untyped-def]
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    torch_log = logging.getLogger("torch._subclasses.fake_tensor")
    handler = Keep(logging.DEBUG)
    torch_log.addHandler(handler)
    try:
        with mesh.activate():
            with pytest.raises(RuntimeError, match="broadcast"):
                torch.ones(3) + torch.ones(4)
    finally:
        torch_log.removeHandler(handler)
    assert [r.getMessage() for r in records] == []


def test_a_remote_functions_traceback_names_its_source_file(mesh) -> None:  # type: ignore[no-untyped-def]
    # a function pickled by value (its module is not importable on the procs: a script's __main__)
    namespace = {"__name__": "a_script_of_the_user"}
    source = "def boom(x):\n    return x.sum() + (1 / 0)\n"
    exec(compile(source, "/home/user/train_script.py", "exec"), namespace)  # noqa: S102
    boom = remote(namespace["boom"], propagate=lambda x: x.sum())
    with mesh.activate():
        out = boom(torch.ones(2))
        with pytest.raises(ActorError) as info:
            monarch.inspect(out, dp=1)
    err = info.value.exception
    assert isinstance(err, TensorOpError) and "ZeroDivisionError" in str(err)
    assert 'File "/home/user/train_script.py", line 2, in boom' in str(err), str(err)
    assert "<dynamic-code>" not in str(err)


# ---------------------------------------------------------------- F: one cast per batch

def test_each_batch_of_commands_is_one_cast_to_the_whole_mesh(mesh) -> None:  # type: ignore[no-untyped-def]
    """Issue 40: a batch reaches the procs as one broadcast of the workers'
    mesh (the cast path), not one send per proc: the client-side metrics of
    the workers' ``run`` endpoint count one whole-mesh broadcast per batch,
    and none to a single rank."""
    from monarch_core import telemetry

    with mesh.activate():
        x = torch.zeros(4)
        monarch.inspect(x)
        ctl = _controller.active()
        name = ctl.workers._name

        def runs() -> dict:
            got: dict = {}
            for r in telemetry.endpoint_metrics(mesh=name, endpoint="run", side="client", refresh=False):
                got[(r.rank, r.adverb)] = got.get((r.rank, r.adverb), 0) + r.calls
            return got

        before = runs()
        for _ in range(5):
            x = x + 1
            ctl.flush()  # one batch each
        after = runs()
        assert monarch.inspect(x, dp=1, tp=1).tolist() == [5.0] * 4
    sent = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    sent = {k: v for k, v in sent.items() if v}
    assert sent == {(None, "broadcast"): 5}, f"the batches went out as {sent} (rank, adverb): one cast each expected"
