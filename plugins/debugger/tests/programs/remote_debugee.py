"""The guide's ``DebugeeActor`` on procs of worker loops in other hosts (the
network-namespace hosts), reached over mutual TLS, with its source compiled
from a string under a file name that exists on no host: the client registers
it in its ``linecache``, as notebooks do for their cells.

``python remote_debugee.py CONFIG_JSON``: ``{"workers": [...], "ca", "key",
"cert", "bind"}``.  Prints one JSON line at the end, as ``debugee.py`` does.
"""

import json
import linecache
import sys

from monarch_core.actor import ActorError, enable_transport
from monarch_core.worker import attach_to_workers

CELL = "/no/such/dir/notebook-cell-7.py"
SOURCE = '''\
from monarch_core.actor import Actor, current_rank, endpoint


def _bad_rank():
    raise ValueError("bad rank")


def _debugee_actor_internal(rank):
    if rank % 4 == 0:
        breakpoint()  # noqa
        rank += 1
        return rank
    elif rank % 4 == 1:
        breakpoint()  # noqa
        rank += 2
        return rank
    elif rank % 4 == 2:
        breakpoint()  # noqa
        rank += 3
        _bad_rank()
    elif rank % 4 == 3:
        breakpoint()  # noqa
        rank += 4
        return rank


class DebugeeActor(Actor):
    @endpoint
    async def to_debug(self):
        rank = current_rank().rank
        return _debugee_actor_internal(rank)
'''

if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    enable_transport(cfg["bind"])
    linecache.cache[CELL] = (len(SOURCE), None, SOURCE.splitlines(True), CELL)
    ns = {"__name__": "__main__"}
    exec(compile(SOURCE, CELL, "exec"), ns)
    hosts = attach_to_workers(cfg["workers"], ca=cfg["ca"], private_key=cfg["key"], cert=cfg["cert"], timeout=30)
    pm = hosts.spawn_procs(per_host={"gpu": 2})
    debugee_mesh = pm.spawn("debugee", ns["DebugeeActor"])
    values, errors = [], []
    for fut in debugee_mesh.to_debug.stream():
        try:
            values.append(fut.get(timeout=600))
        except ActorError as e:
            errors.append([e.actor, repr(e.exception)])
    print(json.dumps({"values": sorted(values), "errors": sorted(errors)}), flush=True)
    pm.stop().get(timeout=60)
    hosts.shutdown().get(timeout=60)
