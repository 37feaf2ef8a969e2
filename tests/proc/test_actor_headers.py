"""An actor message whose header has the wrong shape drops the connection
that carried it.  The kernel reads only the actor key (a str) to route it; the
rest of the header's shape is checked where the message enters the actor
layer (``ActorHost.enqueue`` for an actor the proc runs,
``ProcAgent.no_such_actor`` for one it does not), which raises the same
``ProtocolError``.  Raw frames on a connection of their own to a spawned proc
(internals, hence here and not in ``tests/api``)."""

from __future__ import annotations

import marshal
import uuid

import pytest
import trio

from monarch_core._proc._agent import ProcAgent
from monarch_core._proc._host import ActorHost
from monarch_core._kernel import _wire as W
from monarch_core._plugins import registry
from monarch_core.actor import Actor, endpoint, this_host
from monarch_core.errors import ConnectionClosed, ProtocolError

from _helpers import T, fresh

TRACE = bytes(24)  # a trace context
REST = (None, 0, (), (), "client", None, 0)  # reply, rank, labels, sizes, sender, ret, explicit


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


class _Host:
    """What ``ActorHost.enqueue`` touches of its actor host."""

    def __init__(self) -> None:
        self.posted: list = []

    def _post(self, item: tuple) -> None:
        self.posted.append(item)


@pytest.mark.parametrize(
    "h",
    [("k", "ep"), ("k", "ep", *REST, "ctx"), ("k", 5, *REST), ("k", "ep", *REST, TRACE, 1), ("k", "ep", *REST[:-1])],
    ids=["two-fields", "tenth-not-bytes", "method-not-str", "eleven-fields", "eight-fields"],
)
def test_the_actor_layer_refuses_headers_of_the_wrong_shape_naming_the_peer(h: tuple) -> None:
    host = _Host()
    with pytest.raises(ProtocolError, match="peer peer-x sent a malformed actor message header"):
        ActorHost.enqueue(host, h, b"", [], "peer-x")  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="peer peer-x sent a malformed actor message header"):
        ProcAgent.no_such_actor(object(), h, b"", [], "peer-x")  # type: ignore[arg-type]  # raises before it looks
    assert host.posted == []


def test_the_actor_layer_takes_nine_fields_or_ten_with_a_trace_context() -> None:
    host = _Host()
    for h in [("k", "ep", *REST), ("k", "ep", *REST, TRACE)]:
        ActorHost.enqueue(host, h, b"p", [], "peer-x")  # type: ignore[arg-type]
    assert [item[0] for item in host.posted] == [("k", "ep", *REST), ("k", "ep", *REST, TRACE)]


def _frame(kind: int, flags: int, seq: int, header: bytes, payload: bytes = b"x") -> bytes:
    return b"".join(bytes(p) for p in W.encode_message(kind, flags, seq, header, payload, []))


async def _send_and_read(address: str, data: bytes, wait: float) -> tuple[bytes, bool]:
    """Send ``data`` on a connection of its own; what came back, and whether
    the proc hung up within ``wait`` seconds."""
    stream = await registry().transport(address.split("://", 1)[0]).connect(address)
    got = bytearray()
    closed = False
    try:
        await stream.send_all(data)
        with trio.move_on_after(wait):
            while True:
                try:
                    chunk = await stream.receive_some(65536)
                except ConnectionClosed:
                    chunk = b""
                if not chunk:
                    closed = True
                    break
                got += chunk
    finally:
        await stream.aclose()
    return bytes(got), closed


def test_a_malformed_actor_header_drops_its_connection_and_the_proc_keeps_serving(meshes: list) -> None:
    pm = this_host().spawn_procs(name=fresh("hdr"))
    meshes.append(pm)
    echo = pm.spawn(fresh("echo"), Echo)
    assert echo.echo.call_one(1).get(timeout=T) == 1
    _proc_id, address = pm._slots[0].ref()
    key = echo._key
    bad: dict[str, tuple[int, bytes]] = {
        "actor-here-two-fields": (0, marshal.dumps((key, "echo"))),  # ActorHost.enqueue
        "actor-here-method-not-str": (0, marshal.dumps((key, 7, *REST))),
        "actor-here-eleven-fields-traced": (0, marshal.dumps((key, "echo", *REST, TRACE, 1))),
        "no-such-actor-two-fields": (0, marshal.dumps(("no-such-actor", "echo"))),  # ProcAgent.no_such_actor
        "key-not-str": (0, marshal.dumps((5, "echo", *REST))),  # the kernel's own check
    }

    def hello() -> bytes:
        return W.encode_handshake({"proc": "intruder", "session": f"s-{uuid.uuid4().hex}", "address": ""})

    for name, (flags, header) in bad.items():
        reply, closed = trio.run(_send_and_read, address, hello() + _frame(W.K_ACTOR, flags, 1, header), T)
        assert closed, f"{name}: the proc kept the connection open"
        assert reply.startswith(W.MAGIC), name  # its handshake answer, then nothing
        assert W.FIXED.pack(W.K_ACK, 0, 0, 0, 0, 1) not in reply, f"{name}: the message was acknowledged"
    # a header of the right shape for an actor the proc does not run is held, not refused: the connection stays
    good = _frame(W.K_ACTOR, 0, 1, marshal.dumps(("no-such-actor", "echo", *REST)))
    reply, closed = trio.run(_send_and_read, address, hello() + good, 1.0)
    assert not closed and W.FIXED.pack(W.K_ACK, 0, 0, 0, 0, 1) in reply
    assert echo.echo.call_one(2).get(timeout=T) == 2
