"""torchrun's environment variables, computed from a mesh position.

Contract (torchrun's, for a static rendezvous with one role): the last mesh
dimension is the local one (the procs of one host); every dimension before it
enumerates hosts.  With ``L`` the size of the last dimension and ``W`` the
mesh's size, a proc of global rank ``r`` gets ``RANK = ROLE_RANK = r``,
``LOCAL_RANK = r % L`` (its coordinate in the last dimension),
``LOCAL_WORLD_SIZE = L``, ``WORLD_SIZE = ROLE_WORLD_SIZE = W``,
``GROUP_RANK = r // L`` (the host's index) and ``GROUP_WORLD_SIZE = W // L``.

Devices are torchrun's too: ``spawn_procs`` gives each proc one device
(``CUDA_VISIBLE_DEVICES``, docs/configuration.md); :func:`apply` gives a
rank its host's list back, so that the rank's device is ``cuda:LOCAL_RANK``,
as under torchrun.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Mapping, MutableMapping

from monarch_core.runtime import ProcDevices

logger = logging.getLogger("monarch.spmd")

#: the variable ``spawn_procs`` narrows to one device per proc, and torchrun leaves as the host has it
CUDA_ENV = "CUDA_VISIBLE_DEVICES"

#: the variables torchrun sets for every worker that :func:`torchrun_env` sets too
TORCHRUN_KEYS = (
    "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
    "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)

DEFAULT_ROLE = "default"  # torchrun's --role default


@dataclass(frozen=True)
class Layout:
    """Where one proc sits: its global ``rank`` and the mesh's ``sizes``
    (dimension name -> size, in mesh order; the last one is local)."""

    rank: int
    sizes: Mapping[str, int]

    def __post_init__(self) -> None:
        if not self.sizes:
            raise ValueError(
                "an SPMD mesh needs at least one dimension (the last one holds the procs of one host, e.g. "
                "spawn_procs(per_host={'gpus': 2})); this mesh has none")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside a mesh of {self.world_size} procs {dict(self.sizes)}")

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes.values())

    @property
    def local_world_size(self) -> int:
        return list(self.sizes.values())[-1]

    @property
    def local_rank(self) -> int:
        return self.rank % self.local_world_size

    @property
    def group_rank(self) -> int:
        return self.rank // self.local_world_size

    @property
    def group_world_size(self) -> int:
        return self.world_size // self.local_world_size


def torchrun_env(layout: Layout, master_addr: str, master_port: int, *, role: str = DEFAULT_ROLE,
                 run_id: str = "none", restart_count: int = 0, max_restarts: int = 0) -> dict[str, str]:
    """The variables torchrun gives the worker at ``layout`` (see the module
    docstring).  ``TORCHELASTIC_USE_AGENT_STORE`` is ``False``: there is no
    elastic agent, rank 0 hosts the store at ``MASTER_ADDR:MASTER_PORT``, so
    ``init_process_group("env://")`` works unchanged."""
    if not isinstance(master_addr, str) or not master_addr:
        raise ValueError(f"master_addr must be a non-empty host name or address, got {master_addr!r}")
    if isinstance(master_port, bool) or not isinstance(master_port, int) or not 0 < master_port < 65536:
        raise ValueError(f"master_port must be a port number (1-65535), got {master_port!r}")
    return {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "RANK": str(layout.rank),
        "LOCAL_RANK": str(layout.local_rank),
        "LOCAL_WORLD_SIZE": str(layout.local_world_size),
        "WORLD_SIZE": str(layout.world_size),
        "GROUP_RANK": str(layout.group_rank),
        "GROUP_WORLD_SIZE": str(layout.group_world_size),
        "ROLE_RANK": str(layout.rank),
        "ROLE_WORLD_SIZE": str(layout.world_size),
        "ROLE_NAME": role,
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }


def apply(env: dict[str, str], environ: MutableMapping[str, str] | None = None, *,
          devices: ProcDevices | None = None) -> None:
    """Set ``env`` in ``os.environ`` (or ``environ``), and, as torchrun does
    when a host runs more than one proc, ``OMP_NUM_THREADS=1`` unless it is set.

    Devices, as torchrun shows them: a proc that ``spawn_procs`` gave one
    device (``devices``; by default, when ``environ`` is this process's, the
    proc's own, ``monarch_core.runtime.proc_devices()``) gets its host's
    ``CUDA_VISIBLE_DEVICES`` back (unset when the host had none), so that a
    script's ``torch.cuda.set_device(LOCAL_RANK)`` and ``cuda:LOCAL_RANK``
    name the host's device ``LOCAL_RANK`` -- the proc's own when the device
    dimension is the mesh's last (``per_host={"gpus": N}``).  A proc that
    initialized CUDA before this keeps the one device it saw (CUDA reads the
    variable once): a WARNING on ``monarch.spmd`` says so."""
    import os

    own = environ is None
    target: MutableMapping[str, str] = os.environ if environ is None else environ
    if own and devices is None:
        from monarch_core.runtime import proc_devices

        devices = proc_devices()
    target.update(env)
    if int(env["LOCAL_WORLD_SIZE"]) > 1 and "OMP_NUM_THREADS" not in target:
        target["OMP_NUM_THREADS"] = "1"
    if devices is not None:
        _host_devices(target, devices, own, env.get("LOCAL_RANK"))


def _host_devices(target: MutableMapping[str, str], devices: ProcDevices, own: bool, local_rank: str | None) -> None:
    """``CUDA_VISIBLE_DEVICES`` in ``target`` back to the host's (see :func:`apply`)."""
    before = target.get(CUDA_ENV)
    if devices.host_visible is None:
        target.pop(CUDA_ENV, None)
    else:
        target[CUDA_ENV] = devices.host_visible
    if own and before != target.get(CUDA_ENV) and _cuda_initialized():
        logger.warning(
            "this proc initialized CUDA seeing only its own device (%s=%r) before torchrun's environment was "
            "set, so it keeps seeing that one device: cuda:0 is its device and cuda:LOCAL_RANK (LOCAL_RANK=%s) "
            "may not exist. Set up the environment (setup_torch_elastic_env, SPMDActor.main) before any CUDA "
            "use in its procs, or spawn them with MONARCH_PROC_DEVICES=0",
            CUDA_ENV, before, local_rank)


def _cuda_initialized() -> bool:
    """Whether this process initialized CUDA through torch (never imports torch)."""
    import sys

    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without CUDA support
        return False
