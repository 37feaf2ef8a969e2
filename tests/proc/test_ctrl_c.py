"""Ctrl-C (SIGINT to the client's process group, as a terminal sends it) ends
a program that spawns, calls and stops procs in a loop -- also one run under
``asyncio.run``, whose handler only cancels the main task: the blocking
``.get()`` the task sits in raises ``CancelledError`` there, as an ``await``
would, instead of the loop running on (the reference's
``rapid_spawn_exit_stress``, which never reaches an ``await``).  Nothing is
left in the client's process group."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from _helpers.clients import PY, child_env, write_script

LOOP = r"""
import asyncio, sys
from monarch_core.actor import Actor, endpoint, this_host

class A(Actor):
    @endpoint
    def ping(self) -> int:
        return 1

def step(i):
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    a = procs.spawn("a", A)
    a.ping.call().get(timeout=120)
    procs.stop().get(timeout=120)
    print("iter", i, flush=True)

async def main():
    i = 0
    try:
        while True:  # never awaits: only the blocking waits can take the cancellation
            step(i)
            i += 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted", flush=True)

if sys.argv[1] == "asyncio":
    asyncio.run(main())
else:
    i = 0
    while True:
        step(i)
        i += 1
"""


def _group_members(pgid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


@pytest.mark.parametrize("how", ["asyncio", "plain"])
def test_one_ctrl_c_ends_a_spawn_stop_loop(tmp_path, how: str) -> None:
    script = write_script(tmp_path, LOOP)
    rng = random.Random(41)
    for trial in range(3):
        p = subprocess.Popen([PY, str(script), how], cwd=str(tmp_path), env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            seen: list[str] = []
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:  # into the loop: one iteration went through
                line = p.stdout.readline()
                if not line:
                    break
                seen.append(line)
                if line.startswith("iter"):
                    break
            assert seen and seen[-1].startswith("iter"), f"trial {trial}: the loop never ran\n{''.join(seen)}\n{p.stderr.read() if p.poll() is not None else ''}"
            time.sleep(rng.uniform(0.0, 1.5))  # somewhere in spawn, call or stop
            os.killpg(p.pid, signal.SIGINT)
            try:
                out, err = p.communicate(timeout=60)  # before: the asyncio loop never ended
            except subprocess.TimeoutExpired:
                pytest.fail(f"trial {trial} ({how}): the program did not end after one Ctrl-C")
            # ended by the KeyboardInterrupt, as a plain Python program is (or exit 0 once the task caught it)
            assert p.returncode in (-signal.SIGINT, 130, 1, 0), f"trial {trial}: rc={p.returncode}\n{err}"
            assert "KeyboardInterrupt" in err or "interrupted" in out, f"trial {trial}:\n{out}\n{err}"
            assert "did not stop" not in err, err
            left = [0]
            t = time.monotonic() + 30
            while left and time.monotonic() < t:  # (procs have sessions of their own and a parent-death signal)
                left = _group_members(p.pid)
                time.sleep(0.2)
            assert not left, f"trial {trial}: processes left in the client's group: {left}"
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
