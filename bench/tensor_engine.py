"""The distributed tensor engine's rows (issue targets, never asserted):

* dispatch: 10,000 small element-wise ops issued into a 4-proc mesh, then one
  ``fetch_shard`` (ops per second, client side, from the first op to the
  value);
* collectives: ``reduce_`` (all-reduce, sum) of 64 MiB float32 across the 4
  procs and ``reduce(..., "stack")`` (all-gather, 16 MiB per proc), against
  the floor: ``torch.distributed`` gloo ``all_reduce`` / ``all_gather``
  called directly in the same procs (an actor there, after
  ``setup_torch_elastic_env``);
* fetch: ``fetch_shard`` of a 64 MiB tensor against returning the same tensor
  from an endpoint.

Usage: ``python bench/tensor_engine.py [--reps 5] [--ops 10000]
[--monarch-py PYTHON]``; ``--procs 4,16,64`` runs the dispatch row only, once
per mesh size (a one-host mesh of that many procs; ``--ops`` small for the
large ones), and prints each size's rate against the first's (issue 40: a
batch of ops is one cast to the mesh, so the rate should barely fall as the
mesh grows) (needs torch, monarch-tensor-engine and, for the
floor's ``setup_torch_elastic_env``, monarch-spmd; nothing leaves the
machine).  The dispatch and fetch rows run side by side with
torchmonarch 0.7.0 on the same script, in its venv (``--monarch-py``,
default ``$MONARCH_PY`` or ``/tmp/anchors/monarch/bin/python``; see
bench/README.md); its collectives fail on CPU (they need NCCL), so those rows
have the floor only.  Without the venv the Monarch column is left out and the
script says so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time

import torch

import monarch_core as monarch
from monarch_core.actor import Actor, endpoint, this_host
from monarch_core.spmd import setup_torch_elastic_env

MiB = 1 << 20
DEFAULT_MONARCH_PY = "/tmp/anchors/monarch/bin/python"

#: the same dispatch and fetch measurements, for torchmonarch 0.7.0 (run in its venv; prints JSON)
ANCHOR = r"""
import json, statistics, sys, time
import torch
import monarch
from monarch.actor import this_host
ops, reps = int(sys.argv[1]), int(sys.argv[2])
pm = this_host().spawn_procs(per_host={"gpus": 4})
with pm.activate():
    x = torch.zeros(16)
    monarch.fetch_shard(x).result()
    rates = []
    for _ in range(max(1, reps // 2)):
        t0 = time.perf_counter()
        for _ in range(ops):
            x = x + 1
        monarch.fetch_shard(x).result()
        rates.append(ops / (time.perf_counter() - t0))
    big = torch.ones(64 * (1 << 20) // 4)
    monarch.fetch_shard(big[:1]).result()
    fetches = []
    for _ in range(reps):
        t0 = time.perf_counter()
        monarch.fetch_shard(big, {"gpus": 1}).result()
        fetches.append(time.perf_counter() - t0)
print(json.dumps({"rate": statistics.median(rates), "fetch": statistics.median(fetches)}))
pm.stop().get()
"""


def anchor(python: str, ops: int, reps: int) -> tuple[dict | None, str]:
    """torchmonarch's figures, or None and why not."""
    if not os.path.exists(python):
        return None, (f"torchmonarch 0.7.0 side by side: not run, {python} does not exist (create it: python3 -m venv "
                      f"/tmp/anchors/monarch && /tmp/anchors/monarch/bin/pip install torch==2.13.0 torchmonarch==0.7.0)")
    try:
        out = subprocess.run([python, "-c", ANCHOR, str(ops), str(reps)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return None, "torchmonarch 0.7.0 side by side: it did not finish within 900 s"
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 and not lines:
        return None, f"torchmonarch 0.7.0 side by side failed (exit {out.returncode}): {out.stderr.strip()[-400:]}"
    return json.loads(lines[-1]), f"torchmonarch 0.7.0 side by side: {python}"


class Floor(Actor):
    """torch.distributed called directly in the procs: the floor of the collectives."""

    @endpoint
    def init(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")

    @endpoint
    def collective(self, kind: str, nbytes: int, reps: int) -> float:
        import torch.distributed as dist

        n = nbytes // 4
        x = torch.ones(n)
        if kind == "all_reduce":
            dist.all_reduce(x)
            t0 = time.perf_counter()
            for _ in range(reps):
                dist.all_reduce(x)
        else:
            outs = [torch.empty(n) for _ in range(dist.get_world_size())]
            dist.all_gather(outs, x)
            t0 = time.perf_counter()
            for _ in range(reps):
                dist.all_gather(outs, x)
        dist.barrier()
        return (time.perf_counter() - t0) / reps

    @endpoint
    def tensor(self, nbytes: int) -> torch.Tensor:
        return torch.ones(nbytes // 4)

    @endpoint
    def done(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()


def dispatch_rate(procs: int, ops: int, reps: int) -> tuple[float, float, float]:
    """Into a one-host mesh of ``procs`` procs, the medians of ``reps`` runs
    of ``ops`` element-wise ops: (issue rate: ops per second of the client's
    loop, the batches' sends included; the client thread's CPU per op, in
    microseconds; end-to-end rate: from the first op to one fetched value,
    which waits for the procs to run them all)."""
    pm = this_host().spawn_procs(per_host={"gpus": procs})
    try:
        with pm.activate():
            x = torch.zeros(16)
            monarch.inspect(x)
            issue, cpu, total = [], [], []
            for _ in range(max(1, reps)):
                t0, c0 = time.perf_counter(), time.thread_time()
                for _ in range(ops):
                    x = x + 1
                t_issued, c1 = time.perf_counter(), time.thread_time()  # every full batch sent
                monarch.inspect(x)
                t1 = time.perf_counter()
                issue.append(ops / (t_issued - t0))
                cpu.append((c1 - c0) / ops * 1e6)
                total.append(ops / (t1 - t0))
        return statistics.median(issue), statistics.median(cpu), statistics.median(total)
    finally:
        pm.stop().get(timeout=300)


def scaling(sizes: list[int], ops: int, reps: int) -> int:
    """The ``--procs`` axis: the dispatch row at each mesh size."""
    print(f"| procs | issue ({ops} element-wise ops) | client CPU per op | end to end (+1 fetch) | issue vs "
          f"{sizes[0]} procs |")
    print("|---|---|---|---|---|")
    first = None
    for n in sizes:
        issue, cpu, total = dispatch_rate(n, ops, reps)
        first = first or issue
        print(f"| {n} | {issue:,.0f} ops/s | {cpu:.0f} µs | {total:,.0f} ops/s | {issue / first:.2f}× |", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ops", type=int, default=10000)
    ap.add_argument("--procs", default="",
                    help="comma-separated mesh sizes (4,16,64): the dispatch row only, once per size")
    ap.add_argument("--monarch-py", default=os.environ.get("MONARCH_PY", DEFAULT_MONARCH_PY),
                    help="torchmonarch 0.7.0's venv python (default $MONARCH_PY, else %(default)s)")
    args = ap.parse_args()
    if args.procs:
        return scaling([int(n) for n in args.procs.split(",")], args.ops, args.reps)
    theirs, note = anchor(args.monarch_py, args.ops, args.reps)
    pm = this_host().spawn_procs(per_host={"gpus": 4})
    rows = []
    with pm.activate():
        x = torch.zeros(16)
        monarch.inspect(x)
        rates = []
        for _ in range(max(1, args.reps // 2)):
            t0 = time.perf_counter()
            for _ in range(args.ops):
                x = x + 1
            monarch.inspect(x)
            rates.append(args.ops / (time.perf_counter() - t0))
        rate = statistics.median(rates)
        if theirs:
            rows.append(("dispatch: 10k element-wise ops into 4 procs + 1 fetch", f"{rate:,.0f} ops/s",
                         f"torchmonarch {theirs['rate']:,.0f} ops/s",
                         f"{rate / theirs['rate']:.1f}× torchmonarch's (goal ≥ 10×)"))
        else:
            rows.append(("dispatch: 10k element-wise ops into 4 procs + 1 fetch", f"{rate:,.0f} ops/s", "",
                         "≥ 10× torchmonarch's (about 500 ops/s quoted in the issue)"))
        y = torch.ones(64 * MiB // 4)
        y.reduce_("gpus")
        monarch.inspect(y[:1])
        t0 = time.perf_counter()
        for _ in range(args.reps):
            y.reduce_("gpus")
        monarch.inspect(y[:1])
        engine_ar = (time.perf_counter() - t0) / args.reps
        z = torch.ones(16 * MiB // 4)
        g = z.reduce("gpus", "stack")
        monarch.inspect(g[0, :1])
        t0 = time.perf_counter()
        for _ in range(args.reps):
            g = z.reduce("gpus", "stack")
        monarch.inspect(g[0, :1])
        engine_ag = (time.perf_counter() - t0) / args.reps
        big = torch.ones(64 * MiB // 4)
        monarch.inspect(big[:1])
    setup_torch_elastic_env(pm)
    floor = pm.spawn("floor", Floor)
    floor.init.call().get(timeout=120)
    f_ar = max(floor.collective.call("all_reduce", 64 * MiB, args.reps).get(timeout=600).values())
    f_ag = max(floor.collective.call("all_gather", 16 * MiB, args.reps).get(timeout=600).values())
    one = floor.slice(gpus=1)
    fetches, returns = [], []
    for _ in range(args.reps * 2):  # alternated, so that both see the same machine
        t0 = time.perf_counter()
        one.tensor.call_one(64 * MiB).get(timeout=120)
        returns.append(time.perf_counter() - t0)
        with pm.activate():
            t0 = time.perf_counter()
            monarch.inspect(big, gpus=1)
            fetches.append(time.perf_counter() - t0)
    floor.done.call().get(timeout=60)
    rows.append(("all-reduce 64 MiB float32, 4 procs", f"{engine_ar * 1e3:.1f} ms", f"{f_ar * 1e3:.1f} ms",
                 f"{engine_ar / f_ar:.2f}× the floor (goal ≤ 1.2×)"))
    rows.append(("all-gather 16 MiB per proc, 4 procs", f"{engine_ag * 1e3:.1f} ms", f"{f_ag * 1e3:.1f} ms",
                 f"{engine_ag / f_ag:.2f}× the floor (goal ≤ 1.2×)"))
    fm, rm = statistics.median(fetches), statistics.median(returns)
    rows.append(("fetch_shard 64 MiB vs the same tensor returned by an endpoint", f"{fm * 1e3:.1f} ms",
                 f"{rm * 1e3:.1f} ms", f"{fm / rm:.2f}× the endpoint (goal ≤ 1×)"))
    if theirs:
        rows.append(("fetch_shard 64 MiB vs torchmonarch's", f"{fm * 1e3:.1f} ms",
                     f"torchmonarch {theirs['fetch'] * 1e3:.1f} ms", f"{fm / theirs['fetch']:.2f}× torchmonarch's"))
    print("| row | monarch-core engine | floor / reference path | ratio, goal |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\n({note}; its collectives need NCCL, so on CPU the collective rows compare with the floor only)")
    pm.stop().get(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
