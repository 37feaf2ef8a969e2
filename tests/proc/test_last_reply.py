"""A proc that answers and then ends: its answer resolves the call, whichever
the client learns of first.  The client hears of a local proc's end from its
child watch and reads its replies on the poller thread; a stopping proc
that sent its last reply just before it exited could lose that race, and
the call then failed with ``SupervisionError`` although it was answered
(the debugger's release test saw it under load).  The exit is now reported
once the proc's connections were read to their end."""

from __future__ import annotations

from _helpers.clients import describe

PROGRAM = r"""
import os
import threading
import time

from monarch_core.actor import Actor, endpoint, this_host
from monarch_core._kernel import _inbound


class Slow(Actor):
    @endpoint
    def answer(self) -> int:
        time.sleep(0.5)  # still running when its proc is asked to stop
        return 42

    @endpoint
    def pid(self) -> int:
        return os.getpid()


pm = this_host().spawn_procs(per_host={"p": 1})
a = pm.spawn("slow", Slow)
pid = a.pid.call_one().get(timeout=60)
proc_id = pm._slots[0].proc_id

# From now on, the client reads nothing of that proc's connections until the
# proc has exited and its end had time to reach the child watch: its last
# reply then waits, unread, in the socket.
held = threading.Event()
read = _inbound.InboundSession.on_readable


def gone(p: int) -> bool:
    try:
        os.kill(p, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie (its parent has not reaped it yet) has ended too
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def on_readable(self, poller):
    if self.sender == proc_id and not held.is_set():
        deadline = time.monotonic() + 30
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # the child watch hears of the exit meanwhile
        held.set()
    return read(self, poller)


_inbound.InboundSession.on_readable = on_readable
fut = a.answer.call_one()
time.sleep(0.1)  # the call is running
pm.stop().get(timeout=60)
try:
    print("outcome", fut.get(timeout=30), flush=True)
except Exception as e:
    print("outcome", type(e).__name__, e, flush=True)
print("held", held.is_set(), flush=True)
"""


def test_a_reply_sent_just_before_the_proc_ended_resolves_the_call(client_script) -> None:
    res = client_script(PROGRAM, timeout=120)
    assert res.returncode == 0, describe(res)
    assert "outcome 42" in res.stdout, describe(res)
    assert "held True" in res.stdout, describe(res)  # the reply really waited unread until after the exit
