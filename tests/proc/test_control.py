"""Control messages (``monarch_core._proc._control``): every one round-trips through
its wire form, a malformed one is refused by ``decode`` and dropped (with a
warning) by the agent, and no module builds a control header by hand."""

from __future__ import annotations

import logging
import marshal
import pathlib
import types
from typing import Any

import pytest

from monarch_core._proc import _control as C
from monarch_core.errors import ProtocolError

pytestmark = pytest.mark.unit

REF = ("proc-1", "ipc:///tmp/x", 7)

SAMPLES: list[Any] = [
    C.Spawn("key-1", "mesh", 3, ("hosts", "gpus"), (2, 4), REF, "Counter", ("client", "ipc:///tmp/c", "")),
    C.Spawn("key-2", "ctl", 0, (), (), None, "controller", None),
    C.Spawn("key-3", "mesh", 0, (), (), REF, "Counter", None, bytes(range(24))),  # a traced spawn
    C.StopActor("key-1", REF, "stopped by its owner"),
    C.StopActor("key-1", None, "why"),
    C.Init(REF, 5),
    C.StopProc("stopped by client", 1.5),
    C.Controller("ctl", REF),
    C.Supervise(),
    C.RegisterOwner("proc-2", ("client", "ipc:///tmp/c")),
    C.ProcStopping("proc-2"),
    C.ProcDied("proc-2", "killed by SIGKILL", False),
    C.Ping(REF),
    C.Ping(("proc-1", None, 7)),
    C.Telemetry(),
    C.TelemetryFlush(REF),
    C.LogOption(REF, True, 20),
    C.Reload(REF, ("/w/pkg/mod.py",)),
    C.HostHello(REF),
    C.HostSpawn(),
    C.ChildHello("proc-3", "tcp://127.0.0.1:4000"),
    C.HostKill(("proc-3", "proc-4"), "terminate"),
    C.HostShutdown(),
]


def test_every_message_type_has_a_sample_and_a_docstring() -> None:
    assert {type(m) for m in SAMPLES} == set(C.OP)
    for cls, op in C.OP.items():
        assert cls.__doc__ and "\n" not in cls.__doc__.strip(), cls
        assert C.op_type(op) is cls


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: Any) -> None:
    data = C.encode(msg)
    h = marshal.loads(data)
    assert h == (C.OP[type(msg)], *msg)  # the op name first, then the fields in order
    assert C.decode(h) == msg
    assert type(C.decode(h)) is type(msg)


def test_the_wire_form_is_the_tuple_it_always_was() -> None:
    # (compared decoded: marshal's bytes differ in reference flags between equal tuples)
    for msg, h in [
        (C.StopProc("r", 2.0), ("stop_proc", "r", 2.0)),
        (C.HostKill(["p"], "kill"), ("host_kill", ["p"], "kill")),  # a list, as the sender has always sent
        (C.HostShutdown(), ("host_shutdown",)),
        (C.Ping(REF), ("ping", REF)),
    ]:
        got = marshal.loads(C.encode(msg))
        assert got == h and type(got) is tuple and [type(x) for x in got] == [type(x) for x in h]


def test_decode_normalizes_what_the_receivers_normalized() -> None:
    m = C.decode(("spawn", "k", "m", 0, ["a"], [2], list(REF), "C", ["p", "a", ""], None))
    assert m.labels == ("a",) and m.sizes == (2,) and m.init_reply == REF and m.owner == ("p", "a", "")
    assert C.decode(("stop_actor", "k", (), "r")).reply is None  # an empty reply is none
    assert C.decode(("stop_proc", "r", 3)).grace == 3.0 and type(C.decode(("stop_proc", "r", 3)).grace) is float
    assert C.decode(("proc_died", "p", "r", 1)).stopped is True
    assert C.decode(("host_kill", ["a", "b"], "kill")).proc_ids == ("a", "b")


MALFORMED = [
    ("no_such_op",),
    (17, "x"),
    (),
    ["ping", REF],
    ("ping",),
    ("ping", REF, "extra"),
    ("ping", ("p", 12345, 1)),  # an address that is not a str
    ("ping", ("p", "a", "1")),  # a port id that is not an int
    ("ping", ("p", "a")),
    ("ping", "p"),
    ("spawn", "k", "m", "0", (), (), REF, "C", None, None),
    ("spawn", "k", "m", 0, ("a",), ("2",), REF, "C", None, None),
    ("spawn", "k", "m", 0, (), (), REF, "C", ("p", "a"), None),
    ("spawn", "k", "m", 0, (), (), REF, "C", None, b"short"),  # a trace context is 24 bytes
    ("spawn", "k", "m", 0, (), (), REF, "C", None, "x" * 24),
    ("spawn", "k", "m", 0, (), (), REF, "C", None),  # the field count of a spawn without its trace
    ("stop_proc", "r", "soon"),
    ("stop_proc", "r", True),
    ("init", REF, 1.0),
    ("proc_died", "p", "r", "yes"),
    ("register_owner", "p", ("p",)),
    ("child_hello", "p", None),
    ("host_kill", "p", "kill"),
    ("host_kill", [1], "kill"),
    ("host_spawn", "x"),
    ("supervise", None),
]


@pytest.mark.parametrize("h", MALFORMED, ids=repr)
def test_decode_refuses_a_malformed_message(h: Any) -> None:
    with pytest.raises(ProtocolError):
        C.decode(h)


def _fake_kernel() -> Any:
    from monarch_core._kernel._events import EventBus

    return types.SimpleNamespace(events=EventBus(("proc_failed",)), proc_id="test-proc")


def test_every_message_has_a_receiver() -> None:
    from monarch_core._proc._agent import ProcAgent
    from monarch_core._launch._worker import WorkerLoopAgent

    proc = set(ProcAgent(_fake_kernel()).control_handlers())
    host = set(WorkerLoopAgent(_fake_kernel()).control_handlers())
    assert proc < host and host == set(C.OP)
    assert {C.HostHello, C.HostSpawn, C.ChildHello, C.HostKill, C.HostShutdown} == host - proc


def test_the_agent_dispatches_by_type_and_drops_malformed_messages_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from monarch_core._proc._agent import ProcAgent

    agent = ProcAgent(_fake_kernel())
    got: list = []
    agent._control[C.Ping] = lambda m, p, b, s: got.append((m, s))
    with caplog.at_level(logging.WARNING, logger="monarch.proc"):
        for h in [("no_such_op",), ("host_spawn",), ("ping",), ("ping", REF, 1), ("ping", ("p", 1, 1)),
                  ("spawn", "k"), ("stop_proc", "r", "soon")]:
            agent.handle_control(h, b"", [], "peer-x")
        agent.handle_control(("ping", list(REF)), b"", [], "peer-y")
    assert got == [(C.Ping(REF), "peer-y")]
    texts = [r.getMessage() for r in caplog.records if r.name == "monarch.proc"]
    assert texts[:2] == ["unknown control op 'no_such_op' from peer-x", "unknown control op 'host_spawn' from peer-x"]
    assert len(texts) == 7 and all(t.startswith("malformed control message ") for t in texts[2:]), texts
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "monarch.proc")


def test_no_control_header_is_built_by_hand() -> None:
    root = pathlib.Path(C.__file__).resolve().parents[1]
    hits = [f"{p.relative_to(root)}:{i}" for p in sorted(root.rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if 'marshal.dumps(("' in line]
    assert hits == [], "control messages are built with _proc._control.encode, not tuple literals"
