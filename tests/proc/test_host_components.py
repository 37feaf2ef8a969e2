"""The actor host's parts: the header ``ActorHost.enqueue`` queues is the
tuple that came (no object per message), its fields named by
``_invoke.ActorHeader``; and an actor's runtime is the components its host holds --
mailbox, invoker, failure handling, stop -- with the names other layers read
on the host still answering from them (white-box, from inside a real actor)."""

from __future__ import annotations

from monarch_core._proc._host import ActorHost
from monarch_core._proc._invoke import ActorHeader
from monarch_core.actor import Actor, context, endpoint, this_host

from _helpers import T, fresh

TRACE = bytes(24)
REST = (("proc", "addr", 7), 2, ("gpus",), (4,), "client", None, 0)  # reply, rank, labels, sizes, sender, ret, explicit


class _Host:
    """What ``ActorHost.enqueue`` touches of its actor host."""

    def __init__(self) -> None:
        self.posted: list = []

    def _post(self, item: tuple) -> None:
        self.posted.append(item)


def test_enqueue_queues_the_header_as_it_came_and_actor_header_names_its_fields() -> None:
    host = _Host()
    plain, traced = ("k", "ep", *REST), ("k", "ep", *REST, TRACE)
    ActorHost.enqueue(host, plain, b"p", [], "peer")  # type: ignore[arg-type]
    ActorHost.enqueue(host, traced, b"p", [], "peer")  # type: ignore[arg-type]
    assert [item[0] for item in host.posted] == [plain, traced]
    assert all(item[0] is h for item, h in zip(host.posted, (plain, traced)))  # no object made per message
    for h in (plain, traced):
        named = ActorHeader._make(h[:9])
        assert (named.key, named.method, named.reply, named.rank, named.labels, named.sizes, named.sender,
                named.ret, named.explicit) == ("k", "ep", *REST)


class Inside(Actor):
    @endpoint
    def parts(self) -> dict:
        host = context().actor_instance._host
        return {
            "components": sorted(type(getattr(host, a)).__name__
                                 for a in ("_mailbox", "_invoker", "_failing", "_stopping")),
            "runs_without_a_loop": host._mailbox.own_loop is None,  # (a sync actor: none until one is needed)
            "current_reply": host._current_reply[2] if host._current_reply is not None else None,
            "queues": [type(q).__name__ for q in (host._incoming, host._pending, host._control)],
            "stop_requested": host._stop_requested,
        }


def test_the_host_is_its_components_and_keeps_the_names_other_layers_read() -> None:
    procs = this_host().spawn_procs(per_host={"p": 1})
    try:
        first = procs.spawn(fresh("first"), Inside).slice(p=0)  # (the proc's first actor reads its sockets: a loop)
        assert first.parts.call_one().get(timeout=T)["runs_without_a_loop"] is False
        one = procs.spawn(fresh("inside"), Inside).slice(p=0)
        got = one.parts.call_one().get(timeout=T)
    finally:
        procs.stop().get(timeout=T)
    assert got == {
        "components": ["Failing", "Invoker", "Mailbox", "Stopping"],
        "runs_without_a_loop": True,
        "current_reply": "parts",  # the message being handled, as ``Port`` and telemetry read it
        "queues": ["deque", "deque", "deque"],
        "stop_requested": False,
    }
