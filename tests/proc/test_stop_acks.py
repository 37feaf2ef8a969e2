"""Stopping procs right after a burst of broadcasts: the procs acknowledge
what they handled before they end, so nothing comes back as undeliverable
(a failure for the fault hook).  Waits on the kernel's record of ended procs
(``kernel.dead``, ``ProcMesh._slots``): internals, hence here and not in
``tests/api``."""

from __future__ import annotations

import threading

from monarch_core.actor import Actor, endpoint, this_host

from _helpers import client_runtime, fresh, poll_until
from _helpers.clients import describe


class Sink(Actor):
    @endpoint
    def noop(self) -> None:
        return None


def _settle_stopped(pm) -> None:  # type: ignore[no-untyped-def]
    """Wait until this process has seen the procs of ``pm`` end, and has run
    the fault hook for anything that ending returned as undeliverable."""
    kernel = client_runtime().kernel
    procs = [slot.proc_id for slot in pm._slots]
    poll_until(lambda: all(p in kernel.dead for p in procs), 30, what="the stopped procs' ends")

    async def barrier() -> None:
        return None

    for _ in range(2):  # what their end set off on the loop has run
        kernel.run(barrier)
    for t in threading.enumerate():  # and so has any fault hook it started
        if t.name == "monarch-fault-hook":
            t.join(30)


def test_stopping_procs_right_after_a_burst_of_broadcasts_is_not_a_failure(faults) -> None:
    # Acknowledgements of small messages are lazy; a proc that stops must
    # acknowledge what it handled, or its sender counts it as undeliverable.
    before = len(faults.failures)
    for _round in range(3):
        pm = this_host().spawn_procs(per_host={"p": 4})
        mesh = pm.spawn(fresh("sink"), Sink)
        mesh.noop.call().get(timeout=30)
        for _ in range(200):
            mesh.noop.broadcast()
        mesh.noop.call().get(timeout=30)
        pm.stop().get(timeout=60)
        _settle_stopped(pm)
    assert faults.failures[before:] == []


STOP_AFTER_BROADCASTS_CLIENT = """
from monarch_core.actor import Actor, endpoint, this_host

class Sink(Actor):
    @endpoint
    def noop(self) -> None:
        return None

for _round in range(3):
    pm = this_host().spawn_procs(per_host={"p": 4})
    mesh = pm.spawn("sink", Sink)
    mesh.noop.call().get(timeout=30)
    for _ in range(200):
        mesh.noop.broadcast()
    mesh.noop.call().get(timeout=30)
    pm.stop().get(timeout=60)
    # wait until the procs' ends are seen and what they set off has run
    import threading, time
    from monarch_core._proc import _state
    kernel = _state.current().kernel
    deadline = time.monotonic() + 30
    while not all(slot.proc_id in kernel.dead for slot in pm._slots):
        assert time.monotonic() < deadline, "the stopped procs were never seen to end"
        time.sleep(0.01)
    async def barrier():
        return None
    for _ in range(2):
        kernel.run(barrier)
    for t in threading.enumerate():
        if t.name == "monarch-fault-hook":
            t.join(30)
print("CLEAN", flush=True)
"""


def test_stopping_right_after_broadcasts_is_not_a_failure_on_the_loop_read_path_either(client_script) -> None:
    # Same as above with every session read by the trio loop (as TLS sessions are):
    # the default fault hook would end this client with exit code 1.
    r = client_script(STOP_AFTER_BROADCASTS_CLIENT, env={"MONARCH_THREADED_INBOUND": "0"}, timeout=120)
    assert r.returncode == 0 and "CLEAN" in r.stdout, describe(r)
    assert "could not be delivered" not in r.stderr, r.stderr
