"""A program that ends while its procs run -- or are still starting on hosts
from ``hosts_from_config`` -- exits quietly: return code 0 and nothing on
stderr (no grace-period warnings, no raw-float timeouts, no worker-loop
notices about procs it was asked to kill)."""

from __future__ import annotations

import pytest

from _helpers.clients import describe
from _helpers.config import write_hosts_config

PROGRAM = r"""
import sys
from monarch_core.actor import Actor, endpoint, hosts_from_config

class A(Actor):
    @endpoint
    def f(self) -> int:
        return 1

hm = hosts_from_config("two")
pm = hm.spawn_procs(per_host={"gpus": 2})
m = pm.spawn("a", A)
if sys.argv[1] == "ready":
    assert m.f.call().get(timeout=120).values() == [1, 1, 1, 1]
print("leaving", flush=True)
"""


@pytest.mark.parametrize("when", ["starting", "ready"])
def test_a_program_that_ends_with_procs_running_exits_quietly(client_script, tmp_path, when: str) -> None:
    cfg = write_hosts_config(tmp_path, "two", hosts=2)
    res = client_script(PROGRAM, when, env={"MONARCH_CONFIG": str(cfg)}, timeout=180)
    assert res.returncode == 0, describe(res)
    assert res.stdout.strip().splitlines()[-1] == "leaving", describe(res)
    assert res.stderr == "", describe(res)
