"""At the client's exit its meshes stop tier by tier: the proc meshes first,
and the host meshes (whose worker loops report the procs' ends) only once
those procs are gone.  Stopped together, the proc meshes' stop waited for
reports from worker loops that were already ending (the exit took seconds
instead of a fraction of one)."""

from __future__ import annotations

from _helpers.clients import describe
from _helpers.config import write_hosts_config

PROGRAM = r"""
from monarch_core.actor import Actor, endpoint, hosts_from_config
from monarch_core._actor._host_mesh import HostMesh

class A(Actor):
    @endpoint
    def f(self) -> int:
        return 1

hm = hosts_from_config("two")
pm = hm.spawn_procs(per_host={"gpus": 2})
assert pm.spawn("a", A).f.call().get(timeout=120).values() == [1, 1, 1, 1]

stop_host_mesh = HostMesh._stop_owned

def observed(self, *args, **kwargs):  # the real stop, after noting how far the procs' stop got
    done = pm._stopped is not None and pm._stopped.done()
    print("host mesh stop begins; procs gone:", done, flush=True)
    return stop_host_mesh(self, *args, **kwargs)

HostMesh._stop_owned = observed
print("leaving", flush=True)
"""


def test_the_client_stops_host_meshes_after_their_procs_at_exit(client_script, tmp_path) -> None:
    cfg = write_hosts_config(tmp_path, "two", hosts=2)
    res = client_script(PROGRAM, env={"MONARCH_CONFIG": str(cfg)}, timeout=180)
    assert res.returncode == 0, describe(res)
    assert "host mesh stop begins; procs gone: True" in res.stdout, describe(res)
    assert "procs gone: False" not in res.stdout, describe(res)
    assert res.stderr == "", describe(res)
