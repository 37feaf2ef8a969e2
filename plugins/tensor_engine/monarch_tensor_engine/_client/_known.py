"""Values the client knows: small distributed tensors whose value is the
same on every proc and computed from constants, so that reading one
(``t.item()``, ``float(t)``, ``t.tolist()``) needs no round trip.

This is what stock optimizers need: ``torch.optim.Adam``/``AdamW``/
``Adagrad``/... keep their step count in a tensor (``torch.tensor(0.0)``,
then ``step += 1``) and read it with ``.item()`` to compute Python floats.

Contract:

* A distributed tensor is *known* when it was made by a deterministic
  factory (:data:`FACTORIES`: ``torch.tensor(2.0)``, ``torch.zeros(())``, ...)
  or by a deterministic element-wise operation (:data:`PURE`) of known
  tensors and Python values, has at most :data:`MAX_NUMEL` elements, does
  not require grad, and is not a view.  The client then holds its value
  (``t._known``, a CPU tensor), computed locally by the same torch function
  as the procs run.
* An in-place operation of :data:`PURE` with known inputs keeps it known
  (the client applies it to its copy too).  ``detach`` (in :data:`PURE`)
  makes a known alias whose copy shares the storage of its input's copy, as
  the procs' tensors do.  Anything else that may write a known tensor or
  share its storage forgets the value (and its aliases'): any other in-place
  operation or ``out=``, a view of it (``view``, ``reshape``), a remote
  function or actor call it is passed to, a collective, a borrow, a transfer
  (every command that names it other than an operation).
* The controller's metadata cache answers for them too: on a hit, the
  result's value is computed in the client (:func:`on_hit`) as on the slow
  path (:func:`track`).  An operation that aliases its input (``detach``) is
  taken out of the cache, so that every alias passes :func:`track`.
* Reading the value of a known tensor returns the client's copy; reading
  any other distributed tensor's value is the controller's error, as
  before.  Random operations are never known, and neither is anything
  computed from a tensor that is not.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from monarch_tensor_engine._protocol import Ref
from monarch_tensor_engine._client._tensor import Tensor

#: the most elements a known tensor has (its value is kept in the client): scalars, what optimizers
#: keep their step counts in -- tracking longer vectors would cost every small operation on them the
#: client-side computation of its value (about twice the dispatch of ``x + 1`` on 16 elements)
MAX_NUMEL = 1

#: what :func:`read` returns when the value is not known
UNKNOWN = object()

#: factories whose values depend only on their arguments (``*_like``: only on the arguments after the first)
FACTORIES = frozenset({"tensor", "as_tensor", "scalar_tensor", "zeros", "ones", "full", "arange", "linspace",
                       "zeros_like", "ones_like", "full_like"})
_LIKE = frozenset({"zeros_like", "ones_like", "full_like"})

#: deterministic element-wise operations (and their in-place forms), computed in the client over known values
PURE = frozenset({
    "add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide", "floor_divide", "remainder",
    "fmod", "pow", "neg", "negative", "abs", "sqrt", "rsqrt", "exp", "log", "reciprocal", "square", "sign",
    "floor", "ceil", "round", "trunc", "clamp", "clip", "clamp_min", "clamp_max", "maximum", "minimum", "lerp",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "where", "clone",
    "float", "double", "half", "bfloat16", "int", "long", "bool", "type_as", "sum", "mean", "prod",
    "detach",  # an alias: the client's copy shares its input's storage too, and forgetting one forgets both
    "add_", "sub_", "mul_", "div_", "pow_", "neg_", "abs_", "sqrt_", "clamp_", "clamp_min_", "clamp_max_",
    "fill_", "zero_", "copy_", "floor_", "ceil_", "round_", "reciprocal_", "lerp_",
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__", "__imul__",
    "__truediv__", "__rtruediv__", "__itruediv__", "__floordiv__", "__rfloordiv__", "__ifloordiv__",
    "__mod__", "__rmod__", "__imod__", "__pow__", "__rpow__", "__ipow__", "__neg__", "__abs__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__and__", "__or__", "__xor__", "__invert__",
    "_foreach_add", "_foreach_add_", "_foreach_sub", "_foreach_sub_", "_foreach_mul", "_foreach_mul_",
    "_foreach_div", "_foreach_div_", "_foreach_neg", "_foreach_neg_",
})

#: the operations whose results may be known (what the controller's fast path hands to :func:`on_hit`)
COMPUTED = FACTORIES | PURE

#: value reads answered from a known value (others, like iteration, would hand out local tensors)
_READS = frozenset({"item", "tolist", "__bool__", "__float__", "__int__", "__index__", "__complex__", "__len__"})

#: controller -> {tensor id: its known handle}: what a command other than an operation may touch
_live: "weakref.WeakKeyDictionary[Any, weakref.WeakValueDictionary[int, Tensor]]" = weakref.WeakKeyDictionary()


def known(t: Any) -> torch.Tensor | None:
    """The client's copy of ``t``'s value, or None."""
    return t.__dict__.get("_known") if isinstance(t, Tensor) else None


def _set(ctl: Any, h: Tensor, value: torch.Tensor) -> None:
    h._known = value
    reg = _live.get(ctl)
    if reg is None:
        reg = _live[ctl] = weakref.WeakValueDictionary()
    reg[h._id] = h


def forget(ctl: Any, h: Tensor) -> None:
    """``h``'s value is no longer known, nor that of any known alias of it
    (``detach``: its copy shares the storage of ``h``'s, as on the procs)."""
    value = h.__dict__.pop("_known", None)
    reg = _live.get(ctl)
    if value is None or reg is None:
        return
    reg.pop(h._id, None)
    with torch._C.DisableTorchFunction():
        ptr = value.untyped_storage().data_ptr()
        aliases = [o for o in list(reg.values())
                   if "_known" in o.__dict__ and o._known.untyped_storage().data_ptr() == ptr]
    for other in aliases:
        forget(ctl, other)


def read(func: Any, flat: list, spec: Any) -> Any:
    """``func`` (a value read) over the known values of the distributed
    tensors among ``flat``, or :data:`UNKNOWN`."""
    if getattr(func, "__name__", "") not in _READS:
        return UNKNOWN
    local = []
    for x in flat:
        if isinstance(x, Tensor):
            v = known(x)
            if v is None:
                return UNKNOWN
            local.append(v)
        else:
            local.append(x)
    a, k = _unflatten(local, spec)
    with torch._C.DisableTorchFunction():
        return func(*a, **k)


def _unflatten(flat: list, spec: Any) -> tuple[tuple, dict]:
    if spec is None:
        return tuple(flat), {}
    a, k = tree_unflatten(flat, spec)
    return a, k


def _uncache(ctl: Any, key: Any) -> None:
    """Take ``key`` out of the controller's metadata cache (a dict or a ``_cache.Cache``)."""
    cache = ctl.op_cache
    pop = getattr(cache, "pop", None)
    if pop is None:
        pop = cache._d.pop  # _cache.Cache (an OrderedDict inside)
    pop(key, None)


def _small(fake: torch.Tensor) -> bool:
    with torch._C.DisableTorchFunction():
        return fake.numel() <= MAX_NUMEL and not fake.requires_grad and fake._base is None


def _storage(fake: torch.Tensor) -> int:
    with torch._C.DisableTorchFunction():
        return fake.untyped_storage()._cdata


def track(ctl: Any, func: Any, flat: list, spec: Any, kwargs: dict, handles: list, results: list,
          mutating: bool, always: bool, op_key: Any) -> None:
    """After the controller made the results of ``func`` (before it sends
    the operation): compute the results' values where they are known, keep
    known inputs known through a pure in-place operation, and forget known
    inputs that the operation may write or alias (see the module docstring).
    An operation that aliases one of its inputs is taken out of the
    controller's metadata cache, so that every alias passes here."""
    name = getattr(func, "__name__", "")
    inputs_known = [h for h in handles if known(h) is not None]
    tensors_out = [r for r in results if isinstance(r, Tensor)]
    if op_key is not None and op_key in ctl.op_cache and tensors_out and handles:
        out_storage = _storage(tensors_out[0]._fake)
        if any(_storage(h._fake) == out_storage for h in handles):
            _uncache(ctl, op_key)  # an alias (detach): never from the cache, whose results skip this
    computed = False
    if not always and (name in FACTORIES or (name in PURE and handles)):
        computed = _compute(ctl, func, name, flat, spec, handles, tensors_out, mutating, op_key)
    if computed or not inputs_known:
        return
    fresh = {id(r) for r in tensors_out if not any(r is h for h in handles)}
    for h in inputs_known:
        if always or mutating or (kwargs and "out" in kwargs):
            forget(ctl, h)
            continue
        storage = _storage(h._fake)
        if any(id(r) in fresh and _storage(r._fake) == storage for r in tensors_out):
            forget(ctl, h)  # an alias of it (detach, view): writes through it would not be seen


def _compute(ctl: Any, func: Any, name: str, flat: list, spec: Any, handles: list, tensors_out: list,
             mutating: bool, op_key: Any) -> bool:
    """Run ``func`` in the client over known values; True when it did (and the results are known)."""
    like = name in _LIKE
    if not mutating and not all(_small(r._fake) for r in tensors_out):
        return False
    local: list[Any] = []
    for x in flat:
        if isinstance(x, Tensor):
            v = known(x)
            if v is None:
                if not like:
                    return False
                with torch._C.DisableTorchFunction():  # *_like: only the metadata of its input matters
                    v = torch.zeros(tuple(x.shape), dtype=x.dtype)
            local.append(v)
        elif isinstance(x, torch.device):
            local.append(torch.device("cpu"))  # values are computed on the client's CPU
        else:
            local.append(x)
    a, k = _unflatten(local, spec)
    if "device" in k:
        k["device"] = "cpu"
    if "pin_memory" in k:
        k["pin_memory"] = False
    try:
        with torch._C.DisableTorchFunction(), torch.no_grad():
            out = func(*a, **k)
    except Exception:  # noqa: BLE001 - not computable here (a CUDA-only form, ...): simply not known
        return False
    out_flat = [out] if isinstance(out, torch.Tensor) else tree_flatten(out)[0]
    out_local = [o for o in out_flat if isinstance(o, torch.Tensor)]
    if len(out_local) != len(tensors_out):
        return False
    input_values = {id(known(h)) for h in handles}
    for r, v in zip(tensors_out, out_local):
        if any(r is h for h in handles):
            continue  # an input, changed in place (its copy was changed too) or returned as it is
        with torch._C.DisableTorchFunction():
            if id(v) in input_values or v._base is not None:
                v = v.clone()
            if tuple(v.shape) != tuple(r.shape) or v.dtype != r.dtype:
                forget(ctl, r)
                continue
        _set(ctl, r, v)
    return True


def on_hit(ctl: Any, func: Any, args: tuple, h: Tensor) -> None:
    """The metadata cache answered ``func(*args)`` (positional arguments
    only) with ``h``, a fresh tensor: give ``h`` its value where it is known
    -- a factory, or an operation of :data:`PURE` over known inputs, with at
    most :data:`MAX_NUMEL` elements -- computed here as the slow path
    computes it (a few microseconds for such a tensor, where the slow path
    costs a run on the fakes).  The inputs stay known: a cached operation
    neither writes nor aliases them."""
    name = getattr(func, "__name__", "")
    factory = name in FACTORIES
    if not factory and name not in PURE:
        return
    shape, _strides, dtype, _device, grad = h._key
    if grad or math.prod(shape) > MAX_NUMEL:
        return
    like = name in _LIKE
    local: list[Any] = []
    for i, x in enumerate(args):
        if type(x) is Tensor:
            v = known(x)
            if v is None:
                if not (like and i == 0):
                    return
                with torch._C.DisableTorchFunction():
                    v = torch.zeros(tuple(x._key[0]), dtype=x._key[2])
            local.append(v)
        elif isinstance(x, torch.device):
            local.append(torch.device("cpu"))
        else:
            local.append(x)
    if not factory and not any(type(x) is Tensor for x in args):
        return
    try:
        with torch._C.DisableTorchFunction(), torch.no_grad():
            v = func(*local)
    except Exception:  # noqa: BLE001 - not computable here: simply not known
        return
    if not isinstance(v, torch.Tensor):
        return
    with torch._C.DisableTorchFunction():
        if tuple(v.shape) != tuple(shape) or v.dtype != dtype:
            return
        if v._base is not None or any(v is y for y in local):
            v = v.clone()
    _set(ctl, h, v)


def taint(ctl: Any, cmd: tuple) -> None:
    """A command other than an operation names tensors (a collective, a
    borrow, a remote call described by a proc, a transfer): forget the
    value of every known tensor it may name."""
    reg = _live.get(ctl)
    if not reg:
        return
    for leaf in tree_flatten(list(cmd))[0]:  # a command (a NamedTuple of the protocol): its fields
        ident = leaf.id if isinstance(leaf, Ref) else leaf if type(leaf) is int else None
        if ident is not None:
            h = reg.get(ident)
            if h is not None:
                forget(ctl, h)


def any_live() -> bool:
    """Whether some known tensor may exist (the controller skips :func:`taint` otherwise)."""
    return bool(_live)
