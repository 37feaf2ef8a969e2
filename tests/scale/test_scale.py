"""The ``scale`` tier: many procs on one host, many actors in one proc mesh.

Correctness and clean-up only, never timings.  Each test runs a client of its
own (``run_code``): it owns its procs and its fork server, so killing or
crowding them cannot touch the procs other tests of this xdist worker share.
Timeouts are about 5x the duration measured on a loaded 2-core machine
(128 procs: ~11 s; 5,000 actors: ~38 s beside a benchmark)."""

from __future__ import annotations

import json

import pytest

from _helpers.clients import describe, run_code
from _helpers.procs import wait_pids_gone

pytestmark = pytest.mark.scale

#: the client's own deadline for each wait, and the test's for the whole client
WAIT_S = 240
CLIENT_S = 400

PROCS = """
import json, os, sys
from monarch_core.actor import Actor, endpoint, this_host

class P(Actor):
    @endpoint
    def info(self):
        return {"pid": os.getpid(), "ppid": os.getppid()}

n, wait = int(sys.argv[1]), float(sys.argv[2])
pm = this_host().spawn_procs(per_host={"p": n})
a = pm.spawn("p", P)
infos = list(a.info.call().get(timeout=wait).values())
again = list(a.info.call().get(timeout=wait).values())
pm.stop().get(timeout=wait)
print("RESULT " + json.dumps({"infos": infos, "again": again, "client": os.getpid()}), flush=True)
"""


def _children_of(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc)."""
    import os

    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def test_128_procs_on_one_host_spawn_answer_and_stop_leaving_nothing() -> None:
    res = run_code(PROCS, "128", str(WAIT_S), env={"MONARCH_FORK_SERVER": None}, timeout=CLIENT_S)
    assert res.returncode == 0, describe(res)
    out = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    pids = [i["pid"] for i in out["infos"]]
    assert len(out["infos"]) == 128 and len(set(pids)) == 128, out["infos"]
    assert sorted(i["pid"] for i in out["again"]) == sorted(pids)
    # forked from one fork server, which ended with its client: nothing of it is left
    parents = {i["ppid"] for i in out["infos"]}
    assert wait_pids_gone(pids + sorted(parents - {out["client"]}), 30.0) == []
    for zygote in parents - {out["client"]}:
        assert _children_of(zygote) == []


ACTORS = """
import json, os, sys
from monarch_core.actor import Actor, endpoint, this_host

class A(Actor):
    @endpoint
    def ping(self):
        return os.getpid()

m, wait = int(sys.argv[1]), float(sys.argv[2])
pm = this_host().spawn_procs(per_host={"p": 8})
meshes = [pm.spawn(f"m{i}", A) for i in range(m // 8)]
first = [f.get(timeout=wait) for f in [x.ping.call() for x in meshes]]
second = [f.get(timeout=wait) for f in [x.ping.call() for x in meshes]]
pids = sorted({p for v in first for p in v.values()})
pm.stop().get(timeout=wait)
print("RESULT " + json.dumps({"answers": sum(len(v.values()) for v in first),
                              "answers2": sum(len(v.values()) for v in second), "pids": pids}), flush=True)
"""


def test_a_proc_mesh_with_5000_actors_spawns_answers_and_stops_leaving_nothing() -> None:
    res = run_code(ACTORS, "5000", str(WAIT_S), timeout=CLIENT_S)
    assert res.returncode == 0, describe(res)
    out = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert out["answers"] == out["answers2"] == 5000, out
    assert len(out["pids"]) == 8, out["pids"]
    assert wait_pids_gone(out["pids"], 30.0) == []
