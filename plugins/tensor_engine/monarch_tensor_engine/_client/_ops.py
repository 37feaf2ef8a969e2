"""What the client's modules share about torch functions and their
arguments: how a command names a function (:func:`func_ref`), how errors
name it (:func:`op_name`), which ones write their inputs
(:func:`is_mutating`) or read values (:data:`VALUE_READS`), and the pytree
flattening of a call's arguments with a fast path for scalars and tensors
(:func:`flatten`/:func:`unflatten`)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

__all__ = ["VALUE_READS", "flatten", "func_ref", "is_mutating", "op_name", "unflatten"]

#: reading a value out of a distributed tensor
VALUE_READS = {"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__complex__",
               "__array__", "__len__", "__iter__"}

_MUTATING_DUNDERS = {"__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
                     "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__", "__setitem__",
                     "__set__", "__delitem__"}


def op_name(func: Any) -> str:
    name = getattr(func, "__name__", None) or repr(func)
    if name in ("__get__", "__set__") and hasattr(func, "__self__"):
        return f"{getattr(func.__self__, '__name__', '?')}.{name}"
    return name


def func_ref(func: Any) -> Any:
    """What a command names ``func`` by on the procs (a getset descriptor's
    ``__get__``/``__set__`` by its attribute; everything else pickles by
    reference)."""
    name = getattr(func, "__name__", None)
    if name in ("__get__", "__set__") and hasattr(func, "__self__") and hasattr(func.__self__, "__name__"):
        return ("get" if name == "__get__" else "set", func.__self__.__name__)
    return func


def is_mutating(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    if name in _MUTATING_DUNDERS or name in ("backward", "_backward"):
        return True
    return name.endswith("_") and not name.startswith("__")


#: argument types that are leaves as they are (no pytree needed for a call of only these)
_LEAVES = (int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)


def flatten(args: tuple, kwargs: dict) -> tuple[list, Any]:
    """``tree_flatten((args, kwargs))``, with a fast path for the common call
    of tensors and scalars only (``spec`` is then ``None``)."""
    if not kwargs:
        for a in args:
            if not (isinstance(a, torch.Tensor) or type(a) in _LEAVES):
                break
        else:
            return list(args), None
    return tree_flatten((args, kwargs))


def unflatten(flat: list, spec: Any) -> tuple[tuple, dict]:
    if spec is None:
        return tuple(flat), {}
    a, k = tree_unflatten(flat, spec)
    return a, k
