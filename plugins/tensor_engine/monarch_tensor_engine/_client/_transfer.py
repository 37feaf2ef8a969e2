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
  met through the source mesh's store, and cached: ``_worker._transfer``).
  A poisoned source poisons the result, with its error.
* Both meshes' pending commands are sent at once, so neither side waits for
  commands still in the client.
"""

from __future__ import annotations

import itertools
from typing import Any

from monarch_tensor_engine._client import _streams
from monarch_tensor_engine._client._tensor import Tensor
from monarch_tensor_engine._protocol import Recv, Send

_keys = itertools.count(1)

def _move(t: Tensor, dst_ctl: Any, routes_src: list, routes_dst: list, what: str) -> Tensor:
    src_ctl = t._ctl
    _streams.check_use(t, False, what)
    src_ctl.check_alive({i for i, r in enumerate(routes_src) if r is not None}, what)
    dst_ctl.check_alive(None, what)
    fake = t._fake
    result = dst_ctl.new_handle(dst_ctl.make_fake(tuple(fake.shape), fake.dtype, fake.device))
    needs_store = any(r is not None and not r[1] for r in routes_src)
    store = None
    if needs_store:
        store = src_ctl.store.ensure(src_ctl)
    key = f"{next(_keys)}"
    pair = f"{src_ctl.mesh_name}:{id(src_ctl)}->{dst_ctl.mesh_name}:{id(dst_ctl)}"
    src_ctl.send(Send(t._id, key, pair, routes_src, store, tuple(fake.shape), fake.dtype))
    dst_ctl.send(Recv(result._id, key, pair, routes_dst, store, tuple(fake.shape), fake.dtype, what))
    src_ctl.flush()
    dst_ctl.flush()
    return result


def to_mesh(t: Tensor, mesh: Any) -> Tensor:
    src = t._ctl
    dst = src.controller_of(mesh)
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
    return to_submesh(t, t._ctl.controller_of(t._ctl.mesh.slice(**coords)), "slice_mesh")


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
