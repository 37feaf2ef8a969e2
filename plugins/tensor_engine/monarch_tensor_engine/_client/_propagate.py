"""``propagate=``: how the client learns what a remote function (``remote``)
or an actor endpoint (``Endpoint.rref``) returns, so that its results can be
distributed tensors of known shapes.

Contract:

* a callable: run on fake tensors of the arguments, it returns tensors of
  the results' shapes (no round trip).
* ``"cached"``: the first call for a given signature (each argument
  tensor's shape, strides, dtype, device and ``requires_grad``; the other
  arguments' values) runs on every proc and waits for the first proc to
  describe its results; later calls with that signature reuse the
  description and are pipelined.  The function runs once per call, on
  every proc (it is not run again to learn the shapes).
* ``"inspect"``: the same, with no cache: every call waits for the
  description (for results whose shapes depend on values).
* ``"mocked"``: the client runs the function itself once per call on
  zero-filled local tensors of the arguments' shapes and takes its results'
  shapes (remote functions only: an endpoint needs its actor).
* ``None`` (the default): a remote function runs on the fakes; if it cannot
  (it reads values, calls numpy, ...), the signature falls back to
  ``"cached"``.  An endpoint, which cannot run in the client, is ``"cached"``.
  (torchmonarch's default is ``"cached"`` for both; running on fakes first
  saves the round trip for functions of torch operations.)

With ``"cached"``/``"inspect"`` every proc must return the same structure
(a proc whose results differ from the first proc's has them poisoned), and
the results are new tensors to the client's autograd (a backward through
them needs a callable ``propagate``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from monarch_tensor_engine._client._active import active
from monarch_tensor_engine._client._tensor import Tensor
from monarch_tensor_engine._protocol import Meta

MODES = ("cached", "inspect", "mocked")


def check(propagate: Any, what: str) -> None:
    if propagate is None or callable(propagate) or propagate in MODES:
        return
    raise ValueError(f"{what}: propagate={propagate!r} is not a propagation; pass None, a callable that returns "
                     f"tensors of the results' shapes, or one of {', '.join(repr(m) for m in MODES)}")


def signature(args: tuple, kwargs: dict) -> Any:
    """A hashable key of the arguments' tensors' metadata and other values, or None (unhashable)."""
    flat, spec = tree_flatten((args, kwargs))
    key: list[Any] = [str(spec)]
    for x in flat:
        if isinstance(x, Tensor):
            key.append(("T", tuple(x.shape), tuple(x._fake.stride()), x.dtype, str(x.device), x.requires_grad))
        elif isinstance(x, torch.Tensor):
            key.append(("t", tuple(x.shape), x.dtype))
        else:
            try:
                hash(x)
            except TypeError:
                return None
            key.append(x)
    return tuple(key)


def call(ctl: Any, func: Callable[..., Any], args: tuple, kwargs: dict, propagate: Any, *, owner: Any,
         local_fn: Callable[..., Any] | None) -> Any:
    """``func`` over the active mesh, its results' shapes found as ``propagate`` says.
    ``local_fn`` is the function the client may run itself (None for an endpoint);
    ``owner`` names the cache's entries."""
    if callable(propagate):
        return ctl.dispatch(func, args, kwargs, fake_func=propagate, always=True)
    if propagate == "inspect":
        return ctl.dispatch_described(func, args, kwargs)[0]
    if propagate == "mocked":
        if local_fn is None:
            raise ValueError(f"propagate='mocked' of {getattr(func, '__name__', func)}: an endpoint cannot run in the "
                             f"client; pass a callable that returns tensors of its results' shapes, or 'cached'")
        return ctl.dispatch(func, args, kwargs, fake_func=_mocked(ctl, local_fn), always=True)
    key = signature(args, kwargs)
    cache = ctl.propagations
    if propagate is None and local_fn is not None and (owner, key, "fakes fail") not in cache:
        try:
            return ctl.dispatch(func, args, kwargs, fake_func=local_fn, always=True)
        except Exception:  # noqa: BLE001 - it cannot run on fakes: learn the shapes from a real run
            if key is None:
                return ctl.dispatch_described(func, args, kwargs)[0]
            cache[(owner, key, "fakes fail")] = True
    if key is None:
        return ctl.dispatch_described(func, args, kwargs)[0]
    described = cache.get((owner, key))
    if described is None:
        result, cache[(owner, key)] = ctl.dispatch_described(func, args, kwargs)
        return result
    return ctl.dispatch_described(func, args, kwargs, described)[0]


def run_remote(fn: Callable[..., Any], args: tuple, kwargs: dict, propagate: Any) -> Any:
    """``remote(fn, propagate=...)(*args, **kwargs)``: ``fn`` over the active
    mesh (:func:`call`), or an ordinary local call with no active mesh."""
    ctl = active()
    if ctl is None:
        return fn(*args, **kwargs)  # no mesh: an ordinary local call
    return call(ctl, fn, args, kwargs, propagate, owner=fn, local_fn=fn)


def _mocked(ctl: Any, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A propagation that runs ``fn`` in the client on zero tensors shaped like the fakes."""
    def run(*fargs: Any, **fkwargs: Any) -> Any:
        def real(x: Any) -> Any:
            if not isinstance(x, FakeTensor):
                return x
            if x.device.type != "cpu" and not getattr(torch, x.device.type).is_available():
                raise RuntimeError(f"propagate='mocked' needs a {x.device.type} device in the client to run the "
                                   f"function on; pass a callable propagate instead")
            return torch.zeros(tuple(x.shape), dtype=x.dtype, device=x.device).requires_grad_(x.requires_grad)

        with torch._C.DisableTorchFunction():
            with _disable_current_modes():
                a, k = tree_map(real, (fargs, fkwargs))
                out = fn(*a, **k)
                described = tree_map(lambda x: Meta.of(x) if isinstance(x, torch.Tensor) else x, out)
        leaves, spec = tree_flatten(described, is_leaf=lambda x: isinstance(x, Meta))
        return tree_unflatten([ctl.fake_of(x.key()) if isinstance(x, Meta) else x for x in leaves], spec)

    return run
