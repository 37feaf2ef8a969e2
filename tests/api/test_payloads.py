"""Large payloads: bytes and torch tensors arrive intact; tensors travel out of
band (no torch.save copy) and are rebuilt on the received buffer."""

from __future__ import annotations

import os

import pytest

from monarch_core.actor import Actor, endpoint, this_host


class Echo(Actor):
    @endpoint
    def echo(self, x):
        return x


@pytest.fixture(scope="module")
def echo():
    procs = this_host().spawn_procs(per_host={"gpus": 1}, name="payload_procs")
    mesh = procs.spawn("echo", Echo)
    yield mesh
    procs.stop().get(timeout=30)


def test_64_mib_bytes_round_trip_intact(echo) -> None:
    data = os.urandom(64 << 20)
    out = echo.echo.call_one(data).get(timeout=60)
    assert type(out) is bytes and out == data


@pytest.mark.parametrize("kind", ["uint8-64MiB", "float64-2d", "bool", "empty", "noncontiguous", "requires_grad", "int16-scalar"])
def test_tensor_round_trip(echo, kind: str) -> None:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(7)
    x = {
        "uint8-64MiB": lambda: torch.randint(0, 256, (64 << 20,), dtype=torch.uint8, generator=g),
        "float64-2d": lambda: torch.randn(300, 400, dtype=torch.float64, generator=g),
        "bool": lambda: torch.rand(100_000, generator=g) > 0.5,
        "empty": lambda: torch.zeros(0, 3),
        "noncontiguous": lambda: torch.randn(200, 300, generator=g).t(),
        "requires_grad": lambda: torch.randn(10_000, generator=g).requires_grad_(),
        "int16-scalar": lambda: torch.tensor(7, dtype=torch.int16),
    }[kind]()
    y = echo.echo.call_one(x).get(timeout=60)
    assert isinstance(y, torch.Tensor) and y.dtype == x.dtype and y.shape == x.shape
    assert torch.equal(x.detach(), y.detach())
    assert y.requires_grad == x.requires_grad


def test_a_tensor_dropped_by_the_sender_right_after_the_call_still_arrives_intact(echo) -> None:
    torch = pytest.importorskip("torch")
    futs = [echo.echo.call_one(torch.full((1 << 20,), i, dtype=torch.int32)) for i in range(8)]
    for i, f in enumerate(futs):  # the tensors above have no other reference
        y = f.get(timeout=60)
        assert y.shape == (1 << 20,) and int(y.min()) == i == int(y.max())


def test_received_tensors_kept_alive_never_share_a_pooled_buffer(echo) -> None:
    """Large received parts land in pooled buffers that are reused once their
    consumer drops them: tensors still held must keep their contents while
    later messages of the same size arrive (on both sides of the echo)."""
    torch = pytest.importorskip("torch")
    kept = [echo.echo.call_one(torch.full((2 << 20,), i, dtype=torch.int32)).get(timeout=60) for i in range(6)]
    for _ in range(3):  # dropped at once: their buffers are reused by the next ones
        echo.echo.call_one(torch.zeros(2 << 20, dtype=torch.int32)).get(timeout=60)
    for i, y in enumerate(kept):
        assert int(y.min()) == i == int(y.max())
    assert len({y.data_ptr() for y in kept}) == len(kept)


def test_large_bytes_arrive_as_bytes_in_both_directions(echo) -> None:
    data = os.urandom(3 << 20)
    for _ in range(3):
        out = echo.echo.call_one((data, [data[:10]], {"k": data})).get(timeout=60)
        assert type(out[0]) is bytes and out[0] == data
        assert out[1] == [data[:10]] and type(out[2]["k"]) is bytes and out[2]["k"] == data
