"""``Actor``, ``@endpoint`` (sync/async, explicit response port),
``@concurrent_endpoint`` and ``as_endpoint``."""

from __future__ import annotations

import asyncio

import pytest

from monarch_core.actor import (
    Actor,
    ActorError,
    Port,
    as_endpoint,
    concurrent_endpoint,
    current_rank,
    endpoint,
)

from _helpers import fresh


class Counter(Actor):
    def __init__(self, start: int = 0) -> None:
        self.n = start

    @endpoint
    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    @endpoint
    async def aincr(self, by: int = 1) -> int:
        await asyncio.sleep(0)
        self.n += by
        return self.n

    @endpoint
    async def racy_incr(self) -> int:
        # read, yield to the loop, write: only safe if messages are handled
        # one at a time
        v = self.n
        await asyncio.sleep(0.001)
        await asyncio.sleep(0)
        self.n = v + 1
        return self.n

    @endpoint
    def value(self) -> int:
        return self.n

    @endpoint
    def kw(self, a: int, *, b: int = 10) -> tuple:
        return (a, b)

    @endpoint(explicit_response_port=True)
    def twice(self, port: Port[int], x: int) -> None:
        port.send(2 * x + current_rank().rank)

    @endpoint(explicit_response_port=True)
    async def atwice(self, port: Port[int], x: int) -> None:
        await asyncio.sleep(0)
        port.send(2 * x)

    @endpoint(explicit_response_port=True)
    def port_fails(self, port: Port[int]) -> None:
        port.exception(ValueError("nope from the port"))

    # plain methods, not endpoints
    def reset(self, to: int = 0) -> str:
        self.n = to
        return "reset"

    def ported_plain(self, port: Port[int], x: int) -> None:
        port.send(x + 100)


class Concurrent(Actor):
    def __init__(self) -> None:
        self.log: list[str] = []
        self._ev: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._ev is None:
            self._ev = asyncio.Event()
        return self._ev

    @concurrent_endpoint(explicit_response_port=True)
    async def wait_open(self, port: Port[str], tag: str) -> None:
        self.log.append(f"start {tag}")
        await self._event().wait()
        self.log.append(f"end {tag}")
        port.send(tag)

    @endpoint
    def open(self) -> str:
        self._event().set()
        return "opened"

    @concurrent_endpoint(explicit_response_port=True)
    async def conc_unforwarded(self, port: Port[int]) -> None:
        await asyncio.sleep(0)
        raise ValueError("not forwarded")

    @endpoint
    def snapshot(self) -> list:
        return list(self.log)

    @concurrent_endpoint
    async def doubled(self, x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    @concurrent_endpoint
    async def conc_boom(self) -> int:
        await asyncio.sleep(0)
        raise ValueError("concurrent kaboom")


# ---------------------------------------------------------------- endpoints


def test_sync_and_async_endpoints(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter, 5)
    one = c.slice(gpus=0)
    assert one.incr.call_one().get() == 6
    assert one.aincr.call_one(4).get() == 10
    assert one.incr.call_one(by=-3).get() == 7
    assert one.value.call_one().get() == 7
    # other ranks have their own state
    assert c.value.call().get().values() == [7, 5, 5, 5]


def test_constructor_args_reach_every_rank(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter, start=42)
    assert c.value.call().get().values() == [42, 42, 42, 42]


def test_keyword_arguments(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter).slice(gpus=1)
    assert c.kw.call_one(1).get() == (1, 10)
    assert c.kw.call_one(1, b=2).get() == (1, 2)
    assert c.kw.call_one(a=3, b=4).get() == (3, 4)


def test_one_message_at_a_time(procs) -> None:
    """Concurrent calls to an endpoint that awaits between read and write
    must not interleave: each actor handles one message at a time."""
    one = procs.spawn(fresh("counter"), Counter).slice(gpus=2)
    futs = [one.racy_incr.call_one() for _ in range(25)]
    results = [f.get() for f in futs]
    assert results == list(range(1, 26))  # FIFO from one sender, no lost update
    assert one.value.call_one().get() == 25


def test_one_message_at_a_time_on_every_rank(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter)
    futs = [c.racy_incr.call() for _ in range(10)]
    meshes = [f.get() for f in futs]
    for i, vm in enumerate(meshes, start=1):
        assert vm.values() == [i, i, i, i]
    assert c.value.call().get().values() == [10, 10, 10, 10]


def test_messages_sent_right_after_spawn_keep_their_order(procs) -> None:
    """Actor messages are read off the kernel loop while spawns run on it;
    messages that reach a proc before its spawn is processed are held, and
    must still run before the ones that arrive after (a race seen as one
    rank running call #2 after call #8)."""
    for _ in range(30):
        c = procs.spawn(fresh("counter"), Counter)
        futs = [c.racy_incr.call() for _ in range(10)]
        assert [f.get().values() for f in futs] == [[i] * 4 for i in range(1, 11)]
        c.stop().get()


def test_endpoint_on_class_is_not_directly_callable_on_mesh(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter)
    with pytest.raises(Exception):
        c.incr(1)  # must use an adverb


# ---------------------------------------------------------------- explicit response port


def test_explicit_response_port_call_one(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter)
    assert c.slice(gpus=0).twice.call_one(4).get() == 8
    assert c.slice(gpus=3).twice.call_one(4).get() == 8  # rank 0 of the slice
    assert c.slice(gpus=1).atwice.call_one(21).get() == 42


def test_explicit_response_port_call(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter)
    vm = c.twice.call(10).get()
    assert vm.values() == [20, 21, 22, 23]
    assert c.atwice.call(1).get().values() == [2, 2, 2, 2]


def test_explicit_response_port_exception(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter).slice(gpus=0)
    with pytest.raises((ActorError, ValueError), match="nope from the port"):
        c.port_fails.call_one().get()
    # the actor keeps serving
    assert c.incr.call_one().get() == 1


# ---------------------------------------------------------------- concurrent_endpoint


def test_concurrent_endpoint_handles_next_message_while_body_awaits(procs) -> None:
    one = procs.spawn(fresh("conc"), Concurrent).slice(gpus=0)
    fa = one.wait_open.call_one("a")
    fb = one.wait_open.call_one("b")
    # both bodies are parked on the event; a plain endpoint still runs
    # (with a sequential actor this would deadlock)
    with pytest.raises(TimeoutError):
        fa.get(timeout=0.2)
    assert one.open.call_one().get(timeout=20) == "opened"
    assert fa.get(timeout=20) == "a"
    assert fb.get(timeout=20) == "b"
    log = one.snapshot.call_one().get()
    assert len(log) == 4
    # bodies start in message order
    assert [e for e in log if e.startswith("start")] == ["start a", "start b"]
    assert sorted(e for e in log if e.startswith("end")) == ["end a", "end b"]


def test_concurrent_endpoint_returns_value(procs) -> None:
    """Without explicit_response_port the body is an ordinary async endpoint:
    its return value is the reply."""
    c = procs.spawn(fresh("conc"), Concurrent)
    assert c.slice(gpus=1).doubled.call_one(21).get(timeout=20) == 42
    assert c.doubled.call(5).get(timeout=20).values() == [10, 10, 10, 10]


def test_concurrent_endpoint_exception_reaches_caller(procs) -> None:
    """Without explicit_response_port the decorator forwards the body's
    exception through the response port (ActorError), so the caller sees it
    and the actor keeps serving."""
    one = procs.spawn(fresh("conc"), Concurrent).slice(gpus=2)
    with pytest.raises(ActorError, match="concurrent kaboom"):
        one.conc_boom.call_one().get(timeout=20)
    assert one.snapshot.call_one().get(timeout=20) == []


def test_concurrent_endpoint_unforwarded_exception_fails_actor(procs) -> None:
    """With an explicit port, an exception the body does not forward fails
    the actor (no silent errors): the pending call must not hang, and the
    actor no longer serves."""
    one = procs.spawn(fresh("conc"), Concurrent).slice(gpus=3)
    exc = one.conc_unforwarded.call_one().exception(timeout=20)  # TimeoutError = hang
    assert isinstance(exc, Exception)
    with pytest.raises(Exception) as info:
        one.snapshot.call_one().get(timeout=20)
    assert not isinstance(info.value, TimeoutError)


def test_concurrent_endpoint_requires_async_method() -> None:
    with pytest.raises((TypeError, ValueError)):

        class Bad(Actor):  # noqa: F841
            @concurrent_endpoint
            def sync_body(self) -> int:
                return 1


# ---------------------------------------------------------------- as_endpoint


def test_as_endpoint_calls_plain_method(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter, 3)
    vm = as_endpoint(c.reset).call(7).get()
    assert vm.values() == ["reset"] * 4
    assert c.value.call().get().values() == [7, 7, 7, 7]
    assert as_endpoint(c.slice(gpus=2).reset).call_one(to=1).get() == "reset"
    assert c.value.call().get().values() == [7, 7, 1, 7]


def test_as_endpoint_explicit_response_port(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter)
    ep = as_endpoint(c.slice(gpus=1).ported_plain, explicit_response_port=True)
    assert ep.call_one(5).get() == 105


def test_calling_plain_method_on_mesh_mentions_as_endpoint(procs) -> None:
    c = procs.spawn(fresh("counter"), Counter)
    with pytest.raises(Exception, match="as_endpoint"):
        c.reset(1)
    with pytest.raises(Exception, match="as_endpoint"):
        c.reset.call(1)
    # nothing was run
    assert c.value.call().get().values() == [0, 0, 0, 0]


def test_as_endpoint_rejects_non_actor_method() -> None:
    def not_a_method() -> int:
        return 1

    with pytest.raises(ValueError):
        as_endpoint(not_a_method)


# ---------------------------------------------------------------- names an actor mesh keeps


@pytest.mark.parametrize("name", ["size", "slice", "rename", "stop", "split", "flatten", "initialized", "name",
                                  "sizes", "extent", "proc_mesh"])
def test_an_endpoint_named_like_a_mesh_member_is_refused_at_class_definition(name) -> None:
    """``@endpoint def size(self)`` would be hidden by ``ActorMesh.size`` and
    fail later with "'function' object has no attribute 'call_one'": refused
    when the class is created, naming the clash and the fix."""

    def body(self) -> int:
        return 1

    body.__name__ = name
    with pytest.raises(TypeError) as ei:
        type("Clashing", (Actor,), {name: endpoint(body)})
    text = str(ei.value)
    assert f"endpoint Clashing.{name} is named like a member of the actor mesh" in text
    assert f"ActorMesh.{name}" in text
    assert "Rename the endpoint" in text and f"{name + '_'!r}" in text


def test_an_endpoint_clash_is_refused_for_concurrent_endpoints_and_subclasses() -> None:
    class Base(Actor):
        @endpoint
        def fine(self) -> int:
            return 1

    with pytest.raises(TypeError, match=r"Sub\.stop is named like a member of the actor mesh"):
        class Sub(Base):  # noqa: F841 - the class statement is what is checked
            @concurrent_endpoint
            async def stop(self) -> None:
                pass


def test_plain_methods_and_close_names_are_fine(procs) -> None:
    class Sized(Actor):
        @endpoint
        def size_(self) -> int:
            return current_rank().rank

        @endpoint
        def get_name(self) -> str:
            return "sized"

        def stop(self) -> str:  # a plain helper: not an endpoint, nothing hidden
            return "helper"

    m = procs.spawn(fresh("sized"), Sized)
    assert m.size_.call().get().values() == [0, 1, 2, 3]
    assert m.slice(gpus=0).get_name.call_one().get() == "sized"
    assert m.size() == 4  # the mesh's own
