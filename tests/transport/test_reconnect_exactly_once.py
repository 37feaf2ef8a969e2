"""Pipelined ``call_one`` to one actor while its connections are broken, from
the client's end and from the proc's end, on ``ipc``, ``tcp`` and ``tls``:
the actor runs every call exactly once and in order, and every reply is right.

Real processes: a client interpreter spawns one proc with ``this_host()``.
On ipc and tcp, a thread in the client and a thread in the proc (the
``ProcBreaker`` actor) each shut down a random live session socket of their
process every 5-50 ms on a seeded schedule.  TLS sockets are not reachable
that way (the kernel never sees them raw), so on tls a thread resets the
connections to the proc's and the client's ports from outside with ``ss -K``
(root only), which both ends see as ECONNRESET.
"""

from __future__ import annotations

import os
import shutil

import pytest

from _helpers.transport import run_client, tls_env

CALLS = 20_000


def _assert_ran_exactly_once_in_order(out: dict, calls: int) -> None:
    """The actor ran calls 0..calls-1 once each, in order (after the warm-up
    call), and every reply was right."""
    seen = out["seen"][1:]
    dups = len(seen) - len(set(seen))
    inversions = sum(1 for x, y in zip(seen, seen[1:]) if y < x)
    lost = len(set(range(calls)) - set(seen))
    assert (dups, inversions, lost) == (0, 0, 0), f"{dups} duplicate runs, {inversions} inversions, {lost} lost"
    assert seen == list(range(calls))
    assert out["replies_ok"]

CLIENT = """
import json, threading
from monarch_core.actor import enable_transport, this_host
from monarch_core._proc import _state
from transport_actors import ProcBreaker, SeqRecorder, break_sessions_forever
enable_transport({transport!r})
pm = this_host().spawn_procs(per_host={{"gpus": 1}})
rec = pm.spawn("rec", SeqRecorder)
brk = pm.spawn("brk", ProcBreaker)
rec.record.call_one(-1).get(timeout=60)  # sessions up both ways before the breaks
stop = threading.Event()
t = threading.Thread(target=break_sessions_forever, args=(_state.current().kernel, {seed}, stop), daemon=True)
brk.begin.call_one({seed} + 1000).get(timeout=60)
t.start()
futs = [rec.record.call_one(i) for i in range({calls})]
replies = [f.get(timeout=120) for f in futs]
stop.set()
t.join(10)
brk.end.call_one().get(timeout=60)
seen = rec.report.call_one().get(timeout=60)
pm.stop().get(timeout=60)
print(json.dumps({{"seen": seen, "replies_ok": replies == [2 * i for i in range({calls})]}}))
"""


@pytest.mark.parametrize("transport", ["ipc", "tcp://127.0.0.1:0"], ids=["ipc", "tcp"])
@pytest.mark.parametrize("seed", [5, 6])
def test_pipelined_calls_run_exactly_once_in_order_while_both_ends_break_connections(transport: str, seed: int) -> None:
    out = run_client(CLIENT.format(transport=transport, seed=seed, calls=CALLS), timeout=300)
    _assert_ran_exactly_once_in_order(out, CALLS)


TLS_CLIENT = """
import json, threading
from monarch_core.actor import enable_transport, this_host
from monarch_core._proc import _state
from transport_actors import SeqRecorder, reset_connections_forever
enable_transport("tls://127.0.0.1:0")
pm = this_host().spawn_procs(per_host={{"gpus": 1}})
rec = pm.spawn("rec", SeqRecorder)
rec.record.call_one(-1).get(timeout=60)  # sessions up both ways before the breaks
k = _state.current().kernel
ports = [int(a.rsplit(":", 1)[1]) for a in (k.address, *[a for p, a in k._addresses.items() if p != k.proc_id])]
stop = threading.Event()
resets = []
t = threading.Thread(target=reset_connections_forever, args=(ports, {seed}, stop, resets), daemon=True)
t.start()
import time
n, ok, deadline = 0, True, time.monotonic() + 60
while (sum(resets) < 20 or n < {calls}) and time.monotonic() < deadline:  # rounds until enough resets hit
    futs = [rec.record.call_one(i) for i in range(n, n + 2000)]
    ok = ok and [f.get(timeout=120) for f in futs] == [2 * i for i in range(n, n + 2000)]
    n += 2000
stop.set()
t.join(10)
seen = rec.report.call_one().get(timeout=60)
pm.stop().get(timeout=60)
print(json.dumps({{"seen": seen, "n": n, "replies_ok": ok, "ports": ports, "resets": sum(resets)}}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ss") is None, reason="resetting connections needs root and ss")
@pytest.mark.parametrize("seed", [7])
def test_pipelined_calls_run_exactly_once_in_order_while_tls_connections_are_reset(pki, seed: int) -> None:  # type: ignore[no-untyped-def]
    out = run_client(TLS_CLIENT.format(seed=seed, calls=10_000), env=tls_env(pki.client), timeout=300)
    calls = out["n"]
    assert len(out["ports"]) >= 2, out["ports"]  # the client's and the proc's
    assert out["resets"] >= 10, f"only {out['resets']} connections were reset: the test tested little"
    _assert_ran_exactly_once_in_order(out, calls)
