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

from typing import Any

from monarch_tensor_engine._client import _rng
from monarch_tensor_engine._client._rng import State

__all__ = ["State", "get_state", "make_deterministic", "new_state", "set_state"]


def make_deterministic() -> None:
    """Deterministic algorithms (``torch.use_deterministic_algorithms(True)``,
    cuDNN deterministic, no benchmarking, cuBLAS's workspace setting) on every
    proc of the active mesh (in the client with none)."""
    _rng.make_deterministic()


def get_state() -> State:
    """Each proc's generator states (see the module docstring)."""
    return _rng.get_state()


def set_state(state: State) -> None:
    """Set each proc's generators to its part of ``state`` (from :func:`get_state`/:func:`new_state`)."""
    if not isinstance(state, tuple) or len(state) != 2:
        raise TypeError(f"set_state() takes a State (from get_state() or new_state()), got {type(state).__name__}")
    _rng.set_state(tuple(state))


def new_state(seed: Any) -> State:
    """The generator states that seeding with ``seed`` gives (an int, or a
    distributed integer tensor: each proc its own seed), leaving the
    current states as they are."""
    orig = get_state()
    _rng.manual_seed_procs(seed)
    mine = get_state()
    set_state(orig)
    return mine
