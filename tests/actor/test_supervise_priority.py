"""An owner's ``__supervise__`` runs between its messages, before those queued behind the one it is
handling: a backlog of endpoints that never yield (sync, or async ones that block) does not delay it
until the backlog drains (the reference's, torchmonarch 0.7.0, order)."""

from __future__ import annotations

import time

import pytest

from monarch_core.actor import Actor, endpoint, this_host, this_proc


class Fatal(BaseException):
    pass


class Child(Actor):
    @endpoint
    def die(self) -> None:
        raise Fatal("the child fails on purpose")


class SyncOwner(Actor):
    def __init__(self) -> None:
        self.events: list[str] = []

    @endpoint
    def spawn_child(self):  # type: ignore[no-untyped-def]
        self.child = this_proc().spawn(f"child_{type(self).__name__}", Child)
        return self.child

    @endpoint
    def busy(self, seconds: float) -> None:
        time.sleep(seconds)
        self.events.append("busy")

    @endpoint
    def get_events(self) -> list[str]:
        return list(self.events)

    def __supervise__(self, failure) -> bool:  # type: ignore[no-untyped-def]
        self.events.append("supervise")
        return True


class AsyncOwner(Actor):
    def __init__(self) -> None:
        self.events: list[str] = []

    @endpoint
    async def spawn_child(self):  # type: ignore[no-untyped-def]
        self.child = this_proc().spawn(f"child_{type(self).__name__}", Child)
        return self.child

    @endpoint
    async def busy(self, seconds: float) -> None:
        time.sleep(seconds)  # blocks without awaiting: the loop gets no turn
        self.events.append("busy")

    @endpoint
    async def get_events(self) -> list[str]:
        return list(self.events)

    def __supervise__(self, failure) -> bool:  # type: ignore[no-untyped-def]
        self.events.append("supervise")
        return True


@pytest.mark.parametrize("owner_class", [SyncOwner, AsyncOwner], ids=["sync", "async"])
def test_supervise_runs_before_the_backlog_of_busy_endpoints_drains(owner_class: type) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner = procs.spawn("owner", owner_class)
        child = owner.spawn_child.call_one().get(timeout=120)
        owner.busy.broadcast(1.0)  # the owner is busy with this one while the failure arrives
        backlog = 200
        for _ in range(backlog):
            owner.busy.broadcast(0.02)
        child.die.broadcast()
        events = owner.get_events.call_one().get(timeout=240)
        assert events.count("busy") == backlog + 1
        assert "supervise" in events, f"__supervise__ never ran: {events}"
        assert events[events.index("supervise"):].count("busy") > 0, "__supervise__ ran only after the backlog drained"
    finally:
        procs.stop().get(timeout=120)


class Failing(Actor):
    @endpoint
    def noop(self) -> None:
        return None

    @endpoint
    def raise_exception(self) -> None:
        raise Exception("the child fails on purpose")


class WaitsForItsSupervise(Actor):
    """An async endpoint that waits until ``__supervise__`` has seen its child fail."""

    def __init__(self) -> None:
        import asyncio

        self.child = this_proc().spawn("waited_child", Failing)
        self.failures: list[str] = []
        self.faulted = asyncio.Event()

    @endpoint
    async def fail_child_and_wait(self) -> int:
        import asyncio

        await self.child.noop.call()
        self.child.raise_exception.broadcast()  # no caller to report to: the child dies
        await asyncio.wait_for(self.faulted.wait(), timeout=120)
        return len(self.failures)

    def __supervise__(self, failure) -> bool:  # type: ignore[no-untyped-def]
        self.failures.append(str(failure))
        self.faulted.set()
        return True


def test_supervise_runs_while_an_async_endpoint_awaits_it() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner = procs.spawn("waits_for_supervise", WaitsForItsSupervise)
        assert owner.fail_child_and_wait.call_one().get(timeout=240) == 1
    finally:
        procs.stop().get(timeout=120)
