"""Usage: envdump.py OUT. Writes torchrun's variables as this rank sees them to OUT.<RANK>."""
import json
import os
import sys

KEYS = ["MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "OMP_NUM_THREADS",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"]
with open(f"{sys.argv[1]}.{os.environ['RANK']}", "w") as f:
    json.dump({k: os.environ.get(k) for k in KEYS}, f)
