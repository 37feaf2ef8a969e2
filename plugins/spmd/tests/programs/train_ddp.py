"""A few steps of SGD with DDP over gloo (CPU): the reference's example, cut
down to what a test can check.  Rank r trains on rows [r*B, (r+1)*B) of a
fixed data set; with --single it trains alone on all the rows (the batches
concatenated).  The data, the initial weights and the learning rate are
dyadic rationals, so for the first 5 steps every value fits float64's
53-bit mantissa, every operation is exact whatever its order, and the DDP
run must give *exactly* the single-process parameters (from the 6th step
on, rounding makes the order of the additions show).  Rank 0 (or the single
run) writes the parameters to --out as JSON.

DDP averages the gradients over the ranks, and a division by a world size
that is not a power of two rounds: with --sum every rank's loss is the sum
over its rows and a DDP communication hook sums the gradients instead of
averaging them (the single run sums over all rows), which stays exact for
any number of ranks.

Options: --steps N, --batch B (per rank), --out FILE, --single, --sum,
--fail-rank R --fail-step S (rank R raises at step S),
--exit-rank R --exit-code C (rank R calls sys.exit(C) after setup),
--hang-rank R (rank R sleeps forever after setup: to be SIGKILLed),
--ready-file FILE (with --hang-rank: the hanging rank creates FILE once
every rank has joined the process group, so a kill lands after it),
--sleep-step SECONDS (slow steps, so that a kill lands mid-training).
"""

import argparse
import gc
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--out", default="")
p.add_argument("--single", action="store_true")
p.add_argument("--sum", action="store_true", help="sum losses and gradients instead of averaging them")
p.add_argument("--world", type=int, default=0, help="with --single: how many ranks' batches to concatenate")
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--fail-step", type=int, default=0)
p.add_argument("--exit-rank", type=int, default=-1)
p.add_argument("--exit-code", type=int, default=3)
p.add_argument("--hang-rank", type=int, default=-1)
p.add_argument("--sleep-step", type=float, default=0.0)
p.add_argument("--ready-file", default="")
args = p.parse_args()

torch.set_default_dtype(torch.float64)


def data(world):
    g = torch.Generator().manual_seed(1234)
    n = world * args.batch
    x = torch.randint(-2, 3, (n, 4), generator=g).double()
    y = torch.randint(-2, 3, (n, 2), generator=g).double()
    return x, y


def model():
    m = nn.Linear(4, 2)
    with torch.no_grad():
        m.weight.copy_(torch.arange(8).reshape(2, 4).double() / 8)
        m.bias.copy_(torch.tensor([0.5, -0.25]))
    return m


def params(m):
    return {k: v.detach().tolist() for k, v in m.state_dict().items()}


REDUCTION = "sum" if args.sum else "mean"
LR = 1 / 1024 if args.sum else 1 / 64


def sum_hook(state, bucket):
    """All-reduce a gradient bucket without dividing by the world size."""
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


if args.single:
    world = args.world
    x, y = data(world)
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    for _ in range(args.steps):
        opt.zero_grad()
        nn.functional.mse_loss(m(x), y, reduction=REDUCTION).backward()
        opt.step()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(params(m), f)
    sys.exit(0)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
print(f"rank {rank}/{world} local {os.environ['LOCAL_RANK']} host {os.uname().nodename} joined", flush=True)
if args.exit_rank >= 0 or args.hang_rank >= 0:
    dist.barrier()  # every rank has joined (and said so) before one leaves or hangs
if rank == args.exit_rank:
    sys.exit(args.exit_code)
if rank == args.hang_rank:
    print(f"rank {rank} pid {os.getpid()} waits to be killed", flush=True)
    if args.ready_file:
        open(args.ready_file, "w").close()
    time.sleep(3600)
x, y = data(world)
x, y = x[rank * args.batch:(rank + 1) * args.batch], y[rank * args.batch:(rank + 1) * args.batch]
m = DDP(model())
if args.sum:
    m.register_comm_hook(None, sum_hook)
opt = torch.optim.SGD(m.parameters(), lr=LR)
for step in range(args.steps):
    if rank == args.fail_rank and step == args.fail_step:
        raise RuntimeError(f"rank {rank} fails at step {step} on purpose")
    opt.zero_grad()
    loss = nn.functional.mse_loss(m(x), y, reduction=REDUCTION)
    loss.backward()
    opt.step()
    print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
    if args.sleep_step:
        time.sleep(args.sleep_step)
if rank == 0 and args.out:
    with open(args.out, "w") as f:
        json.dump(params(m.module), f)
# Every rank is done with its collectives before any tears its group down: a rank that reached
# destroy_process_group() while its peers were still finishing the last step aborted in gloo at exit
# ("terminate called without an active exception"), twice in five suite runs on the 3-host Slurm testbed.
dist.barrier()
# DDP's reducer (and its communication hook) hold the group and its gloo threads: release them
# first, so that destroy_process_group() ends those threads, rather than the interpreter's exit
# destroying them still joinable (the same abort, once in a suite run under two CPU hogs on the
# ssh testbed, after the barrier above was added).
del m, opt
gc.collect()
dist.destroy_process_group()
