"""Streams, borrows and ``grad_generator`` on real procs (CPU, gloo): the
reference's borrow rules enforced in the client, values handed between
streams, and a DDP step whose gradient reductions run on a comms stream
while the backward goes on (checked by the order of two events on the
procs, never by a duration), equal to single-process SGD."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

import monarch_core as monarch  # noqa: E402
from monarch_core.actor import this_host  # noqa: E402
from monarch_tensor_engine.api import remote  # noqa: E402


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs(per_host={"dp": 4})
    yield pm
    pm.stop().get(timeout=60)


def test_a_tensor_is_used_on_its_own_stream_only_unless_borrowed(mesh) -> None:  # type: ignore[no-untyped-def]
    side = monarch.Stream("side")
    assert monarch.get_active_stream().name == "main"
    with mesh.activate():
        t = torch.ones(3) * (mesh.rank_tensor("dp") + 1)
        assert t.stream is monarch.get_active_stream()
        with side.activate():
            assert monarch.get_active_stream() is side
            with pytest.raises(RuntimeError, match=r"a tensor of stream 'main' used on stream 'side': borrow it"):
                t + 1
            u = torch.zeros(2)                       # made on side: it belongs to side
        assert u.stream is side
        with pytest.raises(RuntimeError, match="used on stream 'main'"):
            u * 2
        with pytest.raises(RuntimeError, match="used on stream 'main'"):
            monarch.fetch_shard(u)
        with side.activate():
            assert monarch.inspect(u, dp=3).tolist() == [0.0, 0.0]   # fetched after side has run it
        assert monarch.inspect(t, dp=2).tolist() == [3.0] * 3


def test_borrow_rules_are_errors_in_the_client_at_once(mesh) -> None:  # type: ignore[no-untyped-def]
    side = monarch.Stream("side")
    with mesh.activate():
        t = torch.ones(3)
        r, b = side.borrow(t)                        # read-only
        assert r.stream is side and tuple(r.shape) == (3,)
        assert monarch.inspect(t * 2).tolist() == [2.0] * 3   # the lender may still read it
        with pytest.raises(RuntimeError, match=r"borrowed \(read-only\) by stream 'side'"):
            t.add_(1)
        with side.activate():
            with pytest.raises(RuntimeError, match="a read-only borrow cannot be written"):
                r.mul_(2)
            s = r * 10                               # reading it on side is fine
        b.drop()
        with side.activate():
            with pytest.raises(RuntimeError, match="the borrow has been dropped"):
                r + 1
            assert monarch.inspect(s).tolist() == [10.0] * 3
        with pytest.raises(RuntimeError, match="already dropped"):
            b.drop()
        t.add_(1)                                    # the lender owns it again
        m, mb = side.borrow(t, mutable=True)
        with pytest.raises(RuntimeError, match="mutably borrowed by stream 'side'"):
            t + 1
        with pytest.raises(RuntimeError, match="mutably borrowed"):
            side.borrow(t)
        with side.activate():
            m.mul_(5)                                # the borrower writes the lender's storage
        mb.drop()
        assert monarch.inspect(t, dp=1).tolist() == [10.0] * 3   # main waited for side's write
        with pytest.raises(ValueError, match="already belongs to stream 'main'"):
            monarch.get_active_stream().borrow(t)


def test_a_mutable_borrow_reduced_on_another_stream_is_the_lenders_value_after_the_drop(mesh) -> None:  # type: ignore[no-untyped-def]
    comms = monarch.Stream("comms")
    with mesh.activate():
        g = torch.arange(4.0) * (mesh.rank_tensor("dp") + 1)
        rg, borrow = comms.borrow(g, mutable=True)
        with comms.activate():
            rg.reduce_("dp", "sum")
        later = torch.ones(2) * 7                    # main goes on meanwhile
        borrow.drop()
        total = g + 0
        got = [monarch.inspect(total, dp=d).tolist() for d in range(4)]
        assert monarch.inspect(later).tolist() == [7.0, 7.0]
    assert got == [[0.0, 10.0, 20.0, 30.0]] * 4


# ---------------------------------------------------------------- DDP with a comms stream

STAMPS: dict[str, float] = {}
SLOW_S = 2.5


class SlowBackward(torch.autograd.Function):
    """The identity, whose backward takes SLOW_S seconds and stamps its end (on the procs)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        time.sleep(SLOW_S)
        STAMPS["backward_done"] = time.monotonic()
        return grad


def slow_identity(x):  # type: ignore[no-untyped-def]
    return SlowBackward.apply(x)


def stamp_reduced(x):  # type: ignore[no-untyped-def]
    STAMPS.setdefault("first_reduced", time.monotonic())
    return x.clone()


def stamps():  # type: ignore[no-untyped-def]
    return torch.tensor([STAMPS["first_reduced"], STAMPS["backward_done"]], dtype=torch.float64)


def rows(rank):  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(16, 3, generator=g, dtype=torch.float64), torch.randn(16, 1, generator=g, dtype=torch.float64)
    r = int(rank)
    return x[r * 4:(r + 1) * 4].clone(), y[r * 4:(r + 1) * 4].clone()


def init(l1, l2) -> None:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        l1.weight.copy_(torch.arange(6, dtype=torch.float64).reshape(2, 3) / 8)
        l1.bias.fill_(0.125)
        l2.weight.copy_(torch.tensor([[0.5, -0.25]], dtype=torch.float64))
        l2.bias.fill_(-0.5)


def test_ddp_reductions_on_a_comms_stream_overlap_the_backward_and_match_single_process_sgd(mesh) -> None:  # type: ignore[no-untyped-def]
    comms = monarch.Stream("comms")
    like = lambda x: x.clone()  # noqa: E731 - the results' shapes are the input's
    with mesh.activate():
        with comms.activate():
            torch.zeros(1).reduce_("dp")             # the comms stream's group, made before the step
        x, y = remote(rows, propagate=lambda r: (torch.empty(4, 3, dtype=torch.float64),
                                                 torch.empty(4, 1, dtype=torch.float64)))(mesh.rank_tensor("dp"))
        l1, l2 = torch.nn.Linear(3, 2, dtype=torch.float64), torch.nn.Linear(2, 1, dtype=torch.float64)
        init(l1, l2)
        h = remote(slow_identity, propagate=like)(l1(x).tanh())
        loss = torch.nn.functional.mse_loss(l2(h), y)
        params = [l1.weight, l1.bias, l2.weight, l2.bias]
        rparams = list(reversed(params))
        borrows = []
        for p, grad in zip(rparams, monarch.grad_generator(loss, rparams)):
            rg, borrow = comms.borrow(grad, mutable=True)
            with comms.activate():
                rg.reduce_("dp", "avg")
                remote(stamp_reduced, propagate=like)(rg)
            borrows.append((p, grad, borrow))
        for p, grad, borrow in borrows:
            borrow.drop()                            # main waits for that reduction here, not before
            with torch.no_grad():
                p -= 0.1 * grad
        got = [[monarch.inspect(p, dp=r) for p in params] for r in range(4)]
        first_reduced, backward_done = monarch.call_on_shard_and_fetch(
            remote(stamps, propagate=lambda: torch.empty(2, dtype=torch.float64)), shard={"dp": 0}).get().tolist()
    # the last layer's gradient was reduced while the backward still ran (in the slow layer)
    assert first_reduced < backward_done
    g = torch.Generator().manual_seed(7)
    X, Y = torch.randn(16, 3, generator=g, dtype=torch.float64), torch.randn(16, 1, generator=g, dtype=torch.float64)
    r1, r2 = torch.nn.Linear(3, 2, dtype=torch.float64), torch.nn.Linear(2, 1, dtype=torch.float64)
    init(r1, r2)
    torch.nn.functional.mse_loss(r2(r1(X).tanh()), Y).backward()
    with torch.no_grad():
        for p in (r1.weight, r1.bias, r2.weight, r2.bias):
            p -= 0.1 * p.grad
    for r in range(4):
        for value, ref in zip(got[r], (r1.weight, r1.bias, r2.weight, r2.bias)):
            torch.testing.assert_close(value, ref.detach(), rtol=0, atol=1e-12)


def test_a_failed_backward_poisons_the_gradients_and_the_stream_goes_on(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        w = torch.ones(3, requires_grad=True)
        loss = (w * 2).sum()
        grads = monarch.grad_generator(loss, [w], grad_roots=[torch.ones(2)])  # wrong shape of grad_roots
        with pytest.raises(RuntimeError):
            next(grads)                              # the fakes refuse it in the client, at once
        loss = (w * 3).sum()
        (g,) = list(monarch.grad_generator(loss, [w]))
        assert monarch.inspect(g, dp=2).tolist() == [3.0] * 3
