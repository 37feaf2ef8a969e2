"""Collectives, the client's side: ``Tensor.reduce`` / ``reduce_`` over any
subset of a mesh's dimensions (the procs' side is ``_worker._collectives``).

The client checks the arguments, works out the result's shape (so that the
next operations can be checked and pipelined too) and sends one ``reduce``
command.  On the procs, the members of a group are the procs that share
their coordinates in every dimension *not* reduced over; each group is a
``torch.distributed`` process group (gloo for CPU tensors, NCCL for CUDA
ones) made at its first use and cached.  The groups' rendezvous is a
``TCPStore`` that the mesh's first proc starts on a free port of its host,
at the address the other procs already reach it at; its address travels in
the engine's own commands (no fixed port, nothing to configure).

Reductions: ``sum``, ``avg`` (floating point), ``product``, ``min``, ``max``,
``band``/``bor``/``bxor`` (integers and bool) and ``stack`` (all-gather: a new
first dimension of the group's size, in the group's rank order).
``mesh=`` a sub-mesh of the tensor's mesh (``mesh.slice(dp=0)``): the result
is a tensor of that mesh, each of its procs holding its group's result (the
reduction runs over the whole group, then each member of the sub-mesh keeps
its value, handed over inside its process).
``scatter=True``: reduce-scatter (the input's first dimension, divisible by
the group's size, is split; member i keeps the i-th block of the reduction;
done as an all-reduce followed by a slice: gloo has no reduce-scatter) or,
with ``stack``, all-to-all (the input's first dimension is the group's size;
member i receives block i of every member, stacked).

Failures: a collective's outcome is the same on every member.  A poisoned
input on one member poisons every member's result, naming that member and
its failed op (a poisoned flag per member travels with the data: in the
buffer of a small all-reduce, in a tiny all-reduce beside a bigger collective).  A member that the client knows is dead (it
marks deaths in the store, ``_store.StoreLink.mark_dead``) fails every group it belongs
to on every living member, at once: before the command is sent, while the
group forms (:func:`arrive`, :func:`form`) or while the collective runs
(:func:`watch`); a group of living procs is not concerned.
"""

from __future__ import annotations

import math
from typing import Any

from monarch_tensor_engine import _protocol as P
from monarch_tensor_engine._client import _active, _streams, _transfer
from monarch_tensor_engine._client._tensor import Tensor

REDUCTIONS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "stack")


def _dims(ctl: Any, dims: Any) -> tuple[str, ...]:
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    if not names or not all(isinstance(d, str) for d in names):
        raise TypeError(f"dims must be a dimension name or a non-empty sequence of them, got {dims!r}")
    unknown = [d for d in names if d not in ctl.labels]
    if unknown:
        raise ValueError(f"reduce over unknown dimension(s) {unknown}: mesh {ctl.mesh_name!r} has {ctl.sizes}")
    return tuple(d for d in ctl.labels if d in names)


def result_shape(shape: tuple[int, ...], n: int, reduction: str, scatter: bool) -> tuple[int, ...]:
    if reduction == "stack":
        if scatter:
            if not shape or shape[0] != n:
                raise ValueError(f"all-to-all (reduction='stack', scatter=True) needs a first dimension of the "
                                 f"group's size {n}, got shape {shape}")
            return shape
        return (n, *shape)
    if scatter:
        if not shape or shape[0] % n:
            raise ValueError(f"reduce-scatter needs a first dimension divisible by the group's size {n}, "
                             f"got shape {shape}")
        return (shape[0] // n, *shape[1:])
    return shape


def reduce(t: Tensor, dims: Any, reduction: str, scatter: bool, mesh: Any, out: Tensor | None, *,
           inplace: bool) -> Tensor:
    ctl = t._ctl
    if _active.active() is not ctl:
        raise RuntimeError(f"reduce() of a tensor of mesh {ctl.mesh_name!r} must run inside "
                           f"`with mesh.activate():` of that mesh")
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; the reductions are {', '.join(REDUCTIONS)}")
    if mesh is not None and ctl.controller_of(mesh) is not ctl:
        if inplace:
            raise ValueError("reduce_() keeps the tensor on its mesh; use reduce(..., mesh=sub_mesh) to gather the "
                             "result to a sub-mesh")
        sub = ctl.controller_of(mesh)
        full = reduce(t, dims, reduction, scatter, None, None, inplace=False)
        result = _transfer.to_submesh(full, sub, "reduce(mesh=)")
        if out is not None:
            if not isinstance(out, Tensor) or out._ctl is not sub:
                raise TypeError(f"with mesh=, out must be a distributed tensor of that mesh {sub.mesh_name!r}")
            with sub.activate():
                out.copy_(result)
            return out
        return result
    _streams.check_use(t, inplace, "reduce")
    if out is not None and isinstance(out, Tensor):
        _streams.check_use(out, True, "reduce(out=)")
    names = _dims(ctl, dims)
    n = math.prod(ctl.sizes[d] for d in names)
    fake = t._fake
    if reduction == "avg" and not (fake.dtype.is_floating_point or fake.dtype.is_complex):
        raise TypeError(f"reduction 'avg' needs a floating-point tensor, got {fake.dtype}")
    if reduction in ("band", "bor", "bxor") and (fake.dtype.is_floating_point or fake.dtype.is_complex):
        raise TypeError(f"reduction {reduction!r} needs an integer or bool tensor, got {fake.dtype}")
    shape = result_shape(tuple(fake.shape), n, reduction, scatter)
    if inplace and (reduction == "stack" or scatter):
        raise ValueError("reduce_() works in place: it needs a reduction that keeps the shape "
                         "(not 'stack', not scatter=True); use reduce()")
    if out is not None:
        if not isinstance(out, Tensor) or out._ctl is not ctl:
            raise TypeError("out must be a distributed tensor of the same mesh")
        if tuple(out.shape) != shape or out.dtype != fake.dtype:
            raise ValueError(f"out has shape {tuple(out.shape)} and dtype {out.dtype}; the result has shape "
                             f"{shape} and dtype {fake.dtype}")
        result = out
    elif inplace:
        result = t
    else:
        result = ctl.new_handle(ctl.make_fake(shape, fake.dtype, fake.device))
    ctl.store.ensure(ctl)
    dead = tuple(ctl.dead.items())  # a group with a dead member would wait for it: its members poison their result
    ctl.send(P.Reduce(t._id, result._id, names, reduction, bool(scatter), tuple(fake.shape), fake.dtype,
                      ctl.view(), dead))
    return result
