"""Collectives: ``Tensor.reduce`` / ``reduce_`` over any subset of a mesh's
dimensions.

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
"""

from __future__ import annotations

import datetime
import logging
import math
from typing import Any

import torch

from monarch_tensor_engine._tensor import Tensor

logger = logging.getLogger("monarch.tensor")

REDUCTIONS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "stack")
#: seconds a collective (and a group's rendezvous) may wait for its members
TIMEOUT_S = 300


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
    from monarch_tensor_engine import _controller, _streams

    ctl = t._ctl
    if _controller.active() is not ctl:
        raise RuntimeError(f"reduce() of a tensor of mesh {ctl.mesh_name!r} must run inside "
                           f"`with mesh.activate():` of that mesh")
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; the reductions are {', '.join(REDUCTIONS)}")
    if mesh is not None and _controller.controller(mesh) is not ctl:
        if inplace:
            raise ValueError("reduce_() keeps the tensor on its mesh; use reduce(..., mesh=sub_mesh) to gather the "
                             "result to a sub-mesh")
        from monarch_tensor_engine import _transfer

        sub = _controller.controller(mesh)
        full = reduce(t, dims, reduction, scatter, None, None, inplace=False)
        result = _transfer.to_submesh(full, sub, "reduce(mesh=)")
        if out is not None:
            if not isinstance(out, Tensor) or out._ctl is not sub:
                raise TypeError(f"with mesh=, out must be a distributed tensor of that mesh {sub.mesh_name!r}")
            with _controller.Active(sub.mesh):
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
    _ensure_store(ctl)
    dead = tuple(ctl.dead)  # a group with a dead member would wait for it: those members poison their result
    ctl.send(("reduce", t._id, result._id, names, reduction, bool(scatter), tuple(fake.shape), fake.dtype,
              ctl.view(), dead))
    return result


def _ensure_store(ctl: Any) -> None:
    if ctl.store is not None:
        return
    with ctl.lock:
        ctl.flush()
        ctl.store = tuple(ctl.ranks[0].start_store.call_one().get(timeout=TIMEOUT_S))
        ctl.send(("store", *ctl.store))
        if ctl.dead:  # a death the store could not be told of yet
            mark_dead(ctl, "; ".join(f"rank {r}: {why}" for r, why in ctl.dead.items()))


# ---------------------------------------------------------------- the procs' side

def start_store(worker: Any) -> tuple[str, int]:
    """In the mesh's first proc: the groups' store, on a free port here."""
    from monarch_core.runtime import host_address

    if getattr(worker, "store", None) is None:
        addr = host_address()
        worker.store = torch.distributed.TCPStore(addr, 0, None, True, datetime.timedelta(seconds=TIMEOUT_S),
                                                  wait_for_workers=False)
        worker.store_addr = (addr, int(worker.store.port))
    return worker.store_addr


def connect_store(worker: Any, addr: str, port: int) -> None:
    if getattr(worker, "store", None) is None:
        worker.store = store_client(addr, port)


def coordinates(flat_rank: int, labels: tuple[str, ...], sizes: tuple[int, ...]) -> dict[str, int]:
    """The coordinates of the proc at ``flat_rank`` in a view (row-major)."""
    out: dict[str, int] = {}
    for label, size in zip(reversed(labels), reversed(sizes)):
        flat_rank, out[label] = divmod(flat_rank, size)
    return {label: out[label] for label in labels}


def _group(worker: Any, names: tuple[str, ...], device: torch.device, view: tuple) -> tuple[Any, int, int]:
    """(process group, rank in it, size) of this proc for a reduction over
    ``names`` of ``view`` (labels, sizes) on the stream running now (each
    stream has its own groups)."""
    from monarch_tensor_engine._worker import stream_key

    groups = worker.groups
    if groups is None:
        groups = worker.groups = {}
    labels, sizes = view
    backend = "nccl" if device.type == "cuda" else "gloo"
    stream = stream_key()
    key = (names, view, backend, stream)
    got = groups.get(key)
    if got is not None:
        return got
    where = coordinates(worker.mesh_rank, labels, sizes)
    dim_sizes = dict(zip(labels, sizes))
    others = tuple((d, where[d]) for d in labels if d not in names)
    rank = 0
    for d in names:
        rank = rank * dim_sizes[d] + where[d]
    size = math.prod(dim_sizes[d] for d in names)
    shape = ",".join(f"{d}:{n}" for d, n in zip(labels, sizes))
    prefix = f"monarch-group/{stream}/{backend}/{shape}/{','.join(names)}/{','.join(f'{d}={c}' for d, c in others)}"
    store = torch.distributed.PrefixStore(prefix, worker.store)
    if backend == "nccl":
        arrive(store, size, worker.store)
        pg = torch.distributed.ProcessGroupNCCL(store, rank, size)
    else:
        pg = gloo_group(store, rank, size, worker.store)
    groups[key] = got = (pg, rank, size)
    return got


#: the key of a mesh's store that the client sets when one of the mesh's procs dies
DEAD_KEY = "monarch-dead"


def arrive(store: Any, size: int, base: Any) -> None:
    """Wait until the ``size`` members of a new group (``store`` is its
    prefix of ``base``, the mesh's store) have arrived, or raise when the
    client has marked a proc of the mesh dead (:data:`DEAD_KEY` in ``base``)
    or after :data:`TIMEOUT_S`: a group whose member died never forms, and
    its members must not wait for it."""
    import time

    n = store.add("arrived", 1)
    deadline = time.monotonic() + TIMEOUT_S
    pause = 0.001
    while n < size:
        if base.check([DEAD_KEY]):
            raise RuntimeError(f"a member of this group will not come: {base.get(DEAD_KEY).decode()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {n} of the {size} members of this group arrived within {TIMEOUT_S} s")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
        n = store.add("arrived", 0)


def mark_dead(ctl: Any, why: str) -> None:
    """The client's side: tell the mesh's procs (through its store) that one of them died."""
    if ctl.store is None:
        return
    try:
        store_client(*ctl.store).set(DEAD_KEY, why)
    except Exception as e:  # noqa: BLE001 - the store's proc may be the dead one: its members fail on their own
        logger.info("tensor engine: could not mark the death in the store of %r: %s", ctl.mesh_name, e)


def gloo_group(store: Any, rank: int, size: int, base: Any) -> Any:
    """A gloo process group on ``store``, bound to the address the other procs
    reach this one at (not whatever the host name resolves to), once its
    members have all arrived (:func:`arrive`)."""
    from monarch_core.runtime import host_address

    arrive(store, size, base)
    opts = torch.distributed.ProcessGroupGloo._Options()
    opts._timeout = datetime.timedelta(seconds=TIMEOUT_S)
    opts._devices = [torch.distributed.ProcessGroupGloo.create_device(hostname=host_address())]
    return torch.distributed.ProcessGroupGloo(store, rank, size, opts)


def store_client(addr: str, port: int) -> Any:
    """A client of the store at ``addr:port``."""
    return torch.distributed.TCPStore(addr, port, None, False, datetime.timedelta(seconds=TIMEOUT_S))


_OPS = {"sum": "SUM", "avg": "SUM", "product": "PRODUCT", "min": "MIN", "max": "MAX", "band": "BAND",
        "bor": "BOR", "bxor": "BXOR"}


def run_reduce(worker: Any, in_id: int, out_id: int, names: tuple[str, ...], reduction: str, scatter: bool,
               shape: tuple[int, ...], dtype: torch.dtype, view: tuple, dead: tuple = ()) -> None:
    from monarch_tensor_engine._worker import Poison, TensorOpError

    if dead:
        labels, _sizes = view
        mine = coordinates(worker.mesh_rank, *view)
        kept = [d for d in labels if d not in names]
        for r in dead:
            theirs = coordinates(r, *view)
            if all(theirs[d] == mine[d] for d in kept):
                worker.env[out_id] = Poison(TensorOpError(
                    f"reduce({names}, {reduction!r}) on the proc at {worker.where}: rank {theirs} of its group died",
                    "reduce", worker.where))
                return

    dist = torch.distributed
    src = worker.env.get(in_id)
    poison = src if isinstance(src, Poison) else None
    if poison is not None or src is None:
        x = torch.zeros(shape, dtype=dtype)  # take part all the same: the others must not wait
    else:
        x = src
    try:
        pg, rank, size = _group(worker, names, x.device, view)
        data = x.contiguous() if not x.is_contiguous() else x
        if reduction == "stack":
            if scatter:
                result = torch.empty_like(data)
                pg.alltoall_base(result, data, [], []).wait()
            else:  # gathered straight into the rows of the result (no stack copy)
                result = torch.empty((size, *data.shape), dtype=data.dtype, device=data.device)
                pg.allgather([list(result.unbind(0))], [data]).wait()
        else:
            buf = data if (in_id == out_id and data is x) else data.clone()
            opts = dist.AllreduceOptions()
            opts.reduceOp = getattr(dist.ReduceOp, _OPS[reduction])
            pg.allreduce([buf], opts).wait()
            if reduction == "avg":
                buf.div_(size)
            result = buf.chunk(size)[rank].clone() if scatter else buf
    except Exception as e:  # noqa: BLE001 - contained: the result is poisoned
        worker.env[out_id] = Poison(TensorOpError(
            f"reduce({names}, {reduction!r}, scatter={scatter}) failed on the proc at {worker.where}: "
            f"{type(e).__name__}: {e}", "reduce", worker.where))
        return
    if poison is not None:
        worker.env[out_id] = poison
        return
    dest = worker.env.get(out_id)
    if out_id == in_id:
        if result is not x:
            x.copy_(result)
    elif isinstance(dest, torch.Tensor) and dest is not result:  # out=
        dest.copy_(result)
    else:
        worker.env[out_id] = result
