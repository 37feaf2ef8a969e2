"""The procs' random number generators (the reference's ``monarch.random``).

Inside ``with mesh.activate():`` each function acts on every proc of the
mesh; outside a mesh, on the client's own generators (they are remote
functions, which run locally with no active mesh).

* :func:`get_state` -> :class:`State`: each proc's generator states, as
  distributed tensors (``cpu``: ``torch.get_rng_state()``; ``cuda``:
  ``torch.cuda.get_rng_state()``, or ``None`` where the procs have no CUDA).
* :func:`set_state` (a ``State``): each proc takes its own state back.
* :func:`new_state` (a seed: an int, the same on every proc, or a
  distributed integer tensor, one per proc) -> the ``State`` that seeding
  with it gives, without changing the current one.
* :func:`make_deterministic`: deterministic algorithms on every proc.

``torch.manual_seed`` itself is forwarded too (see ``_globals``):
``torch.manual_seed(0)`` inside a mesh gives every proc the same stream;
``torch.manual_seed(1000 + mesh.rank_tensor("dp"))`` gives each ``dp``
rank its own.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch

from monarch_tensor_engine.api import remote

__all__ = ["State", "get_state", "make_deterministic", "new_state", "set_state"]


class State(NamedTuple):
    """Generator states: ``cpu`` (``torch.get_rng_state()``) and ``cuda``
    (``torch.cuda.get_rng_state()``, ``None`` without CUDA)."""

    cpu: Any
    cuda: Any


#: the shape of a CPU generator's state (``torch.get_rng_state()``)
_CPU_STATE_SHAPE = tuple(torch.default_generator.get_state().shape)


def _cpu_state_like() -> torch.Tensor:
    """A tensor of the shape and dtype of a CPU generator's state (run on fakes)."""
    return torch.empty(_CPU_STATE_SHAPE, dtype=torch.uint8)


def _original(name: str) -> Any:
    fn = getattr(torch, name)
    return getattr(fn, "__wrapped__", fn)


# What runs on each proc: plain functions of this module, so that commands name
# them by reference (the remote() wrappers below are what the client calls).

def _here_get_state() -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    return _original("get_rng_state")(), cuda


def _here_set_state(state: tuple) -> None:
    cpu, cuda = state
    _original("set_rng_state")(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda)


def _here_seed(seed: Any) -> None:
    _original("manual_seed")(int(seed))


def _here_get_cpu_state() -> torch.Tensor:
    return _original("get_rng_state")()


def _here_set_cpu_state(state: torch.Tensor) -> None:
    _original("set_rng_state")(state)


def _here_make_deterministic() -> None:
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS (see torch.use_deterministic_algorithms)


_get_state = remote(_here_get_state, propagate="cached")  # the procs' CUDA may differ from the client's
_set_state = remote(_here_set_state, propagate=lambda state: None)
_seed = remote(_here_seed, propagate=lambda seed: None)
_get_cpu_state = remote(_here_get_cpu_state, propagate=lambda: _cpu_state_like())
_set_cpu_state = remote(_here_set_cpu_state, propagate=lambda state: None)
_make_deterministic = remote(_here_make_deterministic, propagate=lambda: None)


def make_deterministic() -> None:
    """Deterministic algorithms (``torch.use_deterministic_algorithms(True)``,
    cuDNN deterministic, no benchmarking, cuBLAS's workspace setting) on every
    proc of the active mesh (in the client with none)."""
    _make_deterministic()


def get_state() -> State:
    """Each proc's generator states (see the module docstring)."""
    return State(*_get_state())


def set_state(state: State) -> None:
    """Set each proc's generators to its part of ``state`` (from :func:`get_state`/:func:`new_state`)."""
    if not isinstance(state, tuple) or len(state) != 2:
        raise TypeError(f"set_state() takes a State (from get_state() or new_state()), got {type(state).__name__}")
    _set_state(tuple(state))


def new_state(seed: Any) -> State:
    """The generator states that seeding with ``seed`` gives (an int, or a
    distributed integer tensor: each proc its own seed), leaving the
    current states as they are."""
    orig = get_state()
    manual_seed_procs(seed)
    mine = get_state()
    set_state(orig)
    return mine


# ---------------------------------------------------------------- for _globals' torch wrappers

def manual_seed_procs(seed: Any) -> None:
    """Seed every proc's generators (all of them: CPU and CUDA) with ``seed``."""
    _seed(seed)


def get_cpu_state() -> Any:
    """Each proc's CPU generator state, a distributed uint8 tensor."""
    return _get_cpu_state()


def set_cpu_state(state: Any) -> None:
    """Set each proc's CPU generator to its value of ``state``."""
    _set_cpu_state(state)
