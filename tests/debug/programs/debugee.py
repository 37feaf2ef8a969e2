"""The debugging guide's program (../shared/spec/003_*): ``DebugeeActor``
verbatim, on a mesh of ``host`` x ``gpu`` procs of this host.

Run as a script (the actor is defined in ``__main__``, as in the guide):
``python debugee.py HOSTS GPUS``.  Prints one JSON line at the end: the
sorted values the ranks returned, and the ``ActorError``s (actor, exception)
of the ranks that raised.
"""

import json
import sys

from monarch_core.actor import Actor, ActorError, current_rank, endpoint, this_host


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


if __name__ == "__main__":
    hosts, gpus = int(sys.argv[1]), int(sys.argv[2])
    # Create a mesh with 4 "hosts" and 4 gpus per "host"
    process_mesh = this_host().spawn_procs(per_host={"host": hosts, "gpu": gpus})
    # Spawn the actor you want to debug on the mesh
    debugee_mesh = process_mesh.spawn("debugee", DebugeeActor)
    # Call the endpoint you want to debug (every rank's outcome, not only the first error)
    values, errors = [], []
    for fut in debugee_mesh.to_debug.stream():
        try:
            values.append(fut.get(timeout=600))
        except ActorError as e:
            errors.append([e.actor, repr(e.exception)])
    print(json.dumps({"values": sorted(values), "errors": sorted(errors)}), flush=True)
