"""Heartbeats to many peers are spread over rounds: a parent pings at most
``PINGS_PER_S`` of its child procs (and, apart, of its worker loops) a
second, each peer at least four times per timeout (in rounds its name's
hash places it in), and checks every
peer's silence every round.  Idle, 256 hosts cost the client 2 % of a core
in pings alone when each was pinged every round (docs/performance.md)."""

from __future__ import annotations

import json
import math

import pytest

from _helpers.clients import describe
from monarch_core._proc import _watch
from monarch_core._proc._watch import PINGS_PER_S, ping_due, ping_every


@pytest.mark.parametrize(
    ("peers", "limit", "interval", "every"),
    [
        (0, 30.0, 2.0, 1),
        (64, 30.0, 2.0, 1),  # 32 a second: every round
        (65, 30.0, 2.0, 2),
        (128, 30.0, 2.0, 2),
        (256, 30.0, 2.0, 3),  # 4 would keep it to 32 a second, but 4 rounds do not fit 4 times in 30 s
        (256, 3.0, 0.5, 1),  # a short timeout: every round, whatever the count
        (10_000, 30.0, 0.5, 15),  # 30 s / (4 x 0.5 s)
        (500, 30.0, 0.0, 1),  # heartbeats off
    ],
)
def test_how_many_rounds_each_peer_waits_for_its_ping(peers: int, limit: float, interval: float, every: int) -> None:
    assert ping_every(peers, limit, interval) == every


def test_each_peer_is_pinged_once_in_every_span_of_its_rounds_and_the_rate_stays_bounded() -> None:
    for peers in (1, 64, 65, 200, 256, 1000):
        k = ping_every(peers, 30.0, 2.0)
        names = [f"procs0{{'gpus': {i}/{peers}}}-{i:08x}" for i in range(peers)]
        rounds = range(1, 4 * k + 1)
        per_round = [sum(ping_due(n, r, k) for n in names) for r in rounds]
        assert sum(per_round) == peers * 4  # each exactly once in every k rounds
        assert max(per_round) <= 2 * math.ceil(peers / k)  # spread over the rounds (hashes, not exact)
        for n in names:
            pinged = [r for r in rounds if ping_due(n, r, k)]
            assert [b - a for a, b in zip(pinged, pinged[1:])] == [k] * (len(pinged) - 1)
        cap = int(30.0 / (4 * 2.0))  # rounds that fit four times in the 30 s limit
        assert k <= max(1, cap)
        if k < cap:  # not held back by the limit: within the rate
            assert peers / (k * 2.0) <= PINGS_PER_S


PROGRAM = r"""
import json, time
from monarch_core.actor import Actor, endpoint, this_host

def count_pings() -> None:  # (in each proc) how many heartbeats reach it
    from monarch_core._proc import _watch
    on_ping = _watch.ProcWatch.on_ping
    _watch.PINGED = 0

    def counted(self, *args):
        _watch.PINGED += 1
        return on_ping(self, *args)

    _watch.ProcWatch.on_ping = counted

class A(Actor):
    @endpoint
    def pings(self) -> int:
        from monarch_core._proc import _watch
        return _watch.PINGED

pm = this_host().spawn_procs(per_host={"p": 20}, bootstrap=count_pings)
a = pm.spawn("a", A)
before = a.pings.call().get(timeout=120).values()
time.sleep(4.0)
after = a.pings.call().get(timeout=120).values()
print("PINGS", json.dumps([y - x for x, y in zip(before, after)]), flush=True)
pm.stop().get(timeout=120)
"""


def test_twenty_procs_at_a_fifth_of_a_second_are_each_pinged_every_fourth_round(client_script) -> None:
    # 20 children, a 0.2 s interval: 32 a second allows 6.4 a round, so each is pinged every 4 rounds
    # (0.8 s); every round would be 20 pings in 4 s per proc
    assert ping_every(20, _watch.HEARTBEAT_TIMEOUT, 0.2) == 4
    res = client_script(PROGRAM, env={"MONARCH_HEARTBEAT_INTERVAL": "0.2"}, timeout=180)
    assert res.returncode == 0, describe(res)
    got = json.loads(res.stdout.split("PINGS ", 1)[1].splitlines()[0])
    assert len(got) == 20, describe(res)
    assert all(2 <= n <= 8 for n in got), (got, describe(res))  # ~5 each (4 s / 0.8 s), not ~20
    assert "hung" not in res.stderr, describe(res)
