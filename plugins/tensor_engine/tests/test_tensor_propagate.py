"""``propagate=`` of remote functions and rref endpoints on real procs: a
callable, ``"cached"``, ``"inspect"``, ``"mocked"`` and the default, each
checked against the values every proc computes, how many times the
function ran there, and the errors that say what to do."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import monarch_core as monarch  # noqa: E402
from monarch_core.actor import Actor, ActorError, current_rank, endpoint, this_host  # noqa: E402
from monarch_tensor_engine._client import _controller  # noqa: E402
from monarch_tensor_engine.api import TensorOpError, remote  # noqa: E402


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs(per_host={"dp": 3})
    yield pm
    pm.stop().get(timeout=60)


CALLS: dict[str, int] = {}


def count(name: str) -> None:
    CALLS[name] = CALLS.get(name, 0) + 1


def calls(name):  # type: ignore[no-untyped-def]
    return torch.tensor(CALLS.get(name, 0))


def through_numpy(x):  # type: ignore[no-untyped-def]
    """Cannot run on fake tensors (it reads values through numpy)."""
    count("through_numpy")
    return torch.from_numpy(x.numpy() * 2), x.shape[0]


def first(x, n):  # type: ignore[no-untyped-def]
    """The first ``int(n)`` entries: the shape depends on a value."""
    count("first")
    return x[: int(n)].clone()


def matmul_t(a, b):  # type: ignore[no-untyped-def]
    return a @ b.t()


def fails_on_zero(x):  # type: ignore[no-untyped-def]
    if int(x.sum()) == 0:
        raise ValueError("no zeros here")
    return x + 1


def calls_on(mesh, name: str) -> list[int]:  # type: ignore[no-untyped-def]
    f = remote(calls, propagate=lambda n: torch.empty((), dtype=torch.int64))
    r = f(name)
    return [int(monarch.inspect(r, dp=d)) for d in range(3)]


def test_the_default_falls_back_to_cached_for_a_function_that_cannot_run_on_fakes(mesh) -> None:  # type: ignore[no-untyped-def]
    f = remote(through_numpy)
    with mesh.activate():
        base = calls_on(mesh, "through_numpy")
        x = torch.arange(4.0) + mesh.rank_tensor("dp")
        y, n = f(x)                                   # the first call waits for the first proc's description
        assert isinstance(y, monarch.Tensor) and y.shape == (4,) and n == 4
        y2, _ = f(x + 1)                              # same signature: from the cache
        got = [monarch.inspect(y2, dp=d).tolist() for d in range(3)]
        after = calls_on(mesh, "through_numpy")
    assert got == [[(i + d + 1) * 2.0 for i in range(4)] for d in range(3)]
    assert [a - b for a, b in zip(after, base)] == [2, 2, 2]   # once per call on every proc, never again for shapes
    assert any(k[0] is through_numpy for k in _controller.controller(mesh).propagations)


def test_cached_reuses_the_first_description_and_a_proc_whose_shape_differs_is_poisoned(mesh) -> None:  # type: ignore[no-untyped-def]
    cached = remote(first, propagate="cached")
    inspected = remote(first, propagate="inspect")
    with mesh.activate():
        x = torch.arange(6.0) * (mesh.rank_tensor("dp") + 1)
        two = torch.ones(()) * 2
        three = torch.ones(()) * 3
        a = inspected(x, two)
        b = inspected(x, three)                       # described again: the shape follows the value
        assert (a.shape, b.shape) == ((2,), (3,))
        assert monarch.inspect(b, dp=2).tolist() == [0.0, 3.0, 6.0]
        c = cached(x, two)
        d = cached(x, three)                          # same signature: the cached shape (2,) is wrong for it
        assert c.shape == d.shape == (2,)
        assert monarch.inspect(c, dp=1).tolist() == [0.0, 2.0]
        with pytest.raises(ActorError, match=r"has shape \(3,\).*expected \(2,\).*propagate='inspect'"):
            monarch.inspect(d, dp=1)
        assert monarch.inspect(x + 1, dp=1).tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]  # the rest goes on


def test_mocked_runs_the_function_in_the_client_on_zeros(mesh) -> None:  # type: ignore[no-untyped-def]
    f = remote(matmul_t, propagate="mocked")
    with mesh.activate():
        a = torch.ones(2, 3) * (mesh.rank_tensor("dp") + 1)
        b = torch.arange(12.0).reshape(4, 3)
        y = f(a, b)
        assert y.shape == (2, 4)
        got = monarch.inspect(y, dp=2)
    assert torch.equal(got, (torch.ones(2, 3) * 3) @ torch.arange(12.0).reshape(4, 3).t())


def test_a_failure_on_the_first_proc_raises_at_the_call_and_the_mesh_goes_on(mesh) -> None:  # type: ignore[no-untyped-def]
    f = remote(fails_on_zero, propagate="inspect")
    with mesh.activate():
        with pytest.raises(ActorError, match="no zeros here") as info:
            f(torch.zeros(2))
        assert isinstance(info.value.exception, TensorOpError)
        assert monarch.inspect(f(torch.ones(2)), dp=2).tolist() == [2.0, 2.0]


def test_a_bad_propagate_is_refused_listing_the_choices() -> None:
    with pytest.raises(ValueError, match="'cached', 'inspect', 'mocked'"):
        remote(first, propagate="guess")


class Doubler(Actor):
    def __init__(self) -> None:
        self.r = current_rank().rank
        self.calls = 0

    @endpoint
    def double(self, x):  # type: ignore[no-untyped-def]
        self.calls += 1
        return x * 2 + self.r

    @endpoint(propagate="inspect")
    def head(self, x, n: int):  # type: ignore[no-untyped-def]
        return x[:n].clone()

    @endpoint(propagate="mocked")
    def mocked(self, x):  # type: ignore[no-untyped-def]
        return x

    @endpoint
    def count(self) -> int:
        return self.calls


def test_rref_without_propagate_is_cached_and_inspect_follows_values(mesh) -> None:  # type: ignore[no-untyped-def]
    actors = mesh.spawn("doublers", Doubler)
    with mesh.activate():
        x = torch.ones(3)
        y = actors.double.rref(x)                     # no propagate: the first proc describes it
        z = actors.double.rref(x + 1)                 # from the cache
        assert y.shape == z.shape == (3,)
        got = [monarch.inspect(z, dp=d).tolist() for d in range(3)]
        assert actors.head.rref(torch.arange(5.0), 2).shape == (2,)
        assert actors.head.rref(torch.arange(5.0), 4).shape == (4,)
        with pytest.raises(ValueError, match="an endpoint cannot run in the client"):
            actors.mocked.rref(x)
    assert got == [[4.0 + d] * 3 for d in range(3)]
    assert actors.count.call().get(timeout=60).values() == [2, 2, 2]
