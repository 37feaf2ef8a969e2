"""Distributed spans: a client span per call, a server span per endpoint
invocation in the actor's proc, ``@traced`` spans nested inside, linked
across processes by the trace context of the message header; nothing lost at
``stop()``/shutdown; ``@traced`` in ``__main__``; the trace file's tracks."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from monarch_core import telemetry
from monarch_core.actor import Actor, endpoint, traced


@traced
def double(x: int) -> int:
    return 2 * x


@traced(name="async_part")
async def later(x: int) -> int:
    await asyncio.sleep(0)
    return x + 1


class Leaf(Actor):
    @endpoint
    def work(self, x: int) -> int:
        return double(x)


class Middle(Actor):
    @endpoint
    async def relay(self, leaf, x: int) -> int:
        y = await later(x)
        return await leaf.work.call_one(y)


def spans_of(path: Path) -> tuple[list[dict], dict[int, str], dict[tuple, str]]:
    events = json.loads(path.read_text())
    procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    return [e for e in events if e["ph"] == "X"], procs, threads


def test_spans_nest_and_link_across_three_processes(procs, tmp_path: Path) -> None:
    leaf = procs.spawn("span_leaf", Leaf).slice(gpus=1)
    mid = procs.spawn("span_mid", Middle).slice(gpus=0)
    mid.relay.call_one(leaf, 1).get()  # warm: nothing recorded outside record_trace
    path = tmp_path / "run.json"
    with telemetry.record_trace(str(path)):
        with_traced = traced(name="client_step")(lambda: mid.relay.call_one(leaf, 20).get())
        assert with_traced() == 42
    spans, procs_named, threads = spans_of(path)
    by_id = {s["args"]["span_id"]: s for s in spans}
    step = next(s for s in spans if s["name"] == "client_step")
    relay_c = next(s for s in spans if s["name"] == "span_mid.relay" and s["cat"] == "client")
    relay_s = next(s for s in spans if s["name"] == "span_mid.relay" and s["cat"] == "server")
    part = next(s for s in spans if s["name"] == "async_part")
    work_c = next(s for s in spans if s["name"] == "span_leaf.work" and s["cat"] == "client")
    work_s = next(s for s in spans if s["name"] == "span_leaf.work" and s["cat"] == "server")
    dbl = next(s for s in spans if s["name"] == "double")
    chain = [step, relay_c, relay_s, work_c, work_s, dbl]
    for parent, child in zip(chain, chain[1:]):
        assert child["args"]["parent_id"] == parent["args"]["span_id"], (parent["name"], child["name"])
    assert part["args"]["parent_id"] == relay_s["args"]["span_id"]
    assert len({s["args"]["trace_id"] for s in chain + [part]}) == 1
    assert step["args"]["parent_id"] is None
    # three processes: the client, the middle actor's proc, the leaf's proc
    assert step["pid"] == relay_c["pid"] and relay_s["pid"] == work_c["pid"] == part["pid"]
    assert len({step["pid"], relay_s["pid"], work_s["pid"]}) == 3
    assert threads[(relay_s["pid"], relay_s["tid"])] == "span_mid{'gpus': 0/2}"
    assert threads[(work_s["pid"], work_s["tid"])] == "span_leaf{'gpus': 1/2}"
    assert procs_named[work_s["pid"]].startswith("procs") and "pid" in procs_named[work_s["pid"]]
    # every client span starts a flow arrow that ends on its server span
    events = json.loads(path.read_text())
    starts = {e["id"] for e in events if e["ph"] == "s"}
    ends = {e["id"] for e in events if e["ph"] == "f"}
    assert {relay_c["args"]["span_id"], work_c["args"]["span_id"]} <= starts & ends
    for s in chain:
        assert s["dur"] >= 0 and s["ts"] > 0
    assert relay_c["dur"] >= relay_s["dur"] >= work_c["dur"] >= work_s["dur"]
    assert all(s["args"]["span_id"] in by_id for s in chain)


class Built(Actor):
    def __init__(self, x: int) -> None:
        self.x = double(x)  # @traced in __init__

    @endpoint
    def value(self) -> int:
        return self.x


def test_traced_code_in_init_records_under_a_traced_spawn(procs, tmp_path: Path) -> None:
    path = tmp_path / "spawn.json"
    with telemetry.record_trace(str(path)):
        m = procs.spawn("span_built", Built, 5)
        assert m.value.call().get().values() == [10, 10]
    spans, _p, threads = spans_of(path)
    client = [s for s in spans if s["name"] == "span_built.__init__" and s["cat"] == "client"]
    server = [s for s in spans if s["name"] == "span_built.__init__" and s["cat"] == "server"]
    inner = [s for s in spans if s["name"] == "double"]
    assert len(client) == 1 and len(server) == 2 and len(inner) == 2, [s["name"] for s in spans]
    (c,) = client
    assert c["args"]["adverb"] == "spawn" and c["args"]["parent_id"] is None
    assert {s["args"]["parent_id"] for s in server} == {c["args"]["span_id"]}
    assert {s["args"]["parent_id"] for s in inner} == {s["args"]["span_id"] for s in server}
    assert len({s["args"]["trace_id"] for s in client + server + inner}) == 1
    assert {threads[(s["pid"], s["tid"])] for s in server} == {"span_built{'gpus': 0/2}", "span_built{'gpus': 1/2}"}
    assert c["dur"] >= max(s["dur"] for s in server)
    # an untraced spawn carries no context: its __init__ records nothing
    path2 = tmp_path / "after.json"
    m2 = procs.spawn("span_quiet", Built, 1)
    with telemetry.record_trace(str(path2)):
        assert m2.value.call().get().values() == [2, 2]
    assert not [s for s in spans_of(path2)[0] if s["name"] in ("span_quiet.__init__", "double")]


def test_an_error_is_recorded_on_its_spans(procs, tmp_path: Path) -> None:
    class Bad(Actor):
        @endpoint
        def boom(self) -> None:
            raise KeyError("nope")

    m = procs.spawn("span_bad", Bad).slice(gpus=0)
    path = tmp_path / "err.json"
    with telemetry.record_trace(str(path)):
        try:
            m.boom.call_one().get()
        except Exception as e:  # noqa: BLE001
            assert type(e).__name__ == "ActorError"
    spans, _p, _t = spans_of(path)
    errs = {(s["cat"], s["args"].get("error")) for s in spans if s["name"] == "span_bad.boom"}
    assert errs == {("client", "ActorError"), ("server", "KeyError")}


NO_LOSS = """
import json, sys
from monarch_core import telemetry
from monarch_core.actor import Actor, endpoint, this_host, traced

@traced
def inner(i):
    return i

class A(Actor):
    @endpoint
    def f(self, i):
        return inner(i)

pm = this_host().spawn_procs({"gpus": 2})
m = pm.spawn("noloss", A)
m.f.call(0).get()
N = 400
if sys.argv[1] == "stop":
    with telemetry.record_trace(sys.argv[2]):
        for i in range(N):
            m.f.broadcast(i)
        pm.stop().get()          # right after the calls: their spans come with the procs' last batch
else:                            # MONARCH_TRACE_FILE: written at the shutdown at exit
    for i in range(N):
        m.f.broadcast(i)
print("done")
"""


def test_no_span_is_lost_at_stop_or_at_shutdown(client_script, tmp_path: Path) -> None:
    for how, env in (("stop", {}), ("exit", {"MONARCH_TRACE_FILE": str(tmp_path / "exit.json")})):
        path = tmp_path / f"{how}.json"
        out = client_script(NO_LOSS, how, str(path), env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        spans, _p, _t = spans_of(path)
        server = [s for s in spans if s["cat"] == "server" and s["name"] == "noloss.f"]
        inner = [s for s in spans if s["name"] == "inner"]
        got = sorted(s["args"]["rank"] for s in server)
        assert got.count(0) == got.count(1) == 400 + (1 if how == "exit" else 0), how
        assert len(inner) == len(server), how
        clients = [s for s in spans if s["cat"] == "client" and s["name"] == "noloss.f"]
        assert len(clients) == 400 + (1 if how == "exit" else 0), how


TRACED_MAIN = """
import asyncio, json, sys
from monarch_core import telemetry
from monarch_core.actor import Actor, endpoint, this_host, traced

@traced
def helper(x):
    return x + 1

@traced(name="renamed")
async def ahelper(x):
    await asyncio.sleep(0)
    return x * 3

class M(Actor):                       # defined in __main__: pickled by value, with helper
    def __init__(self, k):
        self.k = k

    @traced
    def method(self, x):
        return helper(x) + self.k

    @endpoint
    def run(self, x):
        return self.method(x)

    @endpoint
    async def arun(self, x):
        return await ahelper(x)

pm = this_host().spawn_procs()
m = pm.spawn("main_actor", M, 100)
with telemetry.record_trace(sys.argv[1]):
    a = m.run.call_one(1).get()
    b = m.arun.call_one(2).get()
    c = helper(0)                     # in the client too
print(json.dumps([a, b, c]))
pm.stop().get()
"""


def test_traced_works_in_main_for_actors_and_the_client(client_script, tmp_path: Path) -> None:
    path = tmp_path / "main.json"
    out = client_script(TRACED_MAIN, str(path), timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [102, 6, 1]
    spans, _p, threads = spans_of(path)
    run = next(s for s in spans if s["name"] == "main_actor.run" and s["cat"] == "server")
    method = next(s for s in spans if s["name"] == "method")
    helper_in_actor = next(s for s in spans if s["name"] == "helper" and s["pid"] == run["pid"])
    helper_in_client = next(s for s in spans if s["name"] == "helper" and s["pid"] != run["pid"])
    arun = next(s for s in spans if s["name"] == "main_actor.arun" and s["cat"] == "server")
    renamed = next(s for s in spans if s["name"] == "renamed")
    assert method["args"]["parent_id"] == run["args"]["span_id"]
    assert helper_in_actor["args"]["parent_id"] == method["args"]["span_id"]
    assert renamed["args"]["parent_id"] == arun["args"]["span_id"]
    assert helper_in_client["args"]["parent_id"] is None
    assert threads[(method["pid"], method["tid"])] == "main_actor"


def test_traced_keeps_errors_and_refuses_non_functions() -> None:
    import pytest

    @traced
    def bad() -> None:
        raise RuntimeError("x")

    with pytest.raises(RuntimeError):
        bad()
    with pytest.raises(TypeError, match="@traced decorates a function"):
        traced(3)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="must be a str"):
        traced(name=5)  # type: ignore[call-overload]


FILE_SINKS = """
import sys
from monarch_core.actor import Actor, endpoint, this_host

class A(Actor):
    @endpoint
    def f(self, i):
        return i

pm = this_host().spawn_procs({"gpus": 1})
pm.spawn("files", A).f.call(0).get()
pm.stop().get()
print("done")
"""


def test_the_file_sinks_come_from_monarch_cores_own_plugin_which_can_be_turned_off(client_script,
                                                                                   tmp_path: Path) -> None:
    """``MONARCH_TRACE_FILE`` / ``MONARCH_TELEMETRY_JSONL`` sinks are made by the
    built-in plugin ``telemetry_files`` (an entry point of monarch-core, like
    any plugin's): it writes both files; disabled, neither is written."""
    for disabled in ("", "telemetry_files"):
        trace, jsonl = tmp_path / f"t{disabled}.json", tmp_path / f"e{disabled}.jsonl"
        out = client_script(FILE_SINKS, env={"MONARCH_TRACE_FILE": str(trace), "MONARCH_TELEMETRY_JSONL": str(jsonl),
                                             "MONARCH_DISABLED_PLUGINS": disabled or None}, timeout=120)
        assert out.returncode == 0 and "done" in out.stdout, out.stderr
        if disabled:
            assert not trace.exists() and not jsonl.exists()
        else:
            spans, _p, _t = spans_of(trace)
            assert any(s["name"] == "files.f" for s in spans)
            assert '"name":"files.f"' in jsonl.read_text()
