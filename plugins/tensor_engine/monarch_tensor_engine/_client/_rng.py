"""The procs' random number generators, from the client: what the
``torch.manual_seed``/``get_rng_state``/``set_rng_state`` wrappers of
:mod:`._globals` and ``monarch_tensor_engine.random`` run over the active
mesh (remote functions of ``_worker._rng``; with no active mesh, on the
client's own generators)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from monarch_tensor_engine._client._propagate import run_remote
from monarch_tensor_engine._worker import _rng as here

__all__ = ["State", "get_cpu_state", "get_state", "make_deterministic", "manual_seed_procs", "set_cpu_state",
           "set_state"]


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


def _none(*args: Any) -> None:
    """The propagation of a function that returns nothing."""
    return None


def manual_seed_procs(seed: Any) -> None:
    """Seed every proc's generators (all of them: CPU and CUDA) with ``seed``."""
    run_remote(here.here_seed, (seed,), {}, _none)


def get_cpu_state() -> Any:
    """Each proc's CPU generator state, a distributed uint8 tensor."""
    return run_remote(here.here_get_cpu_state, (), {}, _cpu_state_like)


def set_cpu_state(state: Any) -> None:
    """Set each proc's CPU generator to its value of ``state``."""
    run_remote(here.here_set_cpu_state, (state,), {}, _none)


def get_state() -> State:
    """Each proc's generator states (``monarch_tensor_engine.random.get_state``)."""
    return State(*run_remote(here.here_get_state, (), {}, "cached"))  # the procs' CUDA may differ from the client's


def set_state(state: tuple) -> None:
    """Set each proc's generators to its part of ``state``."""
    run_remote(here.here_set_state, (tuple(state),), {}, _none)


def make_deterministic() -> None:
    """Deterministic algorithms on every proc of the active mesh (in the client with none)."""
    run_remote(here.here_make_deterministic, (), {}, _none)
