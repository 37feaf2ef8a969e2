"""A lost proc that held many actor meshes ends an unhandling client with
one full report, and the other meshes' failures summed up -- not a report
per mesh (a proc holding 2,900 meshes printed 2,900)."""

from __future__ import annotations

import re

CLIENT = r"""
import logging, os, re, signal, threading, time
from monarch_core.actor import Actor, endpoint, this_host

summed, done = [0], threading.Event()

class Count(logging.Handler):
    def emit(self, record):
        m = re.match(r"(\d+) more actor mesh", record.getMessage())
        if m:
            summed[0] += int(m.group(1))
            if summed[0] >= 29:
                done.set()

# (a handler anywhere replaces logging's last-resort stderr output: print there too)
logging.getLogger("monarch.supervision").addHandler(Count())
logging.getLogger("monarch.supervision").addHandler(logging.StreamHandler())

class A(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

procs = this_host().spawn_procs(per_host={"p": 1})
meshes = [procs.spawn(f"m{i}", A) for i in range(30)]
pids = {m.pid.call_one().get(timeout=60) for m in meshes}
assert len(pids) == 1
os.kill(pids.pop(), signal.SIGKILL)
try:
    time.sleep(60)  # ended by the unhandled failure
except KeyboardInterrupt:
    # a program still at work (a finally block) while the other meshes' failures arrive; those that
    # have not arrived by then are summed up as the client ends (one run in three under load: the wait
    # is bounded short, so that such a run stays well within the test's budget)
    done.wait(15)
    raise
"""


def test_a_lost_proc_with_many_meshes_is_reported_once_and_summed_up(client_script) -> None:
    res = client_script(CLIENT, timeout=180)
    err = res.stderr
    assert res.returncode == 1, err[-3000:]
    assert err.count("unhandled supervision failure") == 1, err[-3000:]
    counts = [int(n) for n in re.findall(r"(\d+) more actor mesh\(es\) failed while the client was ending", err)]
    assert sum(counts) == 29, err[-3000:]
    assert "'m1'" in err or "'m29'" in err, err[-3000:]  # the summary names them (ten, then a count)
