"""Start-up figures of the slurm scheduler on a real cluster (docs/slurm.md, "Figures").

    SLURM_CONF=/tmp/rt/slurm/slurm.conf python plugins/scheduler_slurm/bench/startup.py [--runs 3] [--nodes 3]
        [--only inside|outside] [--no-pyc-cache]

* **inside**: one ``sbatch -N<nodes>`` job that, after one warm-up round (not
  counted), ``--runs`` times times, interleaved:

  - the floor ``srun -N<nodes> python -c 'import monarch_core.actor'`` (a job
    step that only starts Python and imports the API on every node);
  - **cold**: a fresh client process, from ``hosts_from_config(...)``
    (entry ``scheduler = "slurm"``) to the first reply of ``nodes`` x 4
    actors -- what a program that brings its hosts up once sees (its client
    runtime starts in that call);
  - **warm**: the same in the job's own client process, whose runtime is
    already up (the figure earlier versions of this script gave);

  and prints each against the floor, with the goal (<= 1.5x the floor), and
  the CPU every process on the machine used for each (the testbed's nodes
  share its kernel and cores: CPU / cores bounds the wall time from below);
* **outside**: ``--runs`` clients on this host, each timing ``hosts_from_config(...)``
  (an entry with ``nodes``, so a batch job is submitted) to the first reply, split
  into submit -> the job runs (Slurm's scheduling: ``batch_sched_delay`` and its
  ~1 s tick), the job runs -> every worker answers, and -> the first reply.

Bytecode: this environment may set ``PYTHONDONTWRITEBYTECODE=1``, with which
an editable install compiles every module it imports at every interpreter
start, on every node (docs/performance.md, "How it is measured").  Unless
``--no-pyc-cache``, the job writes and reuses bytecode under a cache of its
own (``PYTHONPYCACHEPREFIX``; nothing is written into the checkout), as an
installed package has it; the warm-up round fills it.

Prints one JSON object (medians, and every run), then one line per figure.
Standard library plus monarch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

INSIDE = r'''
import json, os, subprocess, sys, time
t0 = time.monotonic()
from monarch_core.actor import Actor, endpoint, hosts_from_config
import_s = time.monotonic() - t0

class Ping(Actor):
    @endpoint
    def ping(self):
        return os.getpid()

def busy():  # CPU seconds every process on this machine used so far (the nodes share its kernel)
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")

def bring_up():
    c0 = busy()
    t0 = time.monotonic()
    hm = hosts_from_config("bench")
    t1 = time.monotonic()
    pm = hm.spawn_procs(per_host={"gpus": 4})
    n = len(pm.spawn("ping", Ping).ping.call().get(timeout=120).values())
    t2 = time.monotonic()
    cpu = busy() - c0
    hm.shutdown().get(timeout=60)
    return {"hosts_ready_s": t1 - t0, "first_reply_s": t2 - t0, "actors": n, "cpu_s": cpu}

if sys.argv[1] == "once":  # a fresh client: the cold figure
    print("ONCE " + json.dumps(bring_up()), flush=True)
    sys.exit(0)

floor_cpu = []

def floor():
    c0 = busy()
    f0 = time.monotonic()
    subprocess.run(["srun", "--overlap", f"-N{os.environ['SLURM_JOB_NUM_NODES']}", sys.executable, "-c",
                    "import monarch_core.actor"], check=True, timeout=120)
    f1 = time.monotonic()
    floor_cpu.append(busy() - c0)
    return f1 - f0

def cold():
    out = subprocess.run([sys.executable, sys.argv[0], "once"], capture_output=True, text=True, timeout=300)
    for line in out.stdout.splitlines():
        if line.startswith("ONCE "):
            return json.loads(line[5:])
    raise SystemExit("the cold client printed no ONCE line (rc %d):\n%s" % (out.returncode, out.stderr[-4000:]))

warmup = {"floor_s": floor(), "cold": cold(), "warm": bring_up()}  # fills the bytecode cache; not counted
runs = []
for i in range(int(sys.argv[1])):
    order = ("floor", "cold", "warm") if i % 2 == 0 else ("warm", "cold", "floor")
    r = {}
    for what in order:
        r[what] = floor() if what == "floor" else cold() if what == "cold" else bring_up()
    runs.append({"floor_s": r["floor"], "floor_cpu_s": floor_cpu[-1], "cold": r["cold"], "warm": r["warm"]})
print("RESULT " + json.dumps({"runs": runs, "warmup": warmup, "client_import_s": import_s}), flush=True)
'''

OUTSIDE = r'''
import json, logging, re, sys, time
marks = {}

class Marks(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        if "submitted Slurm job" in msg:
            marks["submitted"] = time.monotonic()
        elif re.search(r"Slurm job \d+ runs on", msg):
            marks["running"] = time.monotonic()

logging.getLogger("monarch.slurm").addHandler(Marks())
logging.getLogger("monarch.slurm").setLevel(logging.INFO)
from monarch_core.actor import Actor, endpoint, hosts_from_config

class Ping(Actor):
    @endpoint
    def ping(self):
        return 1

t0 = time.monotonic()
hm = hosts_from_config("bench")
t1 = time.monotonic()
pm = hm.spawn_procs(per_host={"gpus": 4})
n = len(pm.spawn("ping", Ping).ping.call().get(timeout=120).values())
t2 = time.monotonic()
hm.shutdown().get(timeout=60)
print("RESULT " + json.dumps({
    "submit_s": marks["submitted"] - t0, "queue_s": marks["running"] - marks["submitted"],
    "workers_s": t1 - marks["running"], "first_reply_after_hosts_s": t2 - t1, "total_s": t2 - t0, "actors": n}))
'''


def _result(text: str) -> dict:
    for line in text.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"no RESULT line in:\n{text[-4000:]}")


#: The goal of the issue: bring-up inside a job to the first reply within this
#: many times the floor (``srun`` starting Python and importing the API).
GOAL = 1.5


def _job_env(d: str, pyc_cache: bool) -> dict:
    env = dict(os.environ)
    if pyc_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(d, "pycache")
    return env


def inside(d: str, runs: int, nodes: int, pyc_cache: bool) -> dict:
    with open(os.path.join(d, "monarch.toml"), "w") as f:
        f.write('[hosts.bench]\nscheduler = "slurm"\n')
    with open(os.path.join(d, "prog.py"), "w") as f:
        f.write(INSIDE)
    script = f"#!/bin/sh\ncd {d} && exec {sys.executable} prog.py {runs}\n"
    out = os.path.join(d, "inside.txt")
    subprocess.run(["timeout", "600", "sbatch", "--wait", f"-N{nodes}", "--job-name=mbench", f"--output={out}"],
                   input=script, text=True, check=True, timeout=660, env=_job_env(d, pyc_cache))
    with open(out) as f:
        res = _result(f.read())
    med = statistics.median
    res["median_floor_s"] = floor = med(r["floor_s"] for r in res["runs"])
    res["median_floor_cpu_s"] = med(r["floor_cpu_s"] for r in res["runs"])
    res["cores"] = os.cpu_count()
    for kind in ("cold", "warm"):
        res[f"median_{kind}_cpu_s"] = med(r[kind]["cpu_s"] for r in res["runs"])
        res[f"median_{kind}_first_reply_s"] = first = med(r[kind]["first_reply_s"] for r in res["runs"])
        res[f"median_{kind}_hosts_ready_s"] = med(r[kind]["hosts_ready_s"] for r in res["runs"])
        res[f"{kind}_vs_floor"] = first / floor
    res["goal_vs_floor"] = GOAL
    return res


def summary(res: dict, nodes: int) -> list[str]:
    """One line per figure: ours, the floor, the ratio, the goal."""
    floor = res["median_floor_s"]
    lines = [f"inside a {nodes}-node job, {nodes} x 4 actors, medians of {len(res['runs'])} "
             f"(goal: first reply <= {GOAL:g}x the floor)"]
    for kind, what in (("cold", "a fresh client"), ("warm", "a client already running")):
        first, ready = res[f"median_{kind}_first_reply_s"], res[f"median_{kind}_hosts_ready_s"]
        ratio = first / floor
        lines.append(f"  {kind}: {what}: hosts_from_config {ready:.2f} s, to the first reply {first:.2f} s; "
                     f"floor {floor:.2f} s; {ratio:.2f}x the floor ({'met' if ratio <= GOAL else 'not met'})")
    lines.append(f"  floor: srun -N{nodes} python -c 'import monarch_core.actor' "
                 + ", ".join(f"{r['floor_s']:.2f}" for r in res["runs"]) + " s")
    cores = res["cores"] or 1
    lines.append(f"  CPU of every process on this machine: floor {res['median_floor_cpu_s']:.2f} s, cold "
                 f"{res['median_cold_cpu_s']:.2f} s, warm {res['median_warm_cpu_s']:.2f} s (on {cores} cores: at "
                 f"least {res['median_cold_cpu_s'] / cores:.2f} and {res['median_warm_cpu_s'] / cores:.2f} s of wall "
                 "time)")
    return lines


def outside(d: str, runs: int, nodes: int) -> dict:
    with open(os.path.join(d, "monarch.toml"), "w") as f:
        f.write(f'[hosts.bench]\nscheduler = "slurm"\nnodes = {nodes}\ntime = "00:05:00"\njob_name = "mbench"\n')
    with open(os.path.join(d, "prog.py"), "w") as f:
        f.write(OUTSIDE)
    all_runs = []
    for _ in range(runs):
        res = subprocess.run([sys.executable, "prog.py"], cwd=d, capture_output=True, text=True, timeout=300)
        all_runs.append(_result(res.stdout + res.stderr))
    keys = ("submit_s", "queue_s", "workers_s", "first_reply_after_hosts_s", "total_s")
    return {"runs": all_runs, **{f"median_{k}": statistics.median(r[k] for r in all_runs) for k in keys}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--only", choices=("inside", "outside"), help="measure only this part")
    ap.add_argument("--no-pyc-cache", action="store_true",
                    help="keep this environment's bytecode settings (PYTHONDONTWRITEBYTECODE) in the job")
    args = ap.parse_args()
    out: dict = {}
    with tempfile.TemporaryDirectory(dir=os.path.expanduser("~")) as d:  # a directory the nodes share
        if args.only in (None, "inside"):
            out["inside"] = inside(d, args.runs, args.nodes, not args.no_pyc_cache)
        if args.only in (None, "outside"):
            out["outside"] = outside(d, args.runs, args.nodes)
    print(json.dumps(out, indent=1))
    if "inside" in out:
        print("\n".join(summary(out["inside"], args.nodes)))
    if "outside" in out:
        o = out["outside"]
        print(f"outside, {args.nodes} nodes: submit {o['median_submit_s']:.2f} s, queue {o['median_queue_s']:.2f} s, "
              f"workers {o['median_workers_s']:.2f} s, first reply after the hosts {o['median_first_reply_after_hosts_s']:.2f}"
              f" s; total {o['median_total_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
