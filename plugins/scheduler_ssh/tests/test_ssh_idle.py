"""An SSH mesh outlives its quiet periods: three hosts kept idle (not one
message), then busy (a call working that long on every host), each for
several times every timeout silence could trip -- the channel's
``io_timeout``, the keepalives (interval x count), the procs' heartbeats and
the delivery timeout, all shortened here -- answer every call afterwards,
with no host lost and no ``MeshFailure``.

(The SSH channel once kept the read timeout ``_send`` set on it: after
``io_timeout`` of silence the stdout pump took the timed-out read for end of
file and reported every host lost -- 65 s after bring-up with the defaults.)
"""

from __future__ import annotations

from pathlib import Path

import ssh_helpers as H
from _helpers.testbed import SshTestbed

#: the timeouts silence could trip, shortened (seconds), and how long the mesh stays quiet: several times the largest
IO_TIMEOUT = 1
KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 1, 4
SETTINGS = {"MONARCH_HEARTBEAT_INTERVAL": "1", "MONARCH_HEARTBEAT_TIMEOUT": "4", "MONARCH_DELIVERY_TIMEOUT": "4"}
QUIET = 16.0

PRELUDE = r'''
import socket, threading, time
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint, hosts_from_config

failures = []
api.unhandled_fault_hook = failures.append

class Worker(Actor):
    @endpoint
    def where(self):
        return socket.gethostname()

    @endpoint
    def busy(self, seconds):
        end, nxt, x = time.monotonic() + seconds, 0.0, 0
        while (now := time.monotonic()) < end:  # computing, and printing twice a second
            x = (x * 31 + 7) % 1000003
            if now >= nxt:
                print("busy", flush=True)
                nxt = now + 0.5
        return socket.gethostname()

def state():
    return {"failures": [f.report() for f in failures], "table": hm.to_table()}
'''


def _entry(tag: str, d: Path) -> dict:
    e = H.entry(tag, d, hosts=["h1", "h2", "h3"], io_timeout=IO_TIMEOUT, keepalive_interval=KEEPALIVE_INTERVAL,
                keepalive_count=KEEPALIVE_COUNT)
    e["env"] = {**e["env"], **SETTINGS}  # the worker loops and their procs use them too
    return e


def test_an_ssh_mesh_kept_idle_then_busy_far_past_every_timeout_still_answers(sshd: SshTestbed, tmp_path: Path) -> None:
    assert QUIET >= 4 * max(IO_TIMEOUT, KEEPALIVE_INTERVAL * KEEPALIVE_COUNT, *map(float, SETTINGS.values()))
    tag = H.new_tag()
    H.write_config(tmp_path, {"lab": _entry(tag, tmp_path)})
    c = H.Client(PRELUDE, cwd=tmp_path, env={"MONARCH_CONFIG": str(tmp_path / "monarch.toml"), **SETTINGS})
    try:
        c.run("hm = hosts_from_config('lab', timeout=90)\n"
              "w = hm.spawn_procs(per_host={'gpus': 1}).spawn('w', Worker)\n"
              "result = w.where.call().get(timeout=120).values()")
        # idle: nothing at all goes to the hosts for QUIET seconds
        c.run(f"time.sleep({QUIET})", timeout=QUIET + 60)
        got = c.request("result = w.where.call().get(timeout=60).values()", timeout=120)
        assert got.get("ok") == ["h1", "h2", "h3"], f"after {QUIET:g}s idle: {got}\n{c.run('result = state()')}"
        st = c.run("result = state()")
        assert not st["failures"] and "LOST" not in st["table"], st
        # busy: every host works (and prints) for QUIET seconds inside one call
        got = c.request(f"result = w.busy.call({QUIET}).get(timeout={QUIET + 60}).values()", timeout=QUIET + 120)
        assert got.get("ok") == ["h1", "h2", "h3"], f"a call busy for {QUIET:g}s: {got}\n{c.run('result = state()')}"
        got = c.request("result = w.where.call().get(timeout=60).values()", timeout=120)
        assert got.get("ok") == ["h1", "h2", "h3"], f"after {QUIET:g}s busy: {got}"
        st = c.run("result = state()")
        assert not st["failures"] and "LOST" not in st["table"], st
        c.run("hm.shutdown().get(timeout=60)")
        H.wait_tagged_gone(tag, (1, 2, 3), timeout=30)
    finally:
        c.kill()
