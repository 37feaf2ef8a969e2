"""Collectives over a failed or dead member, on real procs with real gloo
(CPU; nothing of torch is mocked).

The rule under test: a collective's outcome is the same on every member of
its group.  A poisoned input on one member poisons EVERY member's result
(never a partial result made with zeros for the failed member), the error
naming the failed member's coordinates and its op; a group with a dead
member fails on every living member at once, without waiting for gloo's
300 s timeout, while a group of living members in the same mesh forms and
works.  Each fetch has a timeout well under 300 s, so that a hang fails the
test instead of blocking it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

import monarch_core as monarch  # noqa: E402
from monarch_core.actor import ActorError, this_host  # noqa: E402
from monarch_tensor_engine.api import TensorOpError, remote  # noqa: E402

#: a fetch that waits longer than this is a hang (gloo's timeout is 300 s)
FETCH_S = 90


@pytest.fixture(scope="module")
def mesh():
    pm = this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
    yield pm
    pm.stop().get(timeout=60)


def boom_on_rank_1(x):  # type: ignore[no-untyped-def]
    """Fails on the proc whose shard starts with 1 (dp=0, tp=1), works on the others."""
    if int(x.flatten()[0]) == 1:
        raise ValueError("bad shard on rank 1")
    return x * 1


def proc_pid():  # type: ignore[no-untyped-def]
    return torch.tensor(os.getpid())


def sleep_on_rank(x, rank, seconds):  # type: ignore[no-untyped-def]
    """``x``, after ``seconds`` of sleep on the proc whose shard starts with ``rank``."""
    if int(x.flatten()[0]) == rank:
        time.sleep(seconds)
    return x * 1


def poisoned_error(t, **coords):  # type: ignore[no-untyped-def]
    """The TensorOpError that fetching ``t`` at ``coords`` raises (fails the test if it returns a value)."""
    with pytest.raises(ActorError) as info:
        got = monarch.fetch_shard(t, **coords).get(timeout=FETCH_S)
        pytest.fail(f"the result at {coords} is a value ({got!r}), not poisoned")
    err = info.value.exception
    assert isinstance(err, TensorOpError), err
    return err


@pytest.mark.timeout(600)
def test_a_poisoned_member_poisons_every_members_result_for_every_kind_of_collective(mesh) -> None:  # type: ignore[no-untyped-def]
    fail = remote(boom_on_rank_1, propagate=lambda x: x * 1)
    row0 = mesh.slice(dp=0)
    with mesh.activate():
        r = mesh.rank_tensor("dp") * 2 + mesh.rank_tensor("tp")
        x = torch.ones(4, 2) * r.float()
        y = fail(x)                                    # poisoned on (dp=0, tp=1) only
        bits = fail(torch.ones(2, dtype=torch.int64) * r)
        results = {f"reduce {k}": y.reduce("tp", k) for k in ("sum", "avg", "product", "min", "max", "stack")}
        results["reduce-scatter"] = y.reduce("tp", "sum", scatter=True)
        results["all-to-all"] = y[:2].reduce("tp", "stack", scatter=True)
        results["bor"] = bits.reduce("tp", "bor")
        results["over both dims"] = y.reduce(("dp", "tp"), "sum")
        big = fail(torch.ones(1 << 17) * r.float())    # 512 KiB: its flags in an all-reduce of their own
        results["big sum"] = big.reduce("tp")
        results["big avg, scatter"] = big.reduce("tp", "avg", scatter=True)
        in_place = y * 1
        in_place.reduce_("tp")
        results["reduce_ in place"] = in_place
        out = torch.zeros(4, 2)
        y.reduce("tp", "max", out=out)
        results["out="] = out
        healthy = x.reduce("tp")                       # the same group, a healthy input: a value
        healthy_big = (torch.ones(1 << 17) * r.float()).reduce("tp", "max")
        sub = y.reduce("tp", "sum", mesh=row0)         # each group's result, on the sub-mesh dp=0
        errors = {name: poisoned_error(t, dp=0, tp=0) for name, t in results.items()}
        own = poisoned_error(results["reduce sum"], dp=0, tp=1)
        other_row = monarch.fetch_shard(results["reduce sum"], dp=1, tp=0).get(timeout=FETCH_S)
        both_dims_elsewhere = poisoned_error(results["over both dims"], dp=1, tp=1)
        assert monarch.fetch_shard(healthy, dp=0, tp=0).get(timeout=FETCH_S).tolist() == [[1.0, 1.0]] * 4
        assert bool((monarch.fetch_shard(healthy_big, dp=1, tp=0).get(timeout=FETCH_S) == 3.0).all())
    with row0.activate():
        sub_error = poisoned_error(sub, tp=0)
    for name, err in [*errors.items(), ("over both dims, dp=1", both_dims_elsewhere), ("mesh=", sub_error)]:
        # the failed member and its op are named, and carried as the error's coords and op
        assert err.coords == {"dp": 0, "tp": 1} and err.op == "boom_on_rank_1", (name, err.op, err.coords)
        assert "the member at {'dp': 0, 'tp': 1}" in str(err) and "bad shard on rank 1" in str(err), (name, str(err))
    assert "is poisoned, like the result of every member of its group" in str(errors["reduce sum"])
    # the failed member keeps its own error; the other row's group is untouched
    assert "boom_on_rank_1 failed on the proc at {'dp': 0, 'tp': 1}: ValueError: bad shard on rank 1" in str(own)
    assert other_row.tolist() == [[5.0, 5.0]] * 4  # 2 + 3


def mse_on(x, w):  # type: ignore[no-untyped-def]
    return ((x @ w) ** 2).mean()


@pytest.mark.timeout(300)
def test_a_ddp_step_whose_backward_failed_on_one_rank_leaves_every_replicas_gradient_poisoned(mesh) -> None:  # type: ignore[no-untyped-def]
    fail = remote(boom_on_rank_1, propagate=lambda x: x * 1)
    with mesh.activate():
        r = (mesh.rank_tensor("dp") * 2 + mesh.rank_tensor("tp")).float()
        batch = fail(torch.ones(3, 2) * r)             # rank 1's data (hence its loss and backward) failed
        w = torch.ones(2, 1, requires_grad=True)
        loss = mse_on(batch, w)
        (grad,) = monarch.grad_generator(loss, [w])
        grad.reduce_("tp", "avg")                      # DDP over tp: the healthy replica must not average in a zero
        with torch.no_grad():
            w -= 0.1 * grad
        err = poisoned_error(w, dp=0, tp=0)            # the update used the poisoned average: poisoned too
        assert err.coords == {"dp": 0, "tp": 1}
        fine = monarch.fetch_shard(w, dp=1, tp=1).get(timeout=FETCH_S)
    x = torch.ones(3, 2)
    want = []
    for rank in (2, 3):  # the other row's replicas: the local oracle
        wl = torch.ones(2, 1, requires_grad=True)
        mse_on(x * rank, wl).backward()
        want.append(wl.grad)
    torch.testing.assert_close(fine, torch.ones(2, 1) - 0.1 * (want[0] + want[1]) / 2)


def pids():  # type: ignore[no-untyped-def]
    """Each proc's process id, as a distributed tensor of the active mesh."""
    return remote(proc_pid, propagate=lambda: torch.empty((), dtype=torch.int64))()


@pytest.fixture
def faults():  # type: ignore[no-untyped-def]
    """The unhandled supervision events of the test (a killed proc is one), recorded instead of
    interrupting the main thread (the default)."""
    import monarch_core.actor as mactor

    seen: list = []
    saved = mactor.unhandled_fault_hook
    mactor.unhandled_fault_hook = seen.append
    yield seen
    mactor.unhandled_fault_hook = saved


def _wait_death_marked(pm, rank: int) -> None:  # type: ignore[no-untyped-def]
    """Wait (60 s at most) until the client has told the mesh's procs that ``rank`` died, through the
    mesh's store: from then on the procs know, and a collective issued now meets the death as known."""
    from monarch_tensor_engine import _protocol
    from monarch_tensor_engine._client import _controller

    ctl = _controller.controller(pm)
    deadline = time.monotonic() + 60
    while True:
        if ctl.store.address is not None and rank in ctl.dead:
            client = _protocol.store_client(*ctl.store.address)
            if client.check([_protocol.DEAD_KEY]):
                return
        assert time.monotonic() < deadline, f"the client did not mark rank {rank} dead within 60 s: {ctl.dead}"
        time.sleep(0.05)


@pytest.mark.timeout(400)
def test_after_a_proc_dies_a_group_of_living_procs_forms_and_one_with_the_dead_proc_fails_at_once(faults) -> None:  # type: ignore[no-untyped-def]
    pm = this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
    try:
        with pm.activate():
            r = pm.rank_tensor("dp") * 2 + pm.rank_tensor("tp")
            x = torch.ones(2) * r.float()
            warm = x.reduce("dp")                      # the groups' store, and the dp groups, exist now
            assert monarch.fetch_shard(warm, dp=0, tp=1).get(timeout=FETCH_S).tolist() == [4.0, 4.0]
            pid = int(monarch.fetch_shard(pids(), dp=0, tp=1).get(timeout=FETCH_S))
            os.kill(pid, signal.SIGKILL)               # rank 1: (dp=0, tp=1)
            _wait_death_marked(pm, 1)
            total = x.reduce("tp")                     # new tp groups: dp=1's are all alive, dp=0's lost rank 1
            healthy = [monarch.fetch_shard(total, dp=1, tp=t).get(timeout=FETCH_S).tolist() for t in range(2)]
            broken = poisoned_error(total, dp=0, tp=0)
            over_dp = x.reduce("dp")                   # formed groups: tp=0 is alive, tp=1 lost rank 1
            assert monarch.fetch_shard(over_dp, dp=1, tp=0).get(timeout=FETCH_S).tolist() == [2.0, 2.0]
            dp_broken = poisoned_error(over_dp, dp=1, tp=1)
        assert healthy == [[5.0, 5.0], [5.0, 5.0]]
        for err in (broken, dp_broken):
            assert err.coords == {"dp": 0, "tp": 1} and "rank 1 {'dp': 0, 'tp': 1}" in str(err), str(err)
            assert "died" in str(err)
    finally:
        pm.stop().get(timeout=60)


@pytest.mark.timeout(400)
def test_a_member_that_dies_while_a_collective_is_in_flight_fails_every_other_member_promptly(faults) -> None:  # type: ignore[no-untyped-def]
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    try:
        with pm.activate():
            x = torch.ones(1 << 16) * pm.rank_tensor("gpus").float()
            warm = x.reduce("gpus")                    # the group is formed: its connections are up
            assert monarch.fetch_shard(warm, gpus=0).get(timeout=FETCH_S)[0].item() == 6.0
            pid = int(monarch.fetch_shard(pids(), gpus=3).get(timeout=FETCH_S))
            slow = remote(sleep_on_rank, propagate=lambda x, rank, seconds: x * 1)(x, 3, 30.0)
            total = slow.reduce("gpus")                # ranks 0-2 wait in the collective for rank 3
        time.sleep(3)                                  # the block's end sent both: the others are in it now
        os.kill(pid, signal.SIGKILL)
        with pm.activate():
            errors = [poisoned_error(total, gpus=g) for g in range(3)]  # each well before gloo's 300 s
        for err in errors:
            assert err.coords == {"gpus": 3} and "died" in str(err), str(err)
    finally:
        pm.stop().get(timeout=60)
