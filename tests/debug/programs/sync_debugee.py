"""A sync endpoint stopped at ``breakpoint()``, for the tests of release
and of the server: ``python sync_debugee.py MODE MARKERS_DIR``.

Each rank writes ``MARKERS_DIR/continued-<rank>`` once it runs past its
breakpoint (so a test can tell a released rank from a killed one).

MODE ``call``: call, print ``{"values": [...]}``.  ``stop``: call, wait for a
line on stdin, stop the proc mesh, print ``{"stopped": ..., "outcome": ...}``.
``wait``: call and wait for the result forever (the test ends the client).
"""

import json
import os
import sys

from monarch_core.actor import Actor, current_rank, endpoint, this_host


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
    pm = this_host().spawn_procs(per_host={"gpu": 2})
    mesh = pm.spawn("syncdbg", SyncDebugee, markers)
    fut = mesh.step.call(7)
    if mode == "call":
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
