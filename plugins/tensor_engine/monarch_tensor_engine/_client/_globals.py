"""Torch's global state between the client and the procs of an active mesh.

The client runs every operation on fake tensors to learn its results'
metadata; the procs run it for real.  Global torch state that changes
results therefore has to be the same on both sides, or the client's
metadata and the procs' values disagree.  Contract:

* **Default dtype** (``torch.set_default_dtype``, ``set_default_tensor_type``):
  forwarded.  Before each operation of a mesh (:func:`sync`, called by the
  controller) the client's default dtype is compared with the one last sent
  to that mesh's procs; when it differs, the procs set it too (a command
  ordered with the operations of the active stream) and the mesh's cache of
  operations' metadata is cleared.  So a change made before ``activate()``,
  inside it, or under ``no_mesh()`` reaches the procs before their next
  operation.  A change made *on* the procs (inside a remote function) is
  not seen by the client: don't.
* **Autocast** (``torch.autocast``): refused inside an active mesh, with an
  error that names the working forms (its state is per thread on the
  procs, and the client's fakes would get autocast's dtypes while the procs'
  values would not).
* **Default device** (``torch.set_default_device``): refused inside an active
  mesh, and ``activate()`` refuses a client whose default device is not the
  CPU; pass ``device=`` to factories instead.
* **Random number generators**: ``torch.manual_seed(s)`` inside an active mesh
  seeds every proc of it (and the client, as usual), so every proc draws the
  same stream; ``torch.manual_seed(t)`` with a distributed integer tensor
  seeds each proc with its own value of ``t`` (per-rank streams, e.g.
  ``1000 + mesh.rank_tensor("dp")``).  ``torch.get_rng_state()`` inside an
  active mesh returns the procs' CPU generator states as a distributed
  tensor, and ``torch.set_rng_state(t)`` of such a tensor sets them (so
  ``torch.random.fork_rng()`` works on the procs).  Outside a mesh they are
  torch's own.  ``monarch_tensor_engine.random`` has the reference's names.

:func:`install` wraps those torch functions once (when the engine loads);
each wrapper is torch's own function whenever no mesh is active.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import torch

from monarch_tensor_engine import _protocol as P
from monarch_tensor_engine._client import _rng
from monarch_tensor_engine._client._active import active as _active
from monarch_tensor_engine._client._tensor import Tensor

logger = logging.getLogger("monarch.tensor")

_AUTOCAST_ERROR = (
    "torch.autocast inside `with mesh.activate():` is not forwarded to the procs: the client would compute "
    "autocast's dtypes for the results while the procs computed without it. Cast explicitly "
    "(x.to(torch.bfloat16)), or run the autocast region on the procs inside a remote function "
    "(monarch_core.remote(fn)), whose body may use `with torch.autocast(...):`")


def sync(ctl: Any) -> None:
    """Bring the procs of ``ctl``'s mesh in line with the client's global torch
    state before an operation (see the module docstring); raise for state
    that cannot be forwarded."""
    if torch._C._is_any_autocast_enabled():
        raise RuntimeError(_AUTOCAST_ERROR)
    dtype = torch.get_default_dtype()
    if dtype is not ctl.default_dtype:
        with ctl.lock:
            ctl.op_cache.clear()  # cached metadata of factories was computed with the old default
            ctl.send(P.Op(torch.set_default_dtype, (dtype,), {}, [], False, "set_default_dtype"))
            ctl.default_dtype = dtype
        logger.debug("tensor engine: default dtype %s sent to mesh %r", dtype, ctl.mesh_name)


def check_activate() -> None:
    """Refuse to activate a mesh with client state that cannot be forwarded."""
    device = torch.get_default_device()
    if device.type != "cpu":
        raise RuntimeError(
            f"the client's default device is {device} (torch.set_default_device / `with torch.device(...)`): "
            f"it is not forwarded to the procs of a mesh, so the client's metadata and the procs' values would "
            f"disagree. Reset it (torch.set_default_device(None)) and pass device= to the factories inside "
            f"`with mesh.activate():` (torch.ones(3, device='cuda'))")


# ---------------------------------------------------------------- the wrapped torch functions

def _manual_seed(original: Callable[..., Any], seed: Any) -> Any:
    if _active() is None:
        return original(seed)
    if isinstance(seed, Tensor):  # each proc its own value: per-rank streams
        if seed.dtype.is_floating_point or seed.dtype.is_complex or seed.dim() != 0:
            raise TypeError(f"torch.manual_seed(t) inside a mesh takes an integer scalar distributed tensor "
                            f"(e.g. 1000 + mesh.rank_tensor('dp')), got shape {tuple(seed.shape)} {seed.dtype}")
        _rng.manual_seed_procs(seed)
        return torch.default_generator
    result = original(seed)  # the client too, as torch does
    _rng.manual_seed_procs(int(seed))
    return result


def _get_rng_state(original: Callable[..., Any]) -> Any:
    if _active() is None:
        return original()
    return _rng.get_cpu_state()


def _set_rng_state(original: Callable[..., Any], new_state: Any) -> Any:
    if _active() is None or not isinstance(new_state, Tensor):
        return original(new_state)  # a local state (a fetched one): the client's generator, as torch does
    _rng.set_cpu_state(new_state)
    return None


def _set_default_device(original: Callable[..., Any], device: Any) -> Any:
    if _active() is not None:
        raise RuntimeError(
            f"torch.set_default_device({device!r}) inside `with mesh.activate():` is not forwarded to the procs "
            f"(the client's metadata and the procs' values would disagree): pass device= to the factories "
            f"(torch.ones(3, device={str(device)!r})), or .to(device)")
    return original(device)


_WRAPPERS: dict[str, Callable[..., Any]] = {
    "manual_seed": _manual_seed,
    "get_rng_state": _get_rng_state,
    "set_rng_state": _set_rng_state,
    "set_default_device": _set_default_device,
}


def install() -> None:
    """Wrap torch's functions of :data:`_WRAPPERS` (``torch.X`` and
    ``torch.random.X`` where it has one); idempotent."""
    for name, wrapper in _WRAPPERS.items():
        original = getattr(torch, name)
        if getattr(original, "_monarch_forwarded", False):
            continue

        def make(original: Callable[..., Any] = original, wrapper: Callable[..., Any] = wrapper) -> Any:
            @functools.wraps(original)
            def forwarded(*args: Any, **kwargs: Any) -> Any:
                return wrapper(original, *args, **kwargs)

            forwarded._monarch_forwarded = True  # type: ignore[attr-defined]
            return forwarded

        fn = make()
        setattr(torch, name, fn)
        if getattr(torch.random, name, None) is original:
            setattr(torch.random, name, fn)
