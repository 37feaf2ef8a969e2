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

Usage: ``python bench/tensor_engine.py [--reps 5] [--ops 10000]`` (needs
torch and monarch-tensor-engine; nothing leaves the machine).  The side-by-
side run against torchmonarch 0.7.0 needs its venv (see bench/README.md);
without it the Monarch columns are left out and the script says so.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import monarch_core as monarch
from monarch_core.actor import Actor, endpoint, this_host
from monarch_core.spmd import setup_torch_elastic_env

MiB = 1 << 20


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ops", type=int, default=10000)
    args = ap.parse_args()
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
        rows.append(("dispatch: 10k element-wise ops into 4 procs + 1 fetch", f"{statistics.median(rates):,.0f} ops/s",
                     "", "≥ 10× torchmonarch's (about 500 ops/s quoted in the issue)"))
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
        fetches = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            monarch.inspect(big, gpus=1)
            fetches.append(time.perf_counter() - t0)
    setup_torch_elastic_env(pm)
    floor = pm.spawn("floor", Floor)
    floor.init.call().get(timeout=120)
    f_ar = max(floor.collective.call("all_reduce", 64 * MiB, args.reps).get(timeout=600).values())
    f_ag = max(floor.collective.call("all_gather", 16 * MiB, args.reps).get(timeout=600).values())
    one = floor.slice(gpus=1)
    returns = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        one.tensor.call_one(64 * MiB).get(timeout=120)
        returns.append(time.perf_counter() - t0)
    floor.done.call().get(timeout=60)
    rows.append(("all-reduce 64 MiB float32, 4 procs", f"{engine_ar * 1e3:.1f} ms", f"{f_ar * 1e3:.1f} ms",
                 f"{engine_ar / f_ar:.2f}× the floor (goal ≤ 1.2×)"))
    rows.append(("all-gather 16 MiB per proc, 4 procs", f"{engine_ag * 1e3:.1f} ms", f"{f_ag * 1e3:.1f} ms",
                 f"{engine_ag / f_ag:.2f}× the floor (goal ≤ 1.2×)"))
    fm, rm = statistics.median(fetches), statistics.median(returns)
    rows.append(("fetch_shard 64 MiB vs the same tensor returned by an endpoint", f"{fm * 1e3:.1f} ms",
                 f"{rm * 1e3:.1f} ms", f"{fm / rm:.2f}× the endpoint (goal ≤ 1×)"))
    print("| row | monarch-core engine | floor / reference path | ratio, goal |")
    print("|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print("\n(torchmonarch 0.7.0 side by side: not run here; its venv is not installed on this machine)")
    pm.stop().get(timeout=60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
