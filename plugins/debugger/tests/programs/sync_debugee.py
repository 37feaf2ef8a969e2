"""A sync endpoint stopped at ``breakpoint()``, for the tests of release
and of the server: ``python sync_debugee.py MODE MARKERS_DIR``.

Each rank writes ``MARKERS_DIR/continued-<rank>`` once it runs past its
breakpoint (so a test can tell a released rank from a killed one).

MODE ``call``: call, print ``{"values": [...]}``; ``call_noenv``: the same, with
``PYTHONBREAKPOINT`` removed from the procs' environment (the client keeps
its own).  ``stop``: call, wait for a
line on stdin, stop the proc mesh, print ``{"stopped": ..., "outcome": ...}``.
``wait``: call and wait for the result forever (the test ends the client).
"""

import json
import os
import sys

from monarch_core.actor import Actor, current_rank, default_bootstrap_cmd, endpoint, this_host


class SyncDebugee(Actor):
    def __init__(self, markers):
        self.markers = markers

    @endpoint
    def step(self, base):
        x = current_rank().rank
        breakpoint()  # noqa
        y = base + x * 10
        with open(os.path.join(self.markers, f"continued-{x}"), "w") as f:
            f.write(str(y))
        return y


if __name__ == "__main__":
    mode, markers = sys.argv[1], sys.argv[2]
    cmd = default_bootstrap_cmd().with_env(PYTHONBREAKPOINT=None) if mode == "call_noenv" else None
    pm = this_host().spawn_procs(per_host={"gpu": 2}, bootstrap_command=cmd)
    mesh = pm.spawn("syncdbg", SyncDebugee, markers)
    fut = mesh.step.call(7)
    if mode in ("call", "call_noenv"):
        print(json.dumps({"values": fut.get(timeout=600).values()}), flush=True)
    elif mode == "stop":
        sys.stdin.readline()
        pm.stop().get(timeout=120)
        try:
            outcome = ["value", fut.get(timeout=60).values()]
        except Exception as e:  # noqa: BLE001
            outcome = ["error", type(e).__name__]
        print(json.dumps({"stopped": True, "outcome": outcome}), flush=True)
    else:
        fut.get()
