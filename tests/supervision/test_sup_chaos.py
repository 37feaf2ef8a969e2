"""Chaos: seeded random SIGKILLs of workers during a stream of calls from two
client threads.  Every call either succeeds (with the right value) or fails
with SupervisionError / ActorError -- nothing else -- none hangs (each future
gets a 20 s timeout), calls to slices that never lost a rank succeed, and the
client never deadlocks."""

from __future__ import annotations

import os
import random
import signal
import threading
import traceback

import pytest

from monarch_core.actor import Actor, ActorError, current_rank, endpoint, this_host
from monarch_core.errors import SupervisionError

from _helpers import T, fresh
from _helpers.faults import join_hook_threads
from _helpers.procs import kill_pids, wait_pids_gone

NPROCS = 8
CALLS_PER_THREAD = 150
KILLS = 3
FUTURE_TIMEOUT = 20.0


class ChaosWorker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def echo(self, x: int) -> tuple:
        return (current_rank().rank, x)

    @endpoint
    async def aecho(self, x: int) -> tuple:
        return (current_rank().rank, x)

    @endpoint
    def maybe_raise(self, x: int) -> int:
        if x % 2:
            raise ValueError(f"odd {x}")
        return x


def _plan(rng: random.Random, thread: int) -> list[dict]:
    ops = []
    for i in range(CALLS_PER_THREAD):
        a = rng.randrange(NPROCS)
        b = rng.randrange(a + 1, NPROCS + 1)
        if rng.random() < 0.3:
            b = a + 1
        adverbs = ["call", "choose", "stream", "broadcast"] + (["call_one"] if b - a == 1 else [])
        adverb = rng.choice(adverbs)
        ep = rng.choice(["echo", "aecho", "maybe_raise"])
        if adverb == "broadcast":
            ep = "echo"  # an exception in a broadcast would kill the actor (tested elsewhere)
        ops.append(
            {
                "i": i,
                "ranks": list(range(a, b)),
                "adverb": adverb,
                "ep": ep,
                "x": thread * 1000 + i,
                "kill": None,
            }
        )
    return ops


def _run_op(mesh, op: dict) -> tuple[str, object]:
    """Run one call; return (outcome, detail): outcome is 'ok', 'actor_error',
    'supervision_error', 'hang' or 'bad'."""
    a, b = op["ranks"][0], op["ranks"][-1] + 1
    view = mesh.slice(gpus=slice(a, b))
    ep = getattr(view, op["ep"])
    x = op["x"]
    try:
        if op["adverb"] == "broadcast":
            ep.broadcast(x)
            return "ok", None
        if op["adverb"] == "stream":
            futs = list(ep.stream(x))
            results, errors = [], []
            for f in futs:
                try:
                    results.append(f.get(timeout=FUTURE_TIMEOUT))
                except TimeoutError:
                    return "hang", "stream future"
                except (ActorError, SupervisionError) as e:
                    errors.append(e)
            if errors:
                return ("supervision_error" if any(isinstance(e, SupervisionError) for e in errors) else "actor_error"), errors[0]
            return "ok", results
        fut = getattr(ep, op["adverb"])(x)
        try:
            return "ok", fut.get(timeout=FUTURE_TIMEOUT)
        except TimeoutError:
            return "hang", op["adverb"]
    except ActorError as e:
        return "actor_error", e
    except SupervisionError as e:
        return "supervision_error", e
    except BaseException as e:  # noqa: BLE001
        return "bad", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"


def _check_value(op: dict, value: object) -> str | None:
    n = len(op["ranks"])
    x = op["x"]
    ad, ep = op["adverb"], op["ep"]
    if ad == "broadcast":
        return None
    if ep == "maybe_raise":
        if x % 2:
            return f"odd {x} returned {value!r} instead of raising"
        expect_one = x
        if ad == "call":
            return None if value.values() == [x] * n else f"call -> {value!r}"
        if ad == "stream":
            return None if value == [x] * n else f"stream -> {value!r}"
        return None if value == expect_one else f"{ad} -> {value!r}"
    if ad == "call":
        return None if value.values() == [(r, x) for r in range(n)] else f"call -> {value!r}"
    if ad == "stream":
        return None if sorted(value) == [(r, x) for r in range(n)] else f"stream -> {value!r}"
    if ad == "call_one":
        return None if value == (0, x) else f"call_one -> {value!r}"
    return None if (isinstance(value, tuple) and value[1] == x and 0 <= value[0] < n) else f"choose -> {value!r}"


@pytest.mark.parametrize("seed", [20240611, 7])
def test_random_sigkills_during_calls(faults, seed) -> None:
    rng = random.Random(seed)
    pm = this_host().spawn_procs(per_host={"gpus": NPROCS})
    name = fresh("chaos")
    mesh = pm.spawn(name, ChaosWorker)
    pids = mesh.pid.call().get(timeout=60).values()
    try:
        plans = [_plan(rng, 0), _plan(rng, 1)]
        victims = rng.sample(range(NPROCS), KILLS)
        for victim in victims:
            t = rng.randrange(2)
            i = rng.randrange(10, CALLS_PER_THREAD - 10)
            while plans[t][i]["kill"] is not None:
                i += 1
            plans[t][i]["kill"] = victim

        results: list[list] = [[], []]

        def run(t: int) -> None:
            for op in plans[t]:
                if op["kill"] is not None:
                    os.kill(pids[op["kill"]], signal.SIGKILL)
                results[t].append((op, *_run_op(mesh, op)))

        threads = [threading.Thread(target=run, args=(t,), name=f"chaos-client-{t}") for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=2 * CALLS_PER_THREAD * FUTURE_TIMEOUT / 10)
        assert not any(th.is_alive() for th in threads), "the client deadlocked (a client thread never finished)"

        killed = set(victims)
        problems = []
        counts: dict[str, int] = {}
        for t in range(2):
            assert len(results[t]) == CALLS_PER_THREAD
            for op, outcome, detail in results[t]:
                counts[outcome] = counts.get(outcome, 0) + 1
                touches_dead = bool(killed & set(op["ranks"]))
                where = f"thread {t} op {op['i']} {op['adverb']} {op['ep']}({op['x']}) on ranks {op['ranks']}"
                if outcome in ("hang", "bad"):
                    problems.append(f"{where}: {outcome}: {detail}")
                elif outcome == "supervision_error" and not touches_dead:
                    problems.append(f"{where}: SupervisionError although no rank of it died: {detail}")
                elif outcome == "actor_error" and not (op["ep"] == "maybe_raise" and op["x"] % 2):
                    if not touches_dead:
                        problems.append(f"{where}: unexpected ActorError: {detail}")
                elif outcome == "ok" and op["adverb"] != "broadcast":
                    bad = _check_value(op, detail)
                    if bad:
                        problems.append(f"{where}: wrong value: {bad}")
                elif outcome == "ok" and op["ep"] == "maybe_raise" and op["x"] % 2:
                    problems.append(f"{where}: an odd maybe_raise succeeded")
        assert not problems, f"{len(problems)} bad calls (outcomes {counts}):\n" + "\n".join(problems[:20])
        assert counts.get("supervision_error", 0) > 0  # the kills were felt

        # every killed rank was reported to the hook, once
        failures = faults.wait_mesh(name, n=KILLS, timeout=T)
        join_hook_threads()
        failures = faults.for_mesh(name)
        assert len(failures) == KILLS, [str(f) for f in failures]
        for victim in victims:
            assert sum(f"{{'gpus': {victim}/{NPROCS}}}" in str(f) for f in failures) == 1
        # the survivors still answer
        for r in sorted(set(range(NPROCS)) - killed):
            assert mesh.slice(gpus=r).echo.call_one(7).get(timeout=T) == (0, 7)
    finally:
        pm.stop().get(timeout=60)
        kill_pids(wait_pids_gone(pids, 5.0))
