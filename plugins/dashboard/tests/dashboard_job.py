"""A live job for the dashboard's tests: 2 hosts x 4 procs (the ``local``
scheduler), one actor mesh ``w``, driven by commands on stdin, one per line:

``calls N``      N ``call_one`` of ``w.ping`` on rank 1
``work``         ``w.work.call()`` 20 times (rank 5 is the slow one)
``even``         ``w.even.call()`` 10 times (every rank takes the same 20 ms)
``errors N``     ``w.flaky.call(i)`` for i < N: rank 6 raises ``ValueError("bad batch <i>")`` for odd i
``die R``        ``die.call`` on rank R's host: rank R's proc kills itself (the caller gets a SupervisionError)
``pingall``      ``ping.call_one`` to each rank in turn, 5 rounds (failed ranks are skipped)
``log R TEXT``   rank R prints TEXT
``kill R``       SIGKILL the proc of rank R
``quit``

Each command is answered ``done <command>`` on stdout once it ran.
Run with ``MONARCH_DASHBOARD=1`` in a directory whose ``monarch.toml`` has
``[hosts.two]`` (``scheduler = "local"``, ``hosts = 2``).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import monarch_core.actor as A
from monarch_core.errors import SupervisionError


class Worker(A.Actor):
    @A.endpoint
    def pid(self) -> int:
        return os.getpid()

    @A.endpoint
    def ping(self, i: int) -> int:
        return i

    @A.endpoint
    def work(self) -> None:
        time.sleep(0.03 if A.current_rank().rank == 5 else 0.002)

    @A.endpoint
    def even(self) -> None:
        time.sleep(0.02)

    @A.endpoint
    def flaky(self, i: int) -> int:
        if A.current_rank().rank == 6 and i % 2:
            raise ValueError(f"bad batch {i}")
        return i

    @A.endpoint
    def die(self, pid: int) -> None:
        if os.getpid() == pid:
            os.kill(os.getpid(), signal.SIGKILL)

    @A.endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)


def main() -> int:
    A.unhandled_fault_hook = lambda failure: None  # the job goes on after a proc is killed
    hosts = A.hosts_from_config("two")
    procs = hosts.spawn_procs(per_host={"procs": 4})
    w = procs.spawn("w", Worker)
    pids = [pid for _point, pid in w.pid.call().get(timeout=60)]
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split(maxsplit=2)
        if not cmd:
            continue
        if cmd[0] == "calls":
            one = w.slice(hosts=0, procs=1)
            for i in range(int(cmd[1])):
                one.ping.call_one(i).get(timeout=30)
        elif cmd[0] == "work":
            for _ in range(20):
                w.work.call().get(timeout=30)
        elif cmd[0] == "even":
            for _ in range(10):
                w.even.call().get(timeout=30)
        elif cmd[0] == "errors":
            for i in range(int(cmd[1])):
                try:
                    w.flaky.call(i).get(timeout=30)
                except A.ActorError:
                    pass
        elif cmd[0] == "die":
            r = int(cmd[1])
            try:
                w.slice(hosts=r // 4).die.call(pids[r]).get(timeout=60)
            except SupervisionError as e:
                print("caller got SupervisionError:", str(e).splitlines()[0], flush=True)
        elif cmd[0] == "pingall":
            for _ in range(5):
                for r in range(len(pids)):
                    try:
                        w.slice(hosts=r // 4, procs=r % 4).ping.call_one(r).get(timeout=30)
                    except SupervisionError:
                        pass
        elif cmd[0] == "log":
            r = int(cmd[1])
            w.slice(hosts=r // 4, procs=r % 4).say.call_one(cmd[2].rstrip("\n")).get(timeout=30)
        elif cmd[0] == "kill":
            os.kill(pids[int(cmd[1])], signal.SIGKILL)
        elif cmd[0] == "quit":
            break
        print("done", cmd[0], flush=True)
    hosts.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
