"""Pipelined ``call_one`` to one actor while its connections are broken, from
the client's end and from the proc's end, on ``ipc`` and ``tcp``: the actor
runs every call exactly once and in order, and every reply is right.

Real processes: a client interpreter spawns one proc with ``this_host()``;
a thread in the client and a thread in the proc (the ``ProcBreaker`` actor)
each shut down a random live session socket of their process every 5-50 ms
on a seeded schedule.
"""

from __future__ import annotations

import pytest

from _helpers.transport import run_client

CALLS = 20_000

CLIENT = """
import json, threading
from monarch_core.actor import enable_transport, this_host
from monarch_core._actor import _state
from transport_actors import ProcBreaker, SeqRecorder, break_sessions_forever
enable_transport({transport!r})
pm = this_host().spawn_procs(per_host={{"gpus": 1}})
rec = pm.spawn("rec", SeqRecorder)
brk = pm.spawn("brk", ProcBreaker)
rec.record.call_one(-1).get(timeout=60)  # sessions up both ways before the breaks
stop = threading.Event()
t = threading.Thread(target=break_sessions_forever, args=(_state.runtime().kernel, {seed}, stop), daemon=True)
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
    seen = out["seen"][1:]
    dups = len(seen) - len(set(seen))
    inversions = sum(1 for x, y in zip(seen, seen[1:]) if y < x)
    lost = len(set(range(CALLS)) - set(seen))
    assert (dups, inversions, lost) == (0, 0, 0), f"{dups} duplicate runs, {inversions} inversions, {lost} lost"
    assert seen == list(range(CALLS))
    assert out["replies_ok"]
