"""Leader/follower reading: a thread blocked in ``Future.get`` and a proc's
first actor read the proc's sockets themselves while they wait.

These tests pin what that must not break: a busy first actor does not starve
the other actors of its proc, many threads waiting at once each get their own
result, futures resolved by a thread that is not reading still wake a leader,
and Ctrl-C during ``get`` interrupts it without damaging the connection.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

from monarch_core.actor import Actor, Channel, Future, endpoint, this_host

from _helpers import fresh


# Shared by the actors of one worker process (module globals of the worker).
_released = threading.Event()


class Blocker(Actor):
    @endpoint
    def block(self) -> bool:
        # Busy far longer than the poller's linger: the proc's sockets must
        # be read by someone else meanwhile.
        return _released.wait(30)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Helper(Actor):
    @endpoint
    def release(self) -> int:
        _released.set()
        return os.getpid()


class Echo(Actor):
    @endpoint
    def echo(self, x: object) -> object:
        return x


def test_busy_first_actor_does_not_starve_its_proc() -> None:
    pm = this_host().spawn_procs(per_host={"p": 1})
    try:
        blocker = pm.spawn(fresh("blocker"), Blocker)  # the proc's first actor: it reads while idle
        helper = pm.spawn(fresh("helper"), Helper)
        pid = blocker.pid.call_one().get(timeout=30)
        blocked = blocker.block.call_one()
        # Only a reader other than the blocked actor's loop can deliver this.
        assert helper.release.call_one().get(timeout=20) == pid
        assert blocked.get(timeout=30) is True
        assert blocker.pid.call_one().get(timeout=30) == pid
    finally:
        pm.stop().get()


def test_many_threads_waiting_at_once_each_get_their_own_result(procs) -> None:
    mesh = procs.spawn(fresh("echo"), Echo)
    n_threads, n_calls = 8, 150
    errors: list[BaseException] = []
    bad: list[tuple] = []

    def worker(t: int) -> None:
        one = mesh.slice(gpus=t % 4)
        try:
            for i in range(n_calls):
                got = one.echo.call_one((t, i)).get(timeout=30)
                if got != (t, i):
                    bad.append((t, i, got))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
    assert bad == []


def test_future_resolved_by_another_thread_wakes_a_waiting_caller(procs) -> None:
    # A local send resolves the receiver's future on the sending thread,
    # which reads no socket: the caller blocked in get() must still wake.
    port, recv = Channel.open()
    t = threading.Timer(0.2, port.send, args=("late",))
    t.start()
    try:
        assert recv.recv().get(timeout=30) == "late"
    finally:
        t.join()

    async def later() -> int:
        import asyncio

        await asyncio.sleep(0.1)
        return 42

    assert Future(coro=later()).get(timeout=30) == 42
    # ... and the caller still leads afterwards: remote replies keep arriving.
    mesh = procs.spawn(fresh("echo"), Echo)
    assert mesh.slice(gpus=0).echo.call_one("x").get(timeout=30) == "x"


SIGINT_CLIENT = """
import os, signal, sys, threading, time
from monarch_core.actor import Actor, endpoint, this_host

class Slow(Actor):
    @endpoint
    def slow(self) -> str:
        time.sleep(3)
        return "slow"

    @endpoint
    def echo(self, x):
        return x

pm = this_host().spawn_procs(per_host={"p": 1})
m = pm.spawn("slow", Slow)
assert m.echo.call_one(1).get(timeout=30) == 1
for attempt in range(3):
    timer = threading.Timer(0.3, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        m.slow.call_one().get(timeout=30)
        print("NOT INTERRUPTED", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    timer.join()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    # the connection survived: calls still go through, in order
    for i in range(50):
        assert m.echo.call_one(i).get(timeout=30) == i
print("STILL WORKS", flush=True)
pm.stop().get()
"""


def test_ctrl_c_interrupts_get_and_the_client_keeps_working(tmp_path) -> None:
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(SIGINT_CLIENT))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.stdout.count("INTERRUPTED") == 3 and "NOT INTERRUPTED" not in r.stdout, r.stdout
    assert "STILL WORKS" in r.stdout
    assert "Traceback" not in r.stderr, r.stderr
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
