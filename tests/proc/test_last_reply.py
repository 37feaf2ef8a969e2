"""A proc that answers and then ends: its answer resolves the call, whichever
the client learns of first.  The client hears of a local proc's end from its
child watch and reads its replies on the poller thread; a stopping proc
that sent its last reply just before it exited could lose that race, and
the call then failed with ``SupervisionError`` although it was answered
(the debugger's release test saw it under load).  The exit is now reported
once the proc's connections were read to their end.

And a proc that answered for its ranks and then ended does not fail a call
whose other ranks are still working: a ``call()`` to two procs being
stopped, where one answers at once (its proc then ends) and the other a
second later, returns both answers (the debugger's release test saw this
fail under load, when one rank's proc ended before the other rank's reply
came)."""

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


TWO_RANKS = r"""
import time

from monarch_core.actor import Actor, current_rank, endpoint, this_host


class Staggered(Actor):
    @endpoint
    def answer(self, delays: list) -> int:
        rank = current_rank().rank
        time.sleep(delays[rank])
        return rank


pm = this_host().spawn_procs(per_host={"p": 2})
a = pm.spawn("staggered", Staggered)
a.answer.call([0, 0]).get(timeout=60)  # both constructed
call = a.answer.call([0.0, 1.5])
stream = a.answer.stream([0.0, 1.5])
time.sleep(0.2)  # rank 0 answered both; rank 1 is still sleeping
pm.stop().get(timeout=60)  # rank 0's proc ends at once, rank 1's once it has answered
try:
    print("call", sorted(call.get(timeout=30).values()), flush=True)
except Exception as e:
    print("call", type(e).__name__, e, flush=True)
try:
    print("stream", sorted(f.get(timeout=30) for f in stream), flush=True)
except Exception as e:
    print("stream", type(e).__name__, e, flush=True)
"""


def test_a_proc_that_answered_and_ended_does_not_fail_the_call_to_the_others(client_script) -> None:
    res = client_script(TWO_RANKS, timeout=120)
    assert res.returncode == 0, describe(res)
    assert "call [0, 1]" in res.stdout, describe(res)
    assert "stream [0, 1]" in res.stdout, describe(res)
