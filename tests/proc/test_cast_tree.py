"""Cast trees (``monarch_core._proc._tree``): a large mesh is reached
through its members, each forwarding to at most ``FANOUT`` others.

The live tests lower the thresholds in this (sending) process only: a mesh
of 9 procs with fanout 2 is a tree of depth 3 (members 0 and 1 at the top,
0 forwards to 2 and 3, 2 to 6 and 7 ...).  Forwarders read the layout from
each message, so nothing has to be configured in the procs.
"""

from __future__ import annotations

import marshal
import os
import signal
from collections import Counter

import pytest

from monarch_core._proc import _state, _tree
from monarch_core._kernel import _wire as W
from monarch_core.actor import Actor, current_rank, endpoint, this_host
from monarch_core.errors import ProtocolError, SupervisionError

from _helpers import client_runtime, fresh, poll_until


# ---------------------------------------------------------------- the layout
@pytest.mark.parametrize("n,fanout", [(1, 2), (9, 2), (100, 3), (1000, 16), (4097, 16)])
def test_split_reaches_every_member_once_and_no_node_sends_more_than_fanout(n: int, fanout: int) -> None:
    members = list(range(n))
    reached: Counter = Counter()
    stack = [members]
    while stack:
        group = stack.pop()
        plan = _tree.split(group, fanout)
        assert len(plan) <= fanout
        for head, rest in plan:
            reached[head] += 1
            # the positional layout of a subtree is the global one: head's rest are its descendants
            assert rest == _tree.subtree(head, n, fanout)[1:]
            if rest:
                stack.append(rest)
    assert reached == Counter(members)


def test_paths_children_and_dead_members_are_skipped() -> None:
    assert _tree.path(6, 2) == [0, 2, 6]
    assert _tree.path(1, 2) == [1]
    assert list(_tree.children(0, 9, 2)) == [2, 3]
    assert list(_tree.children(3, 9, 2)) == [8]
    assert _tree.subtree(0, 9, 2) == [0, 2, 3, 6, 7, 8]
    alive = lambda m: False  # noqa: E731
    assert _tree.next_hop(6, -1, 2, alive) == 0
    assert _tree.next_hop(6, 0, 2, alive) == 2
    dead = {0, 2}.__contains__
    assert _tree.next_hop(6, -1, 2, dead) == 6  # both forwarders on the way are gone
    assert sorted(_tree.live_children(-1, 9, 2, dead)) == [1, 3, 6, 7]
    here, rank, groups = _tree.plan(-1, 9, 2, [(6, 0), (1, 1)], alive)
    assert not here and groups == {0: [(6, 0)], 1: [(1, 1)]}
    here, rank, groups = _tree.plan(0, 9, 2, None, alive)
    assert here and rank == 0 and groups == {2: None, 3: None}
    assert _tree.touched(0, [(6, 0)], 9, 2) == [0, 2, 6]


def test_malformed_tree_headers_are_protocol_errors() -> None:
    msg = ("k", "m", None, ("procs",), (9,), "client", None, False, None)
    good = _tree.encode(msg, 9, 2, 0, None, {0: ("p0", "ipc://@a")}, "view", False)
    assert _tree.decode("peer", good)[3] == 0
    traced = _tree.encode((*msg[:-1], bytes(24)), 9, 2, 0, None, None, "view", True)
    assert _tree.decode("peer", traced)[0][-1] == bytes(24)
    bad = [
        marshal.dumps(("k",)),
        marshal.dumps((msg, 9, 2, 9, None, {}, "v", False)),  # at out of range
        marshal.dumps((msg, 9, 1, 0, None, {}, "v", False)),  # fanout 1
        marshal.dumps((msg, 9, 2, 0, [(99, 0)], {}, "v", False)),  # target
        marshal.dumps((msg, 9, 2, 0, None, {0: "x"}, "v", False)),  # table
        marshal.dumps((msg, 9, 2, 0, None, {}, 7, False)),  # view
        marshal.dumps(((*msg[:-1], 5), 9, 2, 0, None, {}, "v", False)),  # trace not bytes
        marshal.dumps((msg[:-1], 9, 2, 0, None, {}, "v", False)),  # a message of 8 fields
        marshal.dumps((msg, 9, 2, 0, None, {}, "v")),  # 7 fields
        b"not marshal",
    ]
    for h in bad:
        with pytest.raises(ProtocolError):
            _tree.decode("peer", h)


# ---------------------------------------------------------------- live
class Node(Actor):
    def __init__(self) -> None:
        self.log: list = []

    @endpoint
    def who(self) -> tuple:
        return (current_rank().rank, os.getpid())

    @endpoint
    def record(self, item: object) -> None:
        self.log.append(item)

    @endpoint
    def get_log(self) -> list:
        return list(self.log)

    @endpoint
    def forwarded(self) -> int:
        return _state.current().kernel.tree_forwarded

    @endpoint
    def batches(self) -> int:
        return _state.current().kernel.tree_batches

    @endpoint
    def fail_on(self, member: int, folder: str) -> int:
        rank = current_rank().rank
        open(os.path.join(folder, f"ran-{rank}"), "w").close()
        if rank == member:
            raise ValueError(f"member {member} refuses")
        return rank

    @endpoint
    def exit_on(self, member: int) -> int:
        if current_rank().rank == member:
            os._exit(3)
        return current_rank().rank

    @endpoint
    def append_to(self, folder: str, item: int) -> None:
        with open(os.path.join(folder, f"{current_rank().rank}.txt"), "a") as f:
            f.write(f"{item}\n")


@pytest.fixture
def small_tree(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_tree, "TREE_MIN", 4)
    monkeypatch.setattr(_tree, "FANOUT", 2)
    pm = this_host().spawn_procs(per_host={"procs": 9})
    try:
        yield pm
    finally:
        pm.stop().get()


def test_every_adverb_reaches_the_right_members_through_the_tree(small_tree) -> None:
    m = small_tree.spawn(fresh("node"), Node)
    everyone = m.who.call().get(timeout=30)
    ranks = [r for r, _pid in everyone.values()]
    pids = [pid for _r, pid in everyone.values()]
    assert ranks == list(range(9)) and len(set(pids)) == 9
    for i in range(9):
        assert m.slice(procs=i).who.call_one().get(timeout=30) == (0, pids[i])
    part = m.slice(procs=slice(3, 8)).who.call().get(timeout=30)
    assert [pid for _r, pid in part.values()] == pids[3:8]
    assert [r for r, _pid in part.values()] == list(range(5))
    assert sorted(pid for _r, pid in (f.get(timeout=30) for f in m.who.stream())) == sorted(pids)
    assert m.who.choose().get(timeout=30)[1] in pids
    # members 0..3 have children (0: 2, 3; 1: 4, 5; 2: 6, 7; 3: 8); the others forward nothing
    fwd = list(m.forwarded.call().get(timeout=30).values())
    assert all(f > 0 for f in fwd[:4]) and all(f == 0 for f in fwd[4:]), fwd


def test_a_traced_call_carries_its_trace_context_through_the_tree(small_tree, tmp_path) -> None:
    """Every member a traced call reaches through forwarders records its server
    span under the caller's client span (the context travels in the tree header)."""
    import json

    from monarch_core import telemetry

    m = small_tree.spawn(fresh("node"), Node)
    m.who.call().get(timeout=30)
    path = tmp_path / "tree.json"
    with telemetry.record_trace(str(path)):
        assert len(m.who.call().get(timeout=30).values()) == 9
        assert m.slice(procs=8).who.call_one().get(timeout=30)[0] == 0  # two forwarders on its way
    spans = [e for e in json.loads(path.read_text()) if e["ph"] == "X" and e["name"].endswith(".who")]
    client = [s for s in spans if s["cat"] == "client"]
    server = [s for s in spans if s["cat"] == "server"]
    assert len(client) == 2 and len(server) == 10, [(s["name"], s["cat"]) for s in spans]
    call, one = sorted(client, key=lambda s: s["ts"])
    assert Counter(s["args"]["parent_id"] for s in server) == {call["args"]["span_id"]: 9, one["args"]["span_id"]: 1}
    assert {s["args"]["trace_id"] for s in server} == {c["args"]["trace_id"] for c in client}


def test_order_from_one_sender_holds_across_broadcasts_calls_and_slices(small_tree) -> None:
    m = small_tree.spawn(fresh("node"), Node)
    rounds = 40
    for i in range(rounds):
        m.record.broadcast(("all", i))
        m.slice(procs=i % 9).record.call_one(("one", i)).get(timeout=30)
        m.slice(procs=slice(2, 6)).record.broadcast(("some", i))
        if i % 7 == 0:
            m.record.call(("call", i)).get(timeout=30)
    logs = list(m.get_log.call().get(timeout=30).values())
    for member, log in enumerate(logs):
        expected = []
        for i in range(rounds):
            expected.append(("all", i))
            if i % 9 == member:
                expected.append(("one", i))
            if 2 <= member < 6:
                expected.append(("some", i))
            if i % 7 == 0:
                expected.append(("call", i))
        assert log == expected, f"member {member}"


def test_a_dead_forwarder_fails_the_calls_that_need_it_and_is_routed_around(small_tree) -> None:
    m = small_tree.spawn(fresh("node"), Node)
    pids = [pid for _r, pid in m.who.call().get(timeout=30).values()]
    os.kill(pids[0], signal.SIGKILL)  # member 0 forwards to 2 and 3 (and they to 6, 7, 8)
    kernel = client_runtime().kernel
    poll_until(lambda: small_tree._slots[0].proc_id in kernel.dead, 30, what="the killed forwarder's end")
    with pytest.raises(SupervisionError):
        m.who.call().get(timeout=30)
    # members below the dead forwarder are still reachable, in order
    for i in (2, 3, 6, 7, 8):
        assert m.slice(procs=i).who.call_one().get(timeout=30) == (0, pids[i])
    survivors = m.slice(procs=slice(1, 9))
    assert [pid for _r, pid in survivors.who.call().get(timeout=30).values()] == pids[1:]


def test_tree_messages_are_refused_by_a_proc_without_a_forwarder() -> None:
    from monarch_core._kernel._runtime import Kernel

    k = Kernel.__new__(Kernel)
    k.agent = None  # (no proc agent: nobody to forward it)
    with pytest.raises(ProtocolError):
        Kernel.route(k, W.K_ACTOR, W.F_TREE, b"", b"", [], "peer")


def test_stop_reaches_each_actor_after_what_was_cast_to_it_before(small_tree, tmp_path) -> None:
    m = small_tree.spawn(fresh("node"), Node)
    m.who.call().get(timeout=30)
    for i in range(25):
        m.append_to.broadcast(str(tmp_path), i)
    m.stop().get(timeout=60)
    for member in range(9):
        lines = (tmp_path / f"{member}.txt").read_text().split()
        assert lines == [str(i) for i in range(25)], f"member {member}"


def test_a_forwarder_without_the_member_table_answers_every_target_with_an_error() -> None:
    from monarch_core.actor import Channel

    port, recv = Channel.open()
    kernel = client_runtime().kernel
    header = _tree.encode(("no-such-mesh", "who", port._ref, ("procs",), (9,), "client", None, False, None), 9, 2,
                          0, None, None, "unknown-view", False)
    _tree.forward(kernel, header, b"", [], "peer")
    errors = []
    for _ in range(6):  # member 0's subtree: 0, 2, 3, 6, 7, 8
        with pytest.raises(SupervisionError) as e:
            recv.recv().get(timeout=30)
        errors.append(str(e.value))
    assert all("no member table" in m for m in errors)


@pytest.mark.parametrize("name,value", [("MONARCH_CAST_FANOUT", "1"), ("MONARCH_CAST_TREE_MIN", "lots")])
def test_a_bad_tree_setting_is_a_clear_error(name: str, value: str) -> None:
    import subprocess
    import sys

    env = {**os.environ, name: value}
    r = subprocess.run([sys.executable, "-c", "import monarch_core.actor; from monarch_core._proc import _tree"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode != 0
    assert f"{name} must be an integer >= 2, got {value!r}" in r.stderr


def test_call_replies_are_gathered_per_subtree(small_tree) -> None:
    m = small_tree.spawn(fresh("node"), Node)
    before = list(m.batches.call().get(timeout=30).values())
    for i in range(5):
        assert [r for r, _pid in m.who.call().get(timeout=30).values()] == list(range(9))
    after = list(m.batches.call().get(timeout=30).values())
    sent = [a - b for a, b in zip(after, before)]
    # members with children (0..3) send one batch up per call; leaves reply directly
    assert all(x >= 5 for x in sent[:4]) and all(x == 0 for x in sent[4:]), sent


def test_an_error_deep_in_the_tree_fails_the_call_and_every_member_still_runs_it(small_tree, tmp_path) -> None:
    from monarch_core.actor import ActorError

    m = small_tree.spawn(fresh("node"), Node)
    with pytest.raises(ActorError, match="member 6 refuses"):
        m.fail_on.call(6, str(tmp_path)).get(timeout=30)
    m.who.call().get(timeout=30)  # in order after the failed call: every member has run it
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"ran-{r}" for r in range(9))


def test_a_member_dying_during_a_call_fails_it_promptly(small_tree) -> None:
    m = small_tree.spawn(fresh("node"), Node)
    m.who.call().get(timeout=30)
    with pytest.raises(SupervisionError) as failed:
        m.exit_on.call(8).get(timeout=20)  # a leaf under forwarders 0 and 3
    # the failure names the member that died, not every rank of the call (forwarder 3 lost it)
    assert "failed on rank 8 {" in str(failed.value) and "; rank " not in str(failed.value), str(failed.value)


def test_a_hop_lost_below_a_forwarder_is_reported_for_its_rank_not_for_every_rank(monkeypatch) -> None:
    """A forwarder that learns first that a proc below it is gone (the client
    may hear of it only later: at 256 hosts, through their worker loops) sends
    the call's failure up for that hop's rank; a ``-1`` there made the client
    name every rank of the call as failed."""
    import types

    from monarch_core._proc import _portmsg

    sent: list = []
    monkeypatch.setattr(_tree._portmsg, "send",
                        lambda kernel, ref, rank, status, payload, bufs, *a: sent.append((status, payload, bufs)))
    kernel = types.SimpleNamespace(add_port=lambda h: 7, remove_port=lambda p: None,
                                   reply_done=lambda p, port: None, tree_batches=0)
    g = _tree.SubtreeGather(kernel, ("client", "ipc://@c", 1), 4)  # type: ignore[arg-type]
    g.procs.append("p8")
    g.rank_of["p8"] = _tree._hop_rank(8, [(8, 5), (9, 6)])
    g.fail(SupervisionError("proc p8 is gone"), "p8")
    (status, payload, bufs), = sent
    assert status == W.S_BATCH
    (rank, item_status, *_rest), = _portmsg.decode_batch("forwarder", payload, bufs)
    assert (rank, item_status) == (5, W.S_ERROR)
    # the rank a hop's loss is reported for: its own, else its subtree's first target's
    assert _tree._hop_rank(3, None) == 3
    assert _tree._hop_rank(3, [(7, 2), (8, 4)]) == 2
