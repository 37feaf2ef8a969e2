"""Usage: argv_probe.py OUT [--fail-first]. Reports how it was run: sys.argv, __name__, sys.path[0], and whether a
process group could be initialized (so a second run after the first shows
the first's group was released)."""
import json
import os
import sys

import torch.distributed as dist

dist.init_process_group("gloo")
t = __import__("torch").tensor([float(dist.get_rank())])
dist.all_reduce(t)
out = {"argv": sys.argv, "name": __name__, "path0": sys.path[0], "sum": t.item(),
       "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT")}
with open(sys.argv[1] + f".{dist.get_rank()}", "w") as f:
    json.dump(out, f)
if "--fail-first" in sys.argv and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" \
        and dist.get_rank() == 1:
    raise SystemExit(5)
dist.destroy_process_group()  # as a script should (torch warns otherwise; gloo can abort at exit without it)
