"""``Channel``, ``Port``, ``PortReceiver``; ports and actor meshes passed as
endpoint arguments (actor-to-actor messaging across procs)."""

from __future__ import annotations

import os

import pytest

from monarch_core.actor import (
    Actor,
    ActorError,
    Channel,
    Port,
    PortReceiver,
    current_rank,
    current_size,
    endpoint,
)

from _helpers import fresh


class Sender(Actor):
    @endpoint
    def report(self, port: Port, tag: str) -> str:
        port.send((tag, current_rank().rank))
        return "sent"

    @endpoint
    def report_many(self, port: Port, n: int) -> None:
        for i in range(n):
            port.send(i)

    @endpoint
    def fail_port(self, port: Port, msg: str) -> None:
        port.exception(ValueError(msg))

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def square(self, x: int) -> int:
        return x * x

    @endpoint
    def info(self) -> tuple:
        return (current_rank().rank, current_size(), os.getpid())


class Relay(Actor):
    """Calls another actor mesh it receives as an argument."""

    @endpoint
    async def sum_squares(self, other, x: int) -> int:  # noqa: ANN001
        vm = await other.square.call(x)
        return sum(vm.values())

    @endpoint
    def sum_squares_sync(self, other, x: int) -> int:  # noqa: ANN001
        return sum(other.square.call(x).get().values())

    @endpoint
    async def collect_infos(self, other) -> tuple:  # noqa: ANN001
        vm = await other.info.call()
        return (os.getpid(), vm.values())

    @endpoint
    async def via_own_channel(self, other, n: int) -> list:  # noqa: ANN001
        """Open a channel here, hand its port to ``other``, read the replies."""
        port, recv = Channel.open()
        await other.report_many.call(port, n)
        out = []
        for _ in range(n * other.size()):
            out.append(await recv.recv())
        return sorted(out)

    @endpoint
    async def via_ranked_channel(self, other) -> list:  # noqa: ANN001
        port, recv = Channel.open_ranked()
        await other.report.call(port, "r")
        return sorted([await recv.recv() for _ in range(other.size())])

    @endpoint
    def forward(self, port: Port, value) -> None:  # noqa: ANN001
        port.send(("forwarded", value, current_rank().rank))


# ---------------------------------------------------------------- channels on the client


def test_channel_open_send_recv_in_order() -> None:
    port, recv = Channel.open()
    assert isinstance(port, Port)
    assert isinstance(recv, PortReceiver)
    for i in range(5):
        port.send(i)
    assert [recv.recv().get() for _ in range(5)] == [0, 1, 2, 3, 4]


def test_recv_before_send() -> None:
    port, recv = Channel.open()
    f1 = recv.recv()
    f2 = recv.recv()
    port.send("first")
    port.send("second")
    assert f1.get(timeout=30) == "first"
    assert f2.get(timeout=30) == "second"


def test_channel_open_once() -> None:
    port, recv = Channel.open(once=True)
    port.send({"only": 1})
    assert recv.recv().get(timeout=30) == {"only": 1}


def test_port_exception_raises_at_receiver() -> None:
    port, recv = Channel.open()
    port.exception(ValueError("broken pipe dream"))
    port.send("after")
    with pytest.raises((ActorError, ValueError), match="broken pipe dream"):
        recv.recv().get(timeout=30)
    assert recv.recv().get(timeout=30) == "after"


# ---------------------------------------------------------------- ports passed to actors


def test_port_passed_to_endpoint(procs) -> None:
    s = procs.spawn(fresh("sender"), Sender)
    port, recv = Channel.open()
    assert s.report.call(port, "t").get().values() == ["sent"] * 4
    got = sorted(recv.recv().get(timeout=30) for _ in range(4))
    assert got == [("t", 0), ("t", 1), ("t", 2), ("t", 3)]


def test_port_messages_from_one_actor_keep_order(procs) -> None:
    s = procs.spawn(fresh("sender"), Sender).slice(gpus=2)
    port, recv = Channel.open()
    s.report_many.call_one(port, 20).get()
    assert [recv.recv().get(timeout=30) for _ in range(20)] == list(range(20))


def test_ranked_channel(procs) -> None:
    s = procs.spawn(fresh("sender"), Sender)
    port, recv = Channel.open_ranked()
    s.report.call(port, "k").get()
    got = sorted(recv.recv().get(timeout=30) for _ in range(4))
    assert got == [(r, ("k", r)) for r in range(4)]


def test_receiver_ranked_view(procs) -> None:
    s = procs.spawn(fresh("sender"), Sender)
    port, recv = Channel.open()
    ranked = recv.ranked()
    s.slice(gpus=slice(1, 3)).report.call(port, "v").get()
    got = sorted(ranked.recv().get(timeout=30) for _ in range(2))
    assert got == [(0, ("v", 0)), (1, ("v", 1))]


def test_port_exception_from_actor(procs) -> None:
    s = procs.spawn(fresh("sender"), Sender).slice(gpus=0)
    port, recv = Channel.open()
    s.fail_port.call_one(port, "remote port failure 5").get()
    with pytest.raises((ActorError, ValueError), match="remote port failure 5"):
        recv.recv().get(timeout=30)
    # the actor is fine
    assert s.square.call_one(3).get() == 9


# ---------------------------------------------------------------- actor meshes as arguments


def test_actor_mesh_passed_to_actor_and_called(procs, procs2d) -> None:
    squares = procs.spawn(fresh("sq"), Sender)
    relay = procs2d.spawn(fresh("relay"), Relay)
    one = relay.slice(dp=0, tp=1)
    assert one.sum_squares.call_one(squares, 3).get() == 36
    assert one.sum_squares_sync.call_one(squares, 2).get() == 16
    # every relay rank can use the mesh
    assert relay.sum_squares.call(squares, 1).get().values() == [4, 4, 4, 4]


def test_sliced_mesh_passed_to_actor(procs, procs2d) -> None:
    target = procs.spawn(fresh("target"), Sender)
    relay = procs2d.spawn(fresh("relay"), Relay).slice(dp=1, tp=1)
    client_pids = target.pid.call().get().values()
    relay_pid, infos = relay.collect_infos.call_one(target.slice(gpus=slice(1, 3))).get()
    assert relay_pid not in client_pids
    assert infos == [
        (0, {"gpus": 2}, client_pids[1]),
        (1, {"gpus": 2}, client_pids[2]),
    ]


def test_actor_opens_channel_and_passes_port_to_other_actor(procs, procs2d) -> None:
    target = procs.spawn(fresh("target"), Sender)
    relay = procs2d.spawn(fresh("relay"), Relay).slice(dp=0, tp=0)
    assert relay.via_own_channel.call_one(target, 3).get() == sorted([0, 1, 2] * 4)
    assert relay.via_ranked_channel.call_one(target.slice(gpus=slice(0, 2))).get() == [
        (0, ("r", 0)),
        (1, ("r", 1)),
    ]


def test_client_port_forwarded_through_actor(procs2d) -> None:
    relay = procs2d.spawn(fresh("relay"), Relay)
    port, recv = Channel.open()
    relay.forward.call(port, "hello").get()
    got = sorted(recv.recv().get(timeout=30) for _ in range(4))
    assert got == [("forwarded", "hello", r) for r in range(4)]

