"""Usage: streams.py OUT.  Writes a line to stdout and one to stderr, joins the
process group (gloo) at MASTER_ADDR:MASTER_PORT, all-reduces its rank, and
writes MASTER_ADDR and the sum to OUT.<RANK> as JSON."""
import json
import os
import sys

import torch
import torch.distributed as dist

rank = os.environ["RANK"]
print(f"stdout of rank {rank}", flush=True)
print(f"stderr of rank {rank}", file=sys.stderr, flush=True)
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
with open(f"{sys.argv[1]}.{rank}", "w") as f:
    json.dump({"MASTER_ADDR": os.environ["MASTER_ADDR"], "sum": t.item()}, f)
dist.destroy_process_group()
