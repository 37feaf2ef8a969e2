"""A runtime raises its soft open-file limit to the hard limit.

A client holds a socket per proc and worker loop it talks to; with a soft
``RLIMIT_NOFILE`` far below the hard one (1024 is the common default) a
client of a few hundred hosts failed with ``OSError: [Errno 24] Too many
open files`` although the hard limit allowed more.  Here the soft limit is
set to 32 before the client starts (the hard one is left alone) and the
client spawns 24 procs -- more sockets than 32 descriptors hold.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from _helpers.clients import child_env, describe

SOFT = 32

CLIENT = r"""
import json, os, resource
from monarch_core.actor import Actor, endpoint, this_host

class A(Actor):
    @endpoint
    def limit(self):
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]

pm = this_host().spawn_procs(per_host={"p": 24})
limits = list(pm.spawn("a", A).limit.call().get(timeout=240).values())
print("RESULT " + json.dumps({"procs": limits, "client": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                              "fds": len(os.listdir("/proc/self/fd"))}), flush=True)
pm.stop().get(timeout=240)
"""


def test_a_client_over_a_low_soft_open_file_limit_raises_it_and_reaches_every_proc() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4 * SOFT:
        pytest.skip(f"the hard open-file limit ({hard}) leaves nothing to raise")

    def low_soft_limit() -> None:  # in the child, before it execs
        resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT, hard))

    res = subprocess.run([sys.executable, "-c", CLIENT], env=child_env(), capture_output=True, text=True,
                         timeout=400, preexec_fn=low_soft_limit)
    assert res.returncode == 0, describe(res)
    out = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    assert out["fds"] > SOFT, out  # it did need more than the soft limit it started with
    assert out["client"] > SOFT and len(out["procs"]) == 24 and min(out["procs"]) > SOFT, out
