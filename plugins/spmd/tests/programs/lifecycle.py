"""Usage: lifecycle.py OUT [--wait] [--fail-rank R] [--fail-first].  A training
script's process-level habits, reported in files named OUT.<RANK>.<what>:

* it installs a SIGTERM handler (the checkpoint-on-preemption pattern), which
  writes OUT.<RANK>.sigterm and exits 0;
* it registers an ``atexit`` handler, which appends a line to OUT.<RANK>.atexit;
* it counts its runs in a module global of ``spmd_pkg.counter`` and writes
  the count, whether it runs on the main thread and its pid to OUT.<RANK>.json.

--wait: then prints ``rank R pid P ready`` (and creates OUT.<RANK>.ready) and
sleeps until a signal ends it (at most 300 s).  --fail-rank R: rank R exits 3
once every rank is ready.  --fail-first: with --fail-rank, only in attempt 0
(``TORCHELASTIC_RESTART_COUNT``)."""

import atexit
import json
import os
import signal
import sys
import threading
import time

import spmd_pkg.counter as counter

out, rank = sys.argv[1], os.environ["RANK"]
world = int(os.environ["WORLD_SIZE"])


def on_sigterm(signum, frame):
    with open(f"{out}.{rank}.sigterm", "w") as f:
        f.write(f"checkpoint of rank {rank} on signal {signum}\n")
    print(f"rank {rank} got SIGTERM and saved its checkpoint", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, on_sigterm)


@atexit.register
def at_exit():
    with open(f"{out}.{rank}.atexit", "a") as f:
        f.write(f"rank {rank} pid {os.getpid()} exits\n")


counter.RUNS += 1
with open(f"{out}.{rank}.json", "w") as f:
    json.dump({"runs": counter.RUNS, "main_thread": threading.current_thread() is threading.main_thread(),
               "pid": os.getpid(), "restart": os.environ["TORCHELASTIC_RESTART_COUNT"]}, f)
if "--wait" in sys.argv:
    open(f"{out}.{rank}.ready", "w").close()
    print(f"rank {rank} pid {os.getpid()} ready", flush=True)
    fail = int(sys.argv[sys.argv.index("--fail-rank") + 1]) if "--fail-rank" in sys.argv else -1
    first = "--fail-first" not in sys.argv or os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    if str(fail) == rank and first:
        deadline = time.monotonic() + 300
        while not all(os.path.exists(f"{out}.{r}.ready") for r in range(world)):  # the others wait: stop them
            assert time.monotonic() < deadline, "the other ranks never got ready"
            time.sleep(0.05)
        sys.exit(3)
    if fail >= 0 and not first:
        sys.exit(0)
    time.sleep(300)
