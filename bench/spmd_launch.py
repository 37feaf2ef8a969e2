"""Time from launch to the first training step: ``monarch torchrun`` against
``srun ... torchrun`` on the Slurm testbed (issue: at most 1.2x that floor).

Both run inside one real ``sbatch`` job on 3 nodes, interleaved, with the
same script: ``init_process_group("gloo")``, one DDP step, and rank 0 writes
the wall-clock time of the end of that step.  A row's figure is that time
minus the time just before the launch command started (median of
``--reps``).  The floor is what a Slurm user runs today: ``srun -N3
--ntasks-per-node=1 torchrun --nnodes 3 --nproc-per-node 2 --node-rank
$SLURM_NODEID --master-addr <first node> ...``.

Needs the testbed up (``bash scripts/testbed/netns-up.sh 4 && bash
scripts/testbed/slurm-up.sh netns 3 4``; ``SLURM_CONF=/tmp/rt/slurm/slurm.conf``),
the project venv with torch, the slurm plugin and monarch-spmd (``monarch
torchrun``).  Nothing leaves the machine.  Usage: ``python
bench/spmd_launch.py [--reps 3] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FIRST_STEP = r'''
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
m = DDP(torch.nn.Linear(8, 8))
m(torch.ones(4, 8)).sum().backward()
dist.barrier()
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        f.write(repr(time.time()))
dist.destroy_process_group()
'''

DRIVER = r'''
import json, os, socket, subprocess, sys, time
here, reps, py, monarch = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
nodes = subprocess.run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]], capture_output=True,
                       text=True, check=True).stdout.split()
master = socket.gethostbyname(nodes[0])
rows = {"monarch torchrun": [], "srun + torchrun (floor)": []}
for rep in range(reps):
    for name in rows:
        out = f"{here}/first-{rep}-{name.split()[0]}"
        if name.startswith("monarch"):
            cmd = [monarch, "torchrun", "--hosts", "bench", "--nnodes", "3", "--nproc-per-node", "2",
                   f"{here}/first_step.py", out]
        else:
            port = 29400 + rep
            cmd = ["srun", "-N3", "--ntasks-per-node=1", "sh", "-c",
                   f"exec {py} -m torch.distributed.run --nnodes 3 --nproc-per-node 2 --node-rank $SLURM_NODEID "
                   f"--master-addr {master} --master-port {port} {here}/first_step.py {out}"]
        t0 = time.time()
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if not os.path.exists(out):
            print(name, "failed: rc", res.returncode, res.stdout[-3000:], res.stderr[-3000:], file=sys.stderr,
                  flush=True)
            continue
        if res.returncode != 0:  # the first step was reached (that is what is timed); say how it ended
            print(name, "reached its first step, then exited", res.returncode, res.stderr[-1500:], file=sys.stderr,
                  flush=True)
        rows[name].append(float(open(out).read()) - t0)
json.dump(rows, open(f"{here}/results.json", "w"))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the figures as JSON here too")
    args = ap.parse_args()
    env = dict(os.environ)
    env.setdefault("SLURM_CONF", "/tmp/rt/slurm/slurm.conf")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)])
    for k in [k for k in env if k.startswith("MONARCH_")]:
        del env[k]
    if subprocess.run(["sinfo", "-h"], env=env, capture_output=True, timeout=30).returncode != 0:
        print("the Slurm testbed is not up: bash scripts/testbed/netns-up.sh 4 && "
              "bash scripts/testbed/slurm-up.sh netns 3 4", file=sys.stderr)
        return 1
    here = Path(tempfile.mkdtemp(prefix="spmd-bench-"))
    (here / "first_step.py").write_text(textwrap.dedent(FIRST_STEP))
    (here / "driver.py").write_text(textwrap.dedent(DRIVER))
    monarch = str(Path(sys.executable).parent / "monarch")
    script = f"#!/bin/sh\ncd {here} && exec {sys.executable} driver.py {here} {args.reps} {sys.executable} {monarch}\n"
    res = subprocess.run(["sbatch", "--wait", "--parsable", "--nodes=3", "--job-name=spmd-bench",
                          f"--output={here}/out.txt"], input=script, text=True, capture_output=True, env=env,
                         timeout=300 + 120 * args.reps)
    if not (here / "results.json").exists():
        print(f"the job wrote no results (sbatch rc {res.returncode}):\n{res.stderr}\n"
              f"{(here / 'out.txt').read_text()[-3000:] if (here / 'out.txt').exists() else ''}", file=sys.stderr)
        return 1
    rows = json.loads((here / "results.json").read_text())
    floor = statistics.median(rows["srun + torchrun (floor)"]) if rows["srun + torchrun (floor)"] else float("nan")
    print("| launch to first DDP step, 3 Slurm nodes x 2 procs (inside sbatch) | median s | runs (s) | vs floor | goal |")
    print("|---|---|---|---|---|")
    for name, xs in rows.items():
        med = statistics.median(xs) if xs else float("nan")
        goal = "<= 1.2x" if name.startswith("monarch") else "floor"
        print(f"| {name} | {med:.2f} | {', '.join(f'{x:.2f}' for x in xs)} | {med / floor:.2f}x | {goal} |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
