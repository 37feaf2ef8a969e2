"""Tensors between meshes: ``t.to_mesh(other)`` and ``slice_mesh(t, **coords)``.

Contract:

* ``to_mesh(t, other)``: rank i of ``t``'s mesh sends its tensor to rank i
  of ``other`` (pipeline stages on sliced meshes).  The two meshes must have
  the same sizes, in order (``ValueError`` naming both otherwise).  The
  result is a tensor of ``other`` with ``t``'s shape and dtype.
* ``slice_mesh(t, **coords)``: ``t`` on the sub-mesh ``t.mesh.slice(**coords)``,
  each proc keeping its own value.
* A pair on the same proc hands the tensor over inside the process (no copy:
  the two meshes' workers are actors of one process); a pair on two procs
  sends it over a two-member gloo group (made at the pair's first transfer,
  met through the source mesh's store, and cached).  A poisoned source
  poisons the result, with its error.
* Both meshes' pending commands are sent at once, so neither side waits for
  commands still in the client.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import torch

from monarch_core.runtime import format_duration

from monarch_tensor_engine._protocol import TIMEOUT_S, Recv, Send
from monarch_tensor_engine._tensor import Tensor

_keys = itertools.count(1)

# ---------------------------------------------------------------- the client's side


def _move(t: Tensor, dst_ctl: Any, routes_src: list, routes_dst: list, what: str) -> Tensor:
    from monarch_tensor_engine import _collectives

    from monarch_tensor_engine import _streams

    src_ctl = t._ctl
    _streams.check_use(t, False, what)
    src_ctl.check_alive({i for i, r in enumerate(routes_src) if r is not None}, what)
    dst_ctl.check_alive(None, what)
    fake = t._fake
    result = dst_ctl.new_handle(dst_ctl.make_fake(tuple(fake.shape), fake.dtype, fake.device))
    needs_store = any(r is not None and not r[1] for r in routes_src)
    store = None
    if needs_store:
        _collectives._ensure_store(src_ctl)
        store = src_ctl.store
    key = f"{next(_keys)}"
    pair = f"{src_ctl.mesh_name}:{id(src_ctl)}->{dst_ctl.mesh_name}:{id(dst_ctl)}"
    src_ctl.send(Send(t._id, key, pair, routes_src, store, tuple(fake.shape), fake.dtype))
    dst_ctl.send(Recv(result._id, key, pair, routes_dst, store, tuple(fake.shape), fake.dtype, what))
    src_ctl.flush()
    dst_ctl.flush()
    return result


def to_mesh(t: Tensor, mesh: Any) -> Tensor:
    from monarch_tensor_engine import _controller

    src = t._ctl
    dst = _controller.controller(mesh)
    if dst is src:
        return t
    dst_sizes = dict(zip(mesh.extent.labels, mesh.extent.sizes))
    if list(src.sizes.values()) != list(dst_sizes.values()):
        raise ValueError(f"to_mesh: the meshes do not line up: {src.mesh_name!r} has sizes {src.sizes}, the "
                         f"destination {dst_sizes}; rank i goes to rank i, so both need the same sizes in order "
                         f"(slice or rename one first)")
    n = len(src.coords)
    same = [src.proc_ids[i] == dst.proc_ids[i] for i in range(n)]
    return _move(t, dst, [(i, same[i]) for i in range(n)], [(i, same[i]) for i in range(n)], "to_mesh")


def slice_mesh(t: Tensor, **coords: Any) -> Tensor:
    from monarch_tensor_engine import _controller

    return to_submesh(t, _controller.controller(t._ctl.mesh.slice(**coords)), "slice_mesh")


def to_submesh(t: Tensor, dst: Any, what: str) -> Tensor:
    """``t`` on ``dst``, a controller of some of ``t``'s procs, each keeping its value."""
    src = t._ctl
    where = {p: i for i, p in enumerate(src.proc_ids)}
    outside = [p for p in dst.proc_ids if p not in where]
    if outside:
        raise ValueError(f"{what}: mesh {dst.mesh_name!r} {dst.sizes} is not a sub-mesh of {src.mesh_name!r} "
                         f"{src.sizes} ({len(outside)} of its procs are not in it): pass a slice of the tensor's mesh")
    routes_dst = [(where[p], True) for p in dst.proc_ids]
    routes_src: list = [None] * len(src.proc_ids)
    for j, (i, _same) in enumerate(routes_dst):
        routes_src[i] = (j, True)
    return _move(t, dst, routes_src, routes_dst, what)


# ---------------------------------------------------------------- the procs' side

_handoff: dict[tuple, Any] = {}
_handoff_cond = threading.Condition()


def _pair_group(worker: Any, pair: str, i_src: int, i_dst: int, store: tuple, rank: int) -> Any:
    from monarch_tensor_engine._collectives import gloo_group, store_client, watcher

    from monarch_tensor_engine._worker import stream_key

    groups = worker.__dict__.setdefault("pairs", {})
    stream = stream_key()
    key = (pair, i_src, i_dst, stream)
    pg = groups.get(key)
    if pg is None:
        clients = worker.__dict__.setdefault("store_clients", {})
        base = clients.get(store)
        if base is None:
            base = clients[store] = store_client(*store)
        prefix = torch.distributed.PrefixStore(f"monarch-p2p/{stream}/{pair}/{i_src}/{i_dst}", base)
        pg = groups[key] = gloo_group(prefix, rank, 2, watcher(worker, store), (i_src,))  # the source's death ends the wait
    return pg


def run_send(worker: Any, ident: int, key: str, pair: str, routes: list, store: tuple | None, shape: tuple,
             dtype: torch.dtype) -> None:
    from monarch_tensor_engine._worker import Poison, TensorOpError

    route = routes[worker.mesh_rank]
    if route is None:
        return
    j, same = route
    value = worker.env.get(ident)
    if same:
        with _handoff_cond:
            _handoff[(key, j)] = value if value is not None else Poison(TensorOpError(
                f"tensor {ident} does not exist on the source proc", "to_mesh", worker.where))
            _handoff_cond.notify_all()
        return
    pg = _pair_group(worker, pair, worker.mesh_rank, j, store, 0)
    bad = not isinstance(value, torch.Tensor)
    pg.send([torch.tensor([1 if bad else 0])], 1, 0).wait()
    pg.send([torch.zeros(shape, dtype=dtype) if bad else value.contiguous()], 1, 1).wait()


def run_recv(worker: Any, ident: int, key: str, pair: str, routes: list, store: tuple | None, shape: tuple,
             dtype: torch.dtype, what: str) -> None:
    from monarch_tensor_engine._worker import Poison, TensorOpError

    i, same = routes[worker.mesh_rank]
    if same:
        with _handoff_cond:
            if not _handoff_cond.wait_for(lambda: (key, worker.mesh_rank) in _handoff, TIMEOUT_S):
                worker.env[ident] = Poison(TensorOpError(
                    f"{what}: the source proc handed nothing over within {format_duration(TIMEOUT_S)}", what,
                    worker.where))
                return
            worker.env[ident] = _handoff.pop((key, worker.mesh_rank))
        return
    try:
        pg = _pair_group(worker, pair, i, worker.mesh_rank, store, 1)
        flag = torch.zeros(1, dtype=torch.int64)
        pg.recv([flag], 0, 0).wait()
        buf = torch.empty(shape, dtype=dtype)
        pg.recv([buf], 0, 1).wait()
    except Exception as e:  # noqa: BLE001 - contained: the result is poisoned (the source died, say)
        worker.env[ident] = Poison(TensorOpError(
            f"{what}: receiving from rank {i} of the source mesh failed on the proc at {worker.where}: "
            f"{type(e).__name__}: {e}", what, worker.where))
        return
    worker.env[ident] = buf if not int(flag) else Poison(TensorOpError(
        f"{what}: the source tensor had failed on rank {i} of the source mesh", what, worker.where))
