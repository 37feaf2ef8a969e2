"""How fast failures are noticed on one host (figures for docs/supervision.md).

    python bench/supervision_times.py [--rounds 5]

* SIGKILL of a proc during a call -> the caller's ``SupervisionError``;
* SIGKILL of the client -> every proc it started is gone.

Printed, never asserted.  The worker-loop counterparts are printed by
``tests/transport/test_worker_heartbeat.py`` under ``pytest -s``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

HOLD = """
import json, os, sys
from monarch_core.actor import Actor, endpoint, this_host
class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()
pm = this_host().spawn_procs(per_host={"gpus": 2})
print(json.dumps(pm.spawn("p", Pid).pid.call().get(timeout=60).values()), flush=True)
sys.stdin.readline()
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sigkill_detection(rounds: int) -> list[float]:
    import monarch_core.actor as ma
    from monarch_core.actor import Actor, endpoint, this_host

    ma.unhandled_fault_hook = lambda failure: None  # the kills are on purpose

    class Sleeper(Actor):
        @endpoint
        def pid(self) -> int:
            return os.getpid()

        @endpoint
        def sleep(self, s: float) -> None:
            time.sleep(s)

    pm = this_host().spawn_procs(per_host={"gpus": rounds})
    s = pm.spawn("s", Sleeper)
    pids = s.pid.call().get(timeout=60).values()
    out = []
    for i in range(rounds):
        fut = s.slice(gpus=i).sleep.call_one(60)
        time.sleep(0.3)  # the call is being served
        t0 = time.monotonic()
        os.kill(pids[i], signal.SIGKILL)
        try:
            fut.get(timeout=60)
        except Exception:
            out.append((time.monotonic() - t0) * 1000)
    return out


def client_death(rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        c = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        pids = json.loads(c.stdout.readline())
        t0 = time.monotonic()
        c.send_signal(signal.SIGKILL)
        deadline = t0 + 30
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.001)
        out.append((time.monotonic() - t0) * 1000)
        c.wait(30)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    death = client_death(args.rounds)  # before this process starts a runtime of its own
    kill = sigkill_detection(args.rounds)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"local: SIGKILLed proc -> caller's SupervisionError: {', '.join(f'{t:.1f}' for t in kill)} ms "
          f"(median {med(kill):.1f})")
    print(f"local: client SIGKILLed -> its procs gone: {', '.join(f'{t:.1f}' for t in death)} ms "
          f"(median {med(death):.1f})")
    os._exit(0)


if __name__ == "__main__":
    main()
