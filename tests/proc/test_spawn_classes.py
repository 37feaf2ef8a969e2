"""An actor's class reaches its proc once per definition: a class pickled by
value (defined in ``__main__``) is unpickled once per proc and then shared by
the meshes spawned from it, as an importable class is -- while each spawn
still carries the class and the globals its methods read as they are when it
is called (``_serial.dumps_spawn`` / ``loads_spawn``)."""

from __future__ import annotations

from typing import Any

import pytest

from _helpers.clients import describe
from monarch_core._proc import _serial

pytestmark = pytest.mark.timeout(180)


def test_meshes_of_one_main_class_share_it_on_a_proc(client_script: Any) -> None:
    # Rebuilding the class at each spawn reset its attributes under the
    # actors already running (cloudpickle reuses the class object and sets
    # its state again): m1's count went back to 0 when m2 was spawned.
    res = client_script("""
        from monarch_core.actor import Actor, endpoint, this_host

        LABEL = "first"

        class Counter(Actor):
            count = 0

            @endpoint
            def bump(self) -> int:
                type(self).count += 1
                return type(self).count

            @endpoint
            def seen(self) -> tuple:
                return type(self).count, id(type(self)), LABEL

        pm = this_host().spawn_procs(per_host={"p": 1})
        m1 = pm.spawn("m1", Counter)
        m1.bump.call_one().get(timeout=60)
        m1.bump.call_one().get(timeout=60)
        m2 = pm.spawn("m2", Counter)
        c1, id1, l1 = m1.seen.call_one().get(timeout=60)
        c2, id2, l2 = m2.seen.call_one().get(timeout=60)
        print("SHARED", c1, c2, id1 == id2, l1, l2)
        LABEL = "second"  # a spawn carries the globals as they are now
        m3 = pm.spawn("m3", Counter)
        print("LATER", m3.seen.call_one().get(timeout=60)[2])
        pm.stop().get(timeout=60)
    """, timeout=150)
    assert res.returncode == 0, describe(res)
    assert "SHARED 2 2 True first first" in res.stdout, describe(res)
    assert "LATER second" in res.stdout, describe(res)


def test_the_class_pickle_round_trips_and_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_serial, "CLASS_CACHE", 3)
    monkeypatch.setattr(_serial, "_classes", {})

    def make(i: int) -> type:
        class Local:  # defined in a function: pickled by value, as a class of ``__main__`` is
            n = i

            def __init__(self, x: int, *, y: int = 0) -> None:
                self.total = x + y + Local.n

        return Local

    classes = [make(i) for i in range(5)]
    for i, cls in enumerate(classes):
        got, args, kwargs = _serial.loads_spawn(*_serial.dumps_spawn(cls, (10,), {"y": i}))
        assert got(*args, **kwargs).total == 10 + 2 * i
        assert len(_serial._classes) <= 3
    payload, bufs = _serial.dumps_spawn(classes[4], (1,), {})
    assert _serial.loads_spawn(payload, bufs)[0] is _serial.loads_spawn(payload, bufs)[0]  # unpickled once


def test_a_proc_keeps_reading_after_the_actor_that_read_for_it_stops(client_script: Any) -> None:
    # The first actor of a proc reads the proc's sockets while it is idle;
    # the poller's thread stands by meanwhile.  When that actor stopped, the
    # poller's thread slept out its standby before reading for the others:
    # with the standby made long here, a call to the second actor was never read.
    # The linger is made longer than the machine has been up: "no leader left
    # recently" was once written as time 0, which a machine booted less than a
    # linger ago counts as recent (the CI machines are fresh).
    res = client_script("""
        from monarch_core.actor import Actor, endpoint, this_host

        def long_standby() -> None:
            import time
            from monarch_core._kernel import _poller
            _poller.STANDBY = 600.0
            _poller.LINGER = time.monotonic() + 600.0

        class A(Actor):
            @endpoint
            def ping(self) -> int:
                return 1

        pm = this_host().spawn_procs(per_host={"p": 1}, bootstrap=long_standby)
        first = pm.spawn("first", A)
        first.ping.call_one().get(timeout=60)
        second = pm.spawn("second", A)
        second.ping.call_one().get(timeout=60)
        first.stop().get(timeout=60)
        for _ in range(3):
            print("ANSWERED", second.ping.call_one().get(timeout=20))
        pm.stop().get(timeout=60)
    """, timeout=150)
    assert res.returncode == 0, describe(res)
    assert res.stdout.count("ANSWERED 1") == 3, describe(res)
