"""monarch-core's own copy of the shared actor benchmark definitions.

    python bench/actor_bench.py --out monarch_core_run1.json [--quick]

``bench/run.py`` uses this file only when the shared anchor scripts
(``../shared/bench-anchors``) are absent; when they exist, monarch-core is measured with
the shared ``monarch_bench.py`` and ``BENCH_IMPL=monarch_core``.  This copy keeps their
definitions (counts, repeats, the cold spawn in a fresh child interpreter) and writes the
same JSON sections and keys, against ``monarch_core.actor`` only:

  import            ``import monarch_core.actor`` in fresh interpreters: one discarded, then 5
                    (quick: 3) timed; plus the cumulative ``-X importtime`` figure.
  spawn_cold        fresh interpreter (imports done): ``this_host()``, ``spawn_procs`` of 4 procs,
                    ``spawn`` of an actor on each, first reply from all (``pid.call().get()``);
                    one discarded warm-up child, then 3 (quick: 1).
  spawn_warm        the same in this driver with the host already up, 5 (quick: 2) after one
                    discarded; each mesh stopped and its procs gone before the next.
  memory            RSS / PSS / USS of the 4 idle workers after 3 s, and of any other process
                    under the driver.
  latency           ``one.noop.call_one().get()`` sequential: 200 warm-up, then 2000 calls x 3
                    (quick: 200 x 2); p50/p99 are medians over the repeats.
  latency_async     the same with ``await one.noop.call_one()`` inside ``asyncio.run``.
  throughput        10 000 ``call_one()`` issued, then ``.get()`` on each; x 3 (quick: x 1),
                    after 1 000 warm-up calls.
  broadcast_4/_16   ``mesh.noop.call().get()`` on the 4-proc mesh and on a fresh 16-proc mesh:
                    20 warm-up, then 200 x 3 (quick: 50 x 1).
  payload           to a second actor: echo (send and return) and send (return its size) of
                    1 MiB bytes (50 iterations, 5 warm-up), 64 MiB bytes (10, 2) and a 64 MiB
                    uint8 CPU torch tensor (10, 2); quick: 5/1, 2/1 and 3/1.
  leftover_processes_after_stop  processes still under the driver 1 s after the last stop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from importlib.metadata import PackageNotFoundError, version

from monarch_core.actor import Actor, endpoint, this_host

IMPL = "monarch_core"
DIST = "monarch-core"
PKG = "monarch_core"
MiB = 1 << 20
PROCS = 4


class Worker(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def noop(self) -> None:
        return None

    @endpoint
    def echo(self, x):
        return x

    @endpoint
    def nbytes_of(self, x) -> int:
        n = getattr(x, "nbytes", None)
        return len(x) if n is None else n


# ------------------------------------------------------------------ statistics
def percentile(values, q):
    """Linear interpolation between closest ranks, q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats_us(samples_ns):
    us = [s / 1e3 for s in samples_ns]
    return {
        "n": len(us),
        "p50_us": round(statistics.median(us), 1),
        "p90_us": round(percentile(us, 90), 1),
        "p99_us": round(percentile(us, 99), 1),
        "mean_us": round(statistics.fmean(us), 1),
        "min_us": round(min(us), 1),
        "max_us": round(max(us), 1),
    }


med = statistics.median


# ------------------------------------------------------------------ /proc
def slurp(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def memory_kib(pid):
    m = {"pid": pid, "rss_kib": None, "pss_kib": None, "uss_kib": None}
    for line in slurp(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            m["rss_kib"] = int(line.split()[1])
    private = None
    for line in slurp(f"/proc/{pid}/smaps_rollup").splitlines():
        key, _, rest = line.partition(":")
        if key == "Pss":
            m["pss_kib"] = int(rest.split()[0])
        elif key in ("Private_Clean", "Private_Dirty"):
            private = (private or 0) + int(rest.split()[0])
    m["uss_kib"] = private
    return m


def describe(pid):
    return slurp(f"/proc/{pid}/comm").strip(), slurp(f"/proc/{pid}/cmdline").replace("\0", " ").strip()[:160]


def descendants(root):
    by_parent = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = slurp(f"/proc/{entry}/stat")
        try:  # the ppid is the second field after the command's closing parenthesis
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (IndexError, ValueError):
            continue
        by_parent.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in by_parent.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(found)


def others_memory(root, exclude):
    rows = []
    for pid in descendants(root):
        if pid in exclude:
            continue
        comm, cmd = describe(pid)
        if comm in ("ps", "sh", "du", "cut", "awk"):
            continue
        rows.append({**memory_kib(pid), "comm": comm, "cmd": cmd})
    return rows


def wait_gone(pids, timeout=15.0):
    end = time.time() + timeout
    while time.time() < end:
        if not any(os.path.exists(f"/proc/{p}") for p in pids):
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------ environment
def du(path, flag):
    try:
        r = subprocess.run(["du", flag, path], capture_output=True, text=True, timeout=300, check=False)
        return r.stdout.split()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return None


def machine():
    cpu = next((line.split(":", 1)[1].strip() for line in slurp("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), "")
    mem = next((int(line.split()[1]) for line in slurp("/proc/meminfo").splitlines()
                if line.startswith("MemTotal:")), 0)
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "venv": sys.prefix,
        "platform": platform.platform(),
        "cpu_model": cpu,
        "nproc": os.cpu_count(),
        "mem_total_gib": round(mem / MiB, 1),
        "loadavg_start": os.getloadavg(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def sec_install():
    import monarch_core

    nbytes = du(sys.prefix, "-sb")
    return {"venv": sys.prefix, "venv_du_h": du(sys.prefix, "-sh"), "venv_bytes": int(nbytes) if nbytes else None,
            "pkg_du_h": du(os.path.dirname(monarch_core.__file__), "-sh")}


def sec_import(module, repeats):
    code = f"import time; t=time.perf_counter(); import {module}; print(time.perf_counter()-t)"
    walls = []
    for i in range(repeats + 1):  # the first one warms the page cache
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
        if r.returncode != 0:
            return {"error": r.stderr[-2000:]}
        if i:
            walls.append(float(r.stdout.strip().splitlines()[-1]))
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                       capture_output=True, text=True, timeout=300, check=False)
    cumulative = None
    for line in r.stderr.splitlines():
        cols = line.split("|")
        if len(cols) == 3 and cols[2].startswith(" " + module) and cols[2].strip() == module:
            try:
                cumulative = int(cols[1])
            except ValueError:
                pass
    return {"module": module, "wall_ms_median": round(med(walls) * 1e3, 1),
            "wall_ms_runs": [round(w * 1e3, 1) for w in walls], "x_importtime_us": cumulative}


# ------------------------------------------------------------------ spawning
def values(value_mesh):
    return [v for _, v in value_mesh.items()]


def new_mesh(n, name):
    procs = this_host().spawn_procs(per_host={"procs": n})
    mesh = procs.spawn(name, Worker)
    return procs, mesh, values(mesh.pid.call().get())


def cold_child():
    """Runs in a fresh interpreter (imports already done); prints one JSON line."""
    t0 = time.perf_counter()
    host = this_host()
    t1 = time.perf_counter()
    procs = host.spawn_procs(per_host={"procs": PROCS})
    pids = values(procs.spawn("w", Worker).pid.call().get())
    t2 = time.perf_counter()
    assert len(set(pids)) == PROCS and os.getpid() not in pids
    procs.stop().get()
    t3 = time.perf_counter()
    print(json.dumps({"this_host_s": t1 - t0, "procs_actors_first_reply_s": t2 - t1, "total_s": t2 - t0,
                      "stop_s": t3 - t2, "pids": pids}), flush=True)


def run_cold_child():
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child-cold-spawn"],
                       capture_output=True, text=True, timeout=300, check=False)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"cold-spawn child: exit status {r.returncode}\nstdout:\n{r.stdout[-1500:]}\n"
                           f"stderr:\n{r.stderr[-3000:]}")
    return json.loads(lines[-1])


def sec_spawn_cold(reps):
    run_cold_child()  # discarded: warms the page cache
    runs = [run_cold_child() for _ in range(reps)]

    def m(key):
        return round(med(r[key] for r in runs), 3)

    return {
        "what": "fresh interpreter: this_host().spawn_procs(4) + spawn + first reply from all (import excluded)",
        "total_s_median": m("total_s"),
        "this_host_s_median": m("this_host_s"),
        "procs_actors_s_median": m("procs_actors_first_reply_s"),
        "stop_s_median": m("stop_s"),
        "runs": [{k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()} for r in runs],
    }


def sec_spawn_warm(reps):
    spawns, stops = [], []
    for i in range(reps + 1):  # the first one is discarded
        t0 = time.perf_counter()
        procs, _, pids = new_mesh(PROCS, f"warm{i}")
        spawned = time.perf_counter() - t0
        assert len(set(pids)) == PROCS
        t0 = time.perf_counter()
        procs.stop().get()
        stopped = time.perf_counter() - t0
        wait_gone(pids)
        time.sleep(0.5)
        if i:
            spawns.append(spawned)
            stops.append(stopped)
    return {"what": "same driver, host already up: spawn_procs(4) + spawn + first reply from all",
            "median_s": round(med(spawns), 3), "runs_s": [round(t, 3) for t in spawns],
            "stop_s_median": round(med(stops), 3)}


# ------------------------------------------------------------------ sections on a live mesh
def sec_memory(pids):
    time.sleep(3.0)  # idle
    workers = [memory_kib(p) for p in pids]
    others = others_memory(os.getpid(), set(pids))

    def mib(key):
        return round(med(w[key] for w in workers) / 1024, 1)

    return {
        "worker_rss_mib_median": mib("rss_kib"),
        "worker_pss_mib_median": mib("pss_kib"),
        "worker_uss_mib_median": mib("uss_kib"),
        "worker_has_libtorch_mapped": "libtorch" in slurp(f"/proc/{pids[0]}/maps"),
        "workers": workers,
        "driver": memory_kib(os.getpid()),
        "other_processes": others,
        "other_processes_count": len(others),
        "other_processes_rss_mib_sum": round(sum(o["rss_kib"] or 0 for o in others) / 1024, 1),
        "other_processes_pss_mib_sum": round(sum(o["pss_kib"] or 0 for o in others) / 1024, 1),
    }


def latency_result(what, repeats):
    return {"what": what, "p50_us": med(r["p50_us"] for r in repeats),
            "p99_us": med(r["p99_us"] for r in repeats), "repeats": repeats}


def timed_repeats(fn, n, reps, warm):
    """``warm`` untimed calls of ``fn``, then ``reps`` x ``n`` timed ones;
    the summary of each repeat, and the last result."""
    for _ in range(warm):
        fn()
    clock = time.perf_counter_ns
    repeats = []
    out = None
    for _ in range(reps):
        samples = []
        for _ in range(n):
            t = clock()
            out = fn()
            samples.append(clock() - t)
        repeats.append(stats_us(samples))
    return repeats, out


def sec_latency(one, n, reps, warm):
    repeats, _ = timed_repeats(lambda: one.noop.call_one().get(), n, reps, warm)
    return latency_result(f"sequential one.noop.call_one().get(), {n} calls x {reps}", repeats)


def sec_latency_async(one, n, reps, warm):
    async def run():
        for _ in range(warm):
            await one.noop.call_one()
        clock = time.perf_counter_ns
        repeats = []
        for _ in range(reps):
            samples = []
            for _ in range(n):
                t = clock()
                await one.noop.call_one()
                samples.append(clock() - t)
            repeats.append(stats_us(samples))
        return repeats

    return latency_result(f"sequential `await one.noop.call_one()` from asyncio in the driver, {n} calls x {reps}",
                          asyncio.run(run()))


def sec_throughput(one, n, reps):
    for fut in [one.noop.call_one() for _ in range(n // 10)]:
        fut.get()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        futs = [one.noop.call_one() for _ in range(n)]
        t1 = time.perf_counter()
        for fut in futs:
            fut.get()
        t2 = time.perf_counter()
        rates.append({"calls_per_s": round(n / (t2 - t0)), "issue_s": round(t1 - t0, 3),
                      "total_s": round(t2 - t0, 3)})
    return {"what": f"{n} pipelined one.noop.call_one() then .get() each, x {reps}",
            "calls_per_s_median": med(r["calls_per_s"] for r in rates), "repeats": rates}


def sec_broadcast(mesh, size, iters, reps, warm):
    repeats, vm = timed_repeats(lambda: mesh.noop.call().get(), iters, reps, warm)
    assert len(values(vm)) == size
    return {"size": size, "p50_ms": round(med(r["p50_us"] for r in repeats) / 1e3, 3),
            "p99_ms": round(med(r["p99_us"] for r in repeats) / 1e3, 3), "repeats": repeats}


def payload_case(actor, label, obj, nbytes, iters, warm, check):
    for _ in range(warm):
        check(actor.echo.call_one(obj).get())
        actor.nbytes_of.call_one(obj).get()
    echo, send = [], []
    for _ in range(iters):
        t0 = time.perf_counter()
        back = actor.echo.call_one(obj).get()
        echo.append(time.perf_counter() - t0)
        check(back)
        del back
        t0 = time.perf_counter()
        n = actor.nbytes_of.call_one(obj).get()
        send.append(time.perf_counter() - t0)
        assert n == nbytes, (n, nbytes)
    e, s = med(echo), med(send)
    return {"case": label, "bytes": nbytes, "iters": iters,
            "echo_rtt_ms_median": round(e * 1e3, 2), "echo_mib_s": round(2 * nbytes / MiB / e, 1),
            "send_rtt_ms_median": round(s * 1e3, 2), "send_mib_s": round(nbytes / MiB / s, 1),
            "echo_rtt_ms_runs": [round(x * 1e3, 2) for x in echo],
            "send_rtt_ms_runs": [round(x * 1e3, 2) for x in send]}


def sec_payload(actor, quick):
    results = []
    for label, size, iters, warm in (("bytes 1 MiB", MiB, 50, 5), ("bytes 64 MiB", 64 * MiB, 10, 2)):
        if quick:
            iters, warm = max(2, iters // 10), 1
        data = os.urandom(size)

        def check(back, data=data):
            assert type(back) is bytes and len(back) == len(data)
            assert back[:64] == data[:64] and back[-64:] == data[-64:]

        results.append(payload_case(actor, label, data, size, iters, warm, check))
        del data
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - whatever breaks the import, the case is skipped
        results.append({"case": "torch tensor 64 MiB", "skipped": f"torch not importable: {e!r}"})
        return results
    x = torch.randint(0, 256, (64 * MiB,), dtype=torch.uint8)

    def tcheck(back):
        assert isinstance(back, torch.Tensor) and back.nbytes == x.nbytes
        assert torch.equal(back[:4096], x[:4096]) and torch.equal(back[-4096:], x[-4096:])

    r = payload_case(actor, "torch tensor 64 MiB (uint8, CPU)", x, x.nbytes, 3 if quick else 10, 1 if quick else 2,
                     tcheck)
    r["torch_version"] = torch.__version__
    results.append(r)
    return results


# ------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="monarch_core_results.json")
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    ap.add_argument("--child-cold-spawn", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_cold_spawn:
        cold_child()
        return
    q = args.quick
    lat_n, lat_reps = (200, 2) if q else (2000, 3)
    bc_iters, bc_reps = (50, 1) if q else (200, 3)
    res = {"framework": IMPL, "version": version(DIST), "quick": q, "machine": machine(), "errors": {},
           "definitions": "bench/actor_bench.py (the project's copy of the shared monarch_bench.py)"}
    try:
        res["torch_version"] = version("torch")
    except PackageNotFoundError:
        res["torch_version"] = None

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2, default=str)
            f.write("\n")

    def step(name, fn, *a):
        print(f"[{IMPL}] {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            res[name] = fn(*a)
        except Exception as e:  # noqa: BLE001 - record the failure, go on with the next section
            res["errors"][name] = traceback.format_exc()
            print(f"[{IMPL}] {name} FAILED: {e!r}", flush=True)
        print(f"[{IMPL}] {name} done in {time.perf_counter() - t0:.1f}s", flush=True)
        save()

    step("install", sec_install)
    step("import", sec_import, PKG + ".actor", 3 if q else 5)
    step("spawn_cold", sec_spawn_cold, 1 if q else 3)
    t0 = time.perf_counter()
    this_host()
    res["this_host_in_main_s"] = round(time.perf_counter() - t0, 3)
    step("spawn_warm", sec_spawn_warm, 2 if q else 5)

    procs4, mesh4, pids = new_mesh(PROCS, "mesh4")
    res["mesh4_pids"] = pids
    try:
        one = mesh4.slice(procs=0)
        step("memory", sec_memory, pids)
        step("latency", sec_latency, one, lat_n, lat_reps, 200)
        step("latency_async", sec_latency_async, one, lat_n, lat_reps, 200)
        step("throughput", sec_throughput, one, 10_000, 1 if q else 3)
        step("broadcast_4", sec_broadcast, mesh4, PROCS, bc_iters, bc_reps, 20)
        procs16 = None
        try:
            t0 = time.perf_counter()
            procs16, mesh16, _ = new_mesh(16, "mesh16")
            res["spawn16_warm_s"] = round(time.perf_counter() - t0, 3)
            step("broadcast_16", sec_broadcast, mesh16, 16, bc_iters, bc_reps, 20)
        except Exception:  # noqa: BLE001 - recorded like a failed section
            res["errors"]["broadcast_16_spawn"] = traceback.format_exc()
        if procs16 is not None:
            procs16.stop().get()
        step("payload", sec_payload, mesh4.slice(procs=1), q)
    finally:
        t0 = time.perf_counter()
        procs4.stop().get()
        res["stop_s"] = round(time.perf_counter() - t0, 3)
    time.sleep(1.0)
    res["leftover_processes_after_stop"] = [describe(p) for p in descendants(os.getpid())]
    res["machine"]["loadavg_end"] = os.getloadavg()
    save()
    print(f"[{IMPL}] wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
