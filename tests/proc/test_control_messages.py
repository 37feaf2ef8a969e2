"""A proc drops malformed control messages (wrong field count, wrong field
types, unknown op) and keeps serving: its heartbeat answer and its actors
work after a burst of them.  Sends real ``K_CONTROL`` frames from the client's
kernel to a spawned proc (internals, hence here and not in ``tests/api``)."""

from __future__ import annotations

import marshal

from monarch_core._proc._port import OneReply
from monarch_core._proc import _control as C
from monarch_core._kernel import _wire as W
from monarch_core.actor import Actor, endpoint, this_host

from _helpers import T, client_runtime, fresh

BAD = [
    ("no_such_op", 1, 2),
    ("ping",),
    ("ping", ("p", 12345, 1)),
    ("ping", ("p", "a", 1), "extra"),
    ("spawn", "k", "m", "0", (), (), None, "C", None),
    ("stop_proc", "now", "soon"),
    ("stop_actor", 5, None, "r"),
    ("init", "not a port"),
    ("proc_died", "p", 3.5, True),
    ("host_spawn",),  # a worker-loop op: unknown to a proc
    ("host_shutdown", "x"),
    ("controller", 1, 2),
    ("register_owner", "p", ("p",)),
]


class Echo(Actor):
    @endpoint
    def echo(self, x: int) -> int:
        return x


def test_malformed_control_messages_are_dropped_and_the_proc_keeps_serving(meshes: list) -> None:
    pm = this_host().spawn_procs(name=fresh("ctl"))
    meshes.append(pm)
    echo = pm.spawn(fresh("echo"), Echo)
    assert echo.echo.call_one(1).get(timeout=T) == 1
    rt = client_runtime()
    kernel = rt.kernel
    proc_id, address = pm._slots[0].ref()
    for h in BAD:
        kernel.send(proc_id, address, W.K_CONTROL, 0, marshal.dumps(h), b"", [])
    r = OneReply(kernel, "ping")
    r.proc_id = proc_id
    kernel.send(proc_id, address, W.K_CONTROL, 0, C.encode(C.Ping((rt.proc_id, kernel.address, r.port_id))), b"", [],
                r.port_id)
    assert r.cell.wait(T), "the proc did not answer a ping after the malformed control messages"
    assert r.cell.result() == proc_id
    assert echo.echo.call_one(2).get(timeout=T) == 2
    assert proc_id not in kernel.dead
