"""A stopping proc stops its idle actors without waking their threads
(``ActorHost.stop_if_idle``, used by ``ProcAgent.stop_everything``), and
everything a stop must run still runs: ``__cleanup__``, the message being
handled, the messages already queued.

Waking thousands of idle actor threads one at a time was what stopping a
proc mesh of 20,000 actors cost (each wake-up waits for the GIL); the
contract tested here is which actors may skip it, and that skipping it
loses nothing."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

from monarch_core.actor import Actor, endpoint, this_host
from monarch_core.errors import SupervisionError

from _helpers import T, fresh, poll_until


class Idle(Actor):
    @endpoint
    def ping(self, i: int) -> int:
        return i

    @endpoint
    def stop_sibling(self, sibling_key: str) -> tuple[bool, bool]:
        """Try ``stop_if_idle`` on an idle sibling of this proc, and on this
        actor itself (busy: it is handling this message)."""
        from monarch_core._proc import _state

        me = _state.current_actor.get()
        sibling = me.agent.kernel.actors[sibling_key]
        return sibling.stop_if_idle("the test stopped it"), me.stop_if_idle("the test stopped it")

    @endpoint
    def key(self) -> str:
        from monarch_core._proc import _state

        return _state.current_actor.get().key


class Cleans(Actor):
    def __init__(self, folder: str) -> None:
        self.folder = folder

    @endpoint
    def ping(self) -> int:
        return os.getpid()

    def __cleanup__(self, exc: BaseException | None) -> None:
        Path(self.folder, f"cleaned-{os.getpid()}-{threading.get_ident()}").write_text("yes")


class Slow(Actor):
    @endpoint
    async def work(self, started: str) -> str:
        Path(started).write_text("started")
        await asyncio.sleep(1.0)
        return "done"


def test_an_idle_actor_is_stopped_without_its_thread_and_refuses_later_calls() -> None:
    procs = this_host().spawn_procs(per_host={"p": 1}, name=fresh("stopidle"))
    try:
        a = procs.spawn(fresh("a"), Idle)
        b = procs.spawn(fresh("b"), Idle)
        key = b.key.call_one().get(timeout=T)
        # b replied before its thread was back to waiting: until then it is not idle (nothing changes)
        got = poll_until(lambda: (r := a.stop_sibling.call_one(key).get(timeout=T))[0] and r,
                         what="b idle, stopped by stop_if_idle")
        assert got == (True, False)
        try:
            b.ping.call_one(1).get(timeout=T)
        except SupervisionError as e:
            assert "stopped" in str(e) and "the test stopped it" in str(e)
        else:
            raise AssertionError("a call to an actor stopped by stop_if_idle was answered")
        assert a.ping.call_one(7).get(timeout=T) == 7  # the busy one was left alone
    finally:
        procs.stop().get(timeout=T)


def test_a_proc_stop_runs_cleanup_and_finishes_what_is_in_flight(tmp_path: Path) -> None:
    procs = this_host().spawn_procs(per_host={"p": 2}, name=fresh("stopmix"))
    stopped = False
    try:
        idle = [procs.spawn(fresh("idle"), Idle) for _ in range(40)]
        for f in [m.ping.call(i) for i, m in enumerate(idle)]:
            f.get(timeout=T)
        cleans = procs.spawn(fresh("cleans"), Cleans, str(tmp_path))
        pids = sorted(v for _, v in cleans.ping.call().get(timeout=T).items())
        slow = procs.spawn(fresh("slow"), Slow)
        started = tmp_path / "started"
        inflight = slow.slice(p=0).work.call_one(str(started))
        until = time.monotonic() + T
        while not started.exists() and time.monotonic() < until:
            time.sleep(0.01)
        assert started.exists()
        procs.stop().get(timeout=T)
        stopped = True
        # the message being handled when the stop came was finished, and answered
        assert inflight.get(timeout=T) == "done"
        cleaned = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("cleaned-*"))
        assert cleaned == pids  # each actor with __cleanup__ ran it, once
    finally:
        if not stopped:
            procs.stop().get(timeout=T)
