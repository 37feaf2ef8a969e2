"""Tensors between meshes, the procs' side: the ``Send``/``Recv`` commands of
``t.to_mesh(other)`` / ``slice_mesh`` (the contract is ``_client._transfer``'s).

A pair on the same proc hands the tensor over inside the process (no copy:
the two meshes' workers are actors of one process); a pair on two procs
sends it over a two-member gloo group (made at the pair's first transfer,
met through the source mesh's store, and cached per stream).  A poisoned
source poisons the result, with its error.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from monarch_core.runtime import format_duration
from monarch_tensor_engine._protocol import TIMEOUT_S, Recv, Send, TensorOpError
from monarch_tensor_engine._worker._collectives import gloo_group
from monarch_tensor_engine._worker._env import Poison, stream_key

_handoff: dict[tuple, Any] = {}
_handoff_cond = threading.Condition()


def _pair_group(worker: Any, pair: str, i_src: int, i_dst: int, store: tuple, rank: int) -> Any:
    groups = worker.pairs
    stream = stream_key()
    key = (pair, i_src, i_dst, stream)
    pg = groups.get(key)
    if pg is None:
        base = worker.store.client(store)
        prefix = torch.distributed.PrefixStore(f"monarch-p2p/{stream}/{pair}/{i_src}/{i_dst}", base)
        pg = groups[key] = gloo_group(prefix, rank, 2, worker.store.watcher(store), (i_src,))  # the source's death ends the wait
    return pg


def run_send(worker: Any, cmd: Send) -> None:
    """The source side of a transfer (see ``_client._transfer``)."""
    ident, key, pair, routes, store, shape, dtype = cmd
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


def run_recv(worker: Any, cmd: Recv) -> None:
    """The destination side of a transfer: the result, or a poisoned one."""
    ident, key, pair, routes, store, shape, dtype, what = cmd
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
