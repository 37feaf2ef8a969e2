"""What runs on each proc for the random helpers (``monarch_tensor_engine.random``
and the ``torch.manual_seed``/``get_rng_state``/``set_rng_state`` wrappers of
``_client._globals``): plain functions, so that commands name them by
reference.  They call torch's own functions (not the client's wrappers)."""

from __future__ import annotations

import os
from typing import Any

import torch


def original(name: str) -> Any:
    """torch's ``name`` itself (``_client._globals`` may have wrapped it in this process)."""
    fn = getattr(torch, name)
    return getattr(fn, "__wrapped__", fn)


def here_get_state() -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    return original("get_rng_state")(), cuda


def here_set_state(state: tuple) -> None:
    cpu, cuda = state
    original("set_rng_state")(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


def here_seed(seed: Any) -> None:
    original("manual_seed")(int(seed))


def here_get_cpu_state() -> torch.Tensor:
    return original("get_rng_state")()


def here_set_cpu_state(state: torch.Tensor) -> None:
    original("set_rng_state")(state)


def here_make_deterministic() -> None:
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS (see torch.use_deterministic_algorithms)
