"""A remote function's messaging adverbs (``remote(fn).call()`` ...,
``send(remote(fn), ...)``): the function runs on the procs of the active mesh,
in order with the mesh's other commands, and its values come back to the
client (the reference's ``Remote`` is an endpoint of the active mesh; its
getting_started example calls ``check_memory.call()``).  Real procs, no mocks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from monarch_core.actor import ActorError, Channel, ValueMesh, send, this_host  # noqa: E402
from monarch_tensor_engine.api import remote  # noqa: E402


@remote
def whoami(x: int) -> tuple[int, int]:
    from monarch_core.actor import context

    return context().actor_instance.rank.rank, x


@remote
def plus(t, y):  # type: ignore[no-untyped-def]
    return t + y


@remote
def fill_(t, v):  # type: ignore[no-untyped-def]
    t.fill_(v)
    return None


@remote
def boom() -> None:
    raise ValueError("boom on purpose")


@pytest.fixture(scope="module")
def mesh():  # type: ignore[no-untyped-def]
    pm = this_host().spawn_procs(per_host={"gpus": 2})
    yield pm
    pm.stop().get(timeout=60)


def test_call_returns_a_value_mesh_of_every_procs_result(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        got = whoami.call(5).get(timeout=120)
    assert isinstance(got, ValueMesh)
    assert dict(got.extent.items()) == {"gpus": 2}
    assert sorted(got.values()) == [(0, 5), (1, 5)]


def test_distributed_tensors_arrive_as_each_procs_tensor_in_order_with_other_commands(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        t = torch.ones(3)
        fill_.broadcast(t, 4.0)          # runs before the call below: it sees the filled tensor
        got = plus.call(t, 1).get(timeout=120)
        u = t * 2                         # an operation after a remote value call sees the same tensor
        one = plus.choose(u, 0).get(timeout=120)
    assert [v.tolist() for v in got.values()] == [[5.0, 5.0, 5.0]] * 2
    assert one.tolist() == [8.0, 8.0, 8.0]


def test_stream_call_one_and_send_to_a_port(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        assert sorted(f.get(timeout=120) for f in whoami.stream(3)) == [(0, 3), (1, 3)]
        port, recv = Channel.open()
        send(whoami, args=(7,), kwargs={}, port=port)
        assert sorted(recv.recv().get(timeout=120) for _ in range(2)) == [(0, 7), (1, 7)]
        with pytest.raises(ValueError, match="exactly one proc"):
            whoami.call_one(1)
    with mesh.slice(gpus=1).activate():
        assert whoami.call_one(2).get(timeout=120) == (0, 2)  # its rank within the active mesh


def test_a_failure_on_a_proc_is_its_result_and_outside_a_mesh_it_is_refused(mesh) -> None:  # type: ignore[no-untyped-def]
    with mesh.activate():
        with pytest.raises(ActorError, match="boom on purpose"):
            boom.call().get(timeout=120)
        assert len(whoami.call(0).get(timeout=120)) == 2  # the mesh goes on
    with pytest.raises(ValueError, match="activate"):
        whoami.call(1)
    with pytest.raises(ValueError, match="activate"):
        send(whoami, args=(1,), kwargs={}, port=None)
