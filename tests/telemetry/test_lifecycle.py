"""Lifecycle and supervision events, with their documented attributes, reach
the client's sinks -- every name of ``telemetry.LIFECYCLE``, from the client
and from the procs -- and error log records carry the structured fields."""

from __future__ import annotations

import json
from pathlib import Path

from monarch_core import telemetry
from monarch_core._telemetry import _events

SCRIPT = r"""
import json, logging, os, signal, sys, time
import monarch_core.actor as api
from monarch_core import telemetry
from monarch_core.actor import Actor, endpoint, this_host, hosts_from_config

events = []

class Recorder:                       # a sink: emit(batch) and close()
    def emit(self, batch):
        events.extend({"kind": e.kind, "name": e.name, "attributes": dict(e.attributes)} for e in batch)
    def close(self):
        with open(sys.argv[1], "w") as f:
            json.dump(events, f, default=str)

telemetry.add_sink(Recorder())
handled = []
api.unhandled_fault_hook = lambda failure: handled.append(failure.mesh_name)   # handled: the client goes on

def log_to_file():                    # each proc's bootstrap: structured error records to a file
    class H(logging.Handler):
        def emit(self, r):
            with open(os.environ["LOG_RECORDS"], "a") as f:
                f.write(json.dumps({k: getattr(r, k, None) for k in
                                    ("levelname", "category", "actor", "endpoint", "mesh", "rank", "proc", "host")}) + "\n")
    logging.getLogger("monarch").addHandler(H())

class Worker(Actor):
    @endpoint
    def pid(self):
        return os.getpid()
    @endpoint
    def crash(self):
        raise ValueError("broken on purpose")

class Parent(Actor):                  # owns a child mesh; does not handle its failure: the cascade
    def __init__(self):
        self.child = api.this_proc().spawn("child", Worker)
    @endpoint
    def break_child(self):
        self.child.crash.broadcast()
    def __supervise__(self, failure):
        return False

class Keeper(Actor):                  # owns a child mesh and handles its failure
    def __init__(self):
        self.child = api.this_proc().spawn("kept", Worker)
    @endpoint
    def break_child(self):
        self.child.crash.broadcast()
    def __supervise__(self, failure):
        return True

host = this_host()
pm = host.spawn_procs({"gpus": 2}, bootstrap=log_to_file)
w = pm.spawn("workers", Worker)
w.pid.call().get()
w.slice(gpus=0).crash.broadcast()                   # actor.failed in the proc, supervision at the client
k = pm.slice(gpus=1).spawn("keeper", Keeper)
k.break_child.call_one().get()                      # handled by Keeper.__supervise__
p = pm.slice(gpus=1).spawn("parent", Parent)
p.break_child.call_one().get()                      # child fails, parent fails: the client sees the cascade
deadline = time.time() + 30
while len(handled) < 2 and time.time() < deadline:
    time.sleep(0.05)
victim = host.spawn_procs({"gpus": 1}, name="victim")
v = victim.spawn("v", Worker)
os.kill(v.pid.call_one().get(), signal.SIGKILL)     # proc.failed (signal)
while len(handled) < 3 and time.time() < deadline:
    time.sleep(0.05)
w.stop().get()
pm.stop().get()
host.stop().get()

hm = hosts_from_config("one")                       # a configured host, then lost
far = hm.spawn_procs()
far.spawn("far", Worker).pid.call_one().get()
os.kill(int(hm.hosts[0].labels["pid"]), signal.SIGKILL)
while len(handled) < 4 and time.time() < deadline:
    time.sleep(0.05)
hm.shutdown().get()
print(json.dumps(handled))
"""


def test_every_lifecycle_event_arrives_with_its_attributes(client_script, tmp_path: Path) -> None:
    (tmp_path / "monarch.toml").write_text('[hosts.one]\nscheduler = "local"\nhosts = 1\n')
    out_path, records = tmp_path / "events.json", tmp_path / "records.jsonl"
    out = client_script(SCRIPT, str(out_path), timeout=180,
                        env={"LOG_RECORDS": str(records), "MONARCH_CONFIG": str(tmp_path / "monarch.toml")})
    assert out.returncode == 0, out.stdout + out.stderr
    events = json.loads(out_path.read_text())
    names = {e["name"] for e in events if e["kind"] == "lifecycle"}
    assert names == set(telemetry.LIFECYCLE), f"missing {set(telemetry.LIFECYCLE) - names}, extra {names - set(telemetry.LIFECYCLE)}"
    for e in events:
        if e["kind"] != "lifecycle":
            continue
        a = e["attributes"]
        for field in _events.LIFECYCLE[e["name"]][1] + ("proc", "proc_name", "host", "pid"):
            assert field in a, f"{e['name']} lacks {field}: {a}"

    def find(name: str, **match: object) -> list[dict]:
        return [e["attributes"] for e in events if e["name"] == name
                and all(e["attributes"].get(k) == v for k, v in match.items())]

    failed = find("proc.failed", mesh="victim")
    assert len(failed) == 1 and failed[0]["signal"] == "SIGKILL" and failed[0]["exit_code"] is None
    assert failed[0]["host_name"] == "localhost"
    crashed = find("actor.failed", mesh="workers")
    assert len(crashed) == 1 and crashed[0]["endpoint"] == "crash" and crashed[0]["category"] == "user"
    assert crashed[0]["rank"] == 0 and "broken on purpose" in crashed[0]["cause"]
    assert crashed[0]["proc"] != find("host_mesh.spawned", mesh="this_host")[0]["proc"], "recorded in the actor's proc"
    assert find("supervision.handled", mesh="kept", handled=True)[0]["handled_by"] == "keeper.__supervise__"
    cascade = find("supervision.event", mesh="parent")
    assert len(cascade) == 1 and cascade[0]["owner"] == "unhandled_fault_hook"
    assert cascade[0]["root_cause"]["mesh"] == "child", "the first failure of the cascade"
    assert "broken on purpose" in cascade[0]["root_cause"]["cause"]
    assert cascade[0]["chain"][0].startswith("child") and cascade[0]["chain"][-1].startswith("parent")
    assert find("supervision.handled", mesh="parent", handled_by="unhandled_fault_hook", handled=True)
    lost = find("host_mesh.lost_host", mesh="one")
    assert len(lost) == 1 and lost[0]["host_name"] and "exited" in lost[0]["reason"]
    assert [e["mesh"] for e in find("proc_mesh.stopped")].count("procs0") == 1
    assert find("host_mesh.stopped", mesh="one", shutdown=True)

    recs = [json.loads(line) for line in records.read_text().splitlines()]
    errors = [r for r in recs if r["levelname"] == "ERROR" and r["actor"] == "workers{'gpus': 0/2}"]
    assert errors, recs
    r = errors[0]
    assert (r["category"], r["endpoint"], r["mesh"], r["rank"]) == ("user", "crash", "workers", 0)
    assert r["proc"] and r["host"]


def test_lifecycle_schema_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    for name, (_what, fields) in telemetry.LIFECYCLE.items():
        assert f"`{name}`" in doc, f"docs/observability.md does not document {name}"
        for f in fields:
            assert f"`{f}`" in doc, f"docs/observability.md does not name the attribute {f} ({name})"
    for f in telemetry.LOG_FIELDS:
        assert f"`{f}`" in doc
