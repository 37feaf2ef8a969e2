"""The runtime's events (``_proc._runtime_events``, on ``ProcRuntime.events``):
a real program -- procs on this host, actors, one that fails, stops -- emits
them with their documented arguments, in the client and in its procs, to any
listener subscribed on the runtime's bus; an unknown event is refused naming
the known ones; a listener that raises is logged and the program goes on."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest

from monarch_core._proc import _runtime_events, _state
from monarch_core._proc._runtime_events import EVENTS

SCRIPT = r"""
import json, logging, os, sys, time
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint, this_host
from monarch_core._launch._start import ensure_runtime
from monarch_core._proc import _state
from monarch_core._proc._runtime_events import EVENTS


def describe(v):                       # an argument as JSON: plain values kept, a mesh or an object named
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return list(v)
    name = getattr(v, "_name", None)
    return f"{type(v).__name__}:{name}" if isinstance(name, str) else type(v).__name__


def listen(bus, record):
    def listener(event):
        def on(**arguments):
            record({"event": event, "arguments": {k: describe(v) for k, v in arguments.items()}})
        return on
    for event in EVENTS:
        bus.subscribe(event, listener(event))


def listen_in_proc():                  # each proc's bootstrap: its runtime's events to a file
    path = os.path.join(os.environ["EVENTS_DIR"], f"proc-{os.getpid()}.jsonl")

    def record(entry):
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    listen(_state.current().events, record)


def broken(**arguments):
    raise RuntimeError("a listener's bug")


class Worker(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def crash(self):
        raise ValueError("broken on purpose")


logged = []


class Logged(logging.Handler):
    def emit(self, r):
        logged.append(r.getMessage())


logging.getLogger("monarch.events").addHandler(Logged())
ensure_runtime()
bus = _state.current().events
heard = []
for event in EVENTS:
    bus.subscribe(event, broken)       # before ours: a raising listener keeps nobody from hearing
listen(bus, heard.append)
try:
    bus.subscribe("proc_redy", heard.append)
    refused = None
except KeyError as e:
    refused = str(e)
handled = []
api.unhandled_fault_hook = lambda failure: handled.append(failure.mesh_name)

host = this_host()
pm = host.spawn_procs({"gpus": 2}, bootstrap=listen_in_proc)
w = pm.spawn("workers", Worker)
pids = sorted(w.pid.call().get().values())
failing = pm.slice(gpus=0).spawn("failing", Worker)
failing.crash.broadcast()
deadline = time.time() + 60
while not any(h["event"] == "supervision_handled" for h in heard) and time.time() < deadline:
    time.sleep(0.05)                   # (the hook ran, and the event after it was emitted)
w.stop().get()
pm.stop().get()
host.stop().get()
with open(sys.argv[1], "w") as f:
    json.dump({"heard": heard, "refused": refused, "logged": logged, "handled": handled, "pids": pids,
               "proc_mesh": pm._name}, f)
"""


@pytest.mark.timeout(300)
def test_a_program_emits_the_runtime_events_to_the_listeners_on_its_bus(client_script, tmp_path: Path) -> None:
    out_path = tmp_path / "out.json"
    out = client_script(SCRIPT, str(out_path), timeout=240, env={"EVENTS_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stdout + out.stderr
    got = json.loads(out_path.read_text())
    heard, pm = got["heard"], got["proc_mesh"]
    for h in heard:  # every event with exactly its documented arguments
        assert tuple(h["arguments"]) == EVENTS[h["event"]], h
    names = [h["event"] for h in heard]

    def find(event: str, **match: object) -> list[dict]:
        return [h["arguments"] for h in heard if h["event"] == event
                and all(h["arguments"].get(k) == v for k, v in match.items())]

    assert find("host_mesh_spawned", mesh="this_host", hosts=["localhost"], scheduler="this_host")
    assert find("proc_mesh_spawned", mesh=pm, slots="list", extent="Extent", host_mesh="this_host")
    ready = find("proc_ready")
    assert sorted(r["pid"] for r in ready) == got["pids"], "each proc ready once, with its OS pid"
    assert [r["last"] for r in ready].count(True) == 1 and ready[-1]["last"] is True
    assert find("actor_mesh_spawned", mesh="ActorMesh:workers", proc_mesh=pm, init="GatherReplies")
    assert find("actor_mesh_spawned", mesh="ActorMesh:failing", proc_mesh=pm)
    assert got["handled"] == ["failing"]
    assert find("supervision_event", failure="MeshFailure", report="dict", owner_host=None, runtime="ProcRuntime")
    assert find("supervision_handled", mesh="failing", handled_by="unhandled_fault_hook", handled=True)
    assert find("actor_mesh_stopping", mesh="ActorMesh:workers", reason="stopped by its owner", done="Cell")
    released = find("actor_mesh_released", class_name="Worker")
    assert len(released) == 2, "workers by its stop(), failing with its procs"
    assert find("proc_mesh_stopping", mesh=pm, reason="stopped by client")
    ended = find("proc_ended", stopped=True)
    assert len(ended) == 2 and all(e["reason"] for e in ended)
    assert find("proc_mesh_stopped", mesh=pm)
    assert find("host_mesh_stopping", mesh="this_host", shutdown=False)
    assert find("host_mesh_stopped", mesh="this_host", shutdown=False)
    order = ["host_mesh_spawned", "proc_mesh_spawned", "actor_mesh_spawned", "supervision_event",
             "supervision_handled", "actor_mesh_stopping", "proc_mesh_stopping", "proc_ended", "proc_mesh_stopped",
             "host_mesh_stopping", "host_mesh_stopped"]
    assert [n for n in dict.fromkeys(names) if n in order] == order, names
    assert len(names) - names[::-1].index("proc_ready") <= names.index("supervision_event"), "ready, then the failure"

    # in the procs: the failed actor, every actor's end, each proc's end
    in_procs = [json.loads(line) for p in glob.glob(os.path.join(tmp_path, "proc-*.jsonl"))
                for line in Path(p).read_text().splitlines()]
    assert len(glob.glob(os.path.join(tmp_path, "proc-*.jsonl"))) == 2, in_procs
    for h in in_procs:
        assert tuple(h["arguments"]) == EVENTS[h["event"]], h
    failed = [h["arguments"] for h in in_procs if h["event"] == "actor_failed"]
    assert len(failed) == 1 and failed[0]["host"] == "ActorHost" and failed[0]["category"] == "user"
    assert "broken on purpose" in failed[0]["cause"]
    assert len([h for h in in_procs if h["event"] == "actor_finished"]) == 3, "workers x2 and failing"
    assert [h["event"] for h in in_procs].count("proc_ending") == 2

    # an unknown name is refused, naming the known ones
    assert got["refused"] and "proc_redy" in got["refused"] and "proc_ready" in got["refused"]
    # the raising listener was logged for each event it heard, and everybody else heard them
    assert any("proc_ready listener" in m and "broken" in m for m in got["logged"]), got["logged"]
    assert len([m for m in got["logged"] if "broken" in m]) == len(heard)


@pytest.mark.unit
def test_each_event_is_documented_with_its_arguments() -> None:
    doc = _runtime_events.__doc__ or ""
    for event, arguments in EVENTS.items():
        assert f"``{event}({', '.join(arguments)})``" in doc, f"{event} is not documented with its arguments"


@pytest.mark.unit
def test_a_runtime_bus_carries_its_events_and_refuses_others() -> None:
    from monarch_core._proc._state import ProcRuntime

    bus = ProcRuntime.__dataclass_fields__["events"].default_factory()
    assert set(bus.events) == set(EVENTS)
    with pytest.raises(KeyError, match="'proc_redy'.*proc_ready"):
        bus.subscribe("proc_redy", lambda **kw: None)
    with pytest.raises(KeyError, match="proc_ready"):
        _state.emit("nothing_happened")  # (with a runtime or without one)
