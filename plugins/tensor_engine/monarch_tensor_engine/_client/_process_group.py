"""``mesh.process_group(dims)``: a ``torch.distributed`` process group over
some dimensions of a mesh, for the remote functions that run on its procs
(the reference's ``RemoteProcessGroup``).

Contract:

* ``mesh.process_group(dims)`` (a dimension name or several) returns a
  :class:`RemoteProcessGroup` in the client.  Passed to a remote function
  (``remote(fn)(t, pg)``, inside ``with mesh.activate():``), it arrives on
  each proc as that proc's ``torch.distributed`` process group over
  ``dims``: its members are the procs that share their coordinates in every
  other dimension, ranked in the order of ``dims`` (row-major), as
  ``t.reduce(dims)`` groups them.  The function calls the collectives of
  ``torch.distributed`` with ``group=pg`` (``all_reduce``, ``all_gather``,
  ``broadcast(..., group_src=)``, ``barrier``, ...); ``pg.rank()`` and
  ``pg.size()`` are the proc's rank in it and its size.  There is no
  default (world) group on the procs, so the forms that take global ranks
  (``dist.get_rank(pg)``, ``src=``) are not available: use ``group_src=``/
  ``group_dst=`` and ``pg.rank()``.
* The group is made on first use, per stream (a collective of another
  stream runs on a group of its own), and cached: it is the same group
  ``t.reduce(dims)`` uses on that stream (the commands of one stream run in
  one order on every proc, so they share it safely).  Its backend is
  ``backend`` (``"gloo"`` or ``"nccl"``); ``None``: NCCL where the proc has
  CUDA, gloo otherwise.
* In the client the object is a ``torch.distributed.ProcessGroup`` of the
  group's size whose collectives do nothing, for fake tensors only: a
  remote function's results' shapes can be found by running it on fakes
  (``propagate=None`` or a callable).  Used on real tensors in the client,
  it raises.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten

from monarch_tensor_engine._protocol import ProcessGroupRef

__all__ = ["RemoteProcessGroup", "process_group"]

BACKENDS = (None, "gloo", "nccl")


class _Done:
    """The ``Work`` of a collective on fakes: already complete."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> list:
        return []

    def get_future(self) -> Any:
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result([])
        return fut


def _fakes_only(method: str) -> Any:
    def collective(self: "RemoteProcessGroup", *args: Any, **kwargs: Any) -> _Done:
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        faking = any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())
        if not (faking or tensors) or not all(isinstance(x, FakeTensor) for x in tensors):
            raise RuntimeError(
                f"{self!r}.{method}(): this process group exists on the procs of the mesh; pass it to a remote "
                f"function (monarch_core.remote(fn)(t, pg) inside `with mesh.activate():`) and call "
                f"torch.distributed there")
        return _Done()

    collective.__name__ = method
    return collective


class RemoteProcessGroup(dist.ProcessGroup):
    """The client's handle to a process group over ``dims`` of ``mesh`` (see the module docstring)."""

    def __init__(self, mesh: Any, dims: tuple[str, ...], backend: str | None) -> None:
        labels, sizes = tuple(mesh.extent.labels), tuple(mesh.extent.sizes)
        size = math.prod(dict(zip(labels, sizes))[d] for d in dims)
        super().__init__(0, size)  # type: ignore[call-arg]  # torch's stub names a store; (rank, size) is a form it takes
        self.mesh, self.dims, self.backend = mesh, dims, backend
        self.view = (labels, sizes)

    def __reduce__(self) -> Any:
        return (ProcessGroupRef, (self.dims, self.view, self.backend))

    def __repr__(self) -> str:
        return (f"RemoteProcessGroup(dims={self.dims}, size={self.size()}, mesh="
                f"{getattr(self.mesh, 'name', 'mesh')!r}, backend={self.backend or 'auto'})")

    allreduce = _fakes_only("allreduce")
    allreduce_coalesced = _fakes_only("allreduce_coalesced")
    allgather = _fakes_only("allgather")
    _allgather_base = _fakes_only("_allgather_base")
    allgather_into_tensor_coalesced = _fakes_only("allgather_into_tensor_coalesced")
    broadcast = _fakes_only("broadcast")
    reduce = _fakes_only("reduce")
    reduce_scatter = _fakes_only("reduce_scatter")
    _reduce_scatter_base = _fakes_only("_reduce_scatter_base")
    reduce_scatter_tensor_coalesced = _fakes_only("reduce_scatter_tensor_coalesced")
    alltoall_base = _fakes_only("alltoall_base")
    alltoall = _fakes_only("alltoall")
    gather = _fakes_only("gather")
    scatter = _fakes_only("scatter")
    send = _fakes_only("send")
    recv = _fakes_only("recv")

    barrier = _fakes_only("barrier")


def process_group(ctl: Any, mesh: Any, dims: Any, backend: str | None = None) -> RemoteProcessGroup:
    """``ProcMesh.process_group(dims)`` of ``mesh`` (whose controller is
    ``ctl``): see the module docstring.  Starts the groups' rendezvous store
    if it is not yet."""
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    labels = list(mesh.extent.labels)
    if not names or not all(isinstance(d, str) for d in names):
        raise TypeError(f"process_group() takes a dimension name or a non-empty sequence of them, got {dims!r}")
    unknown = [d for d in names if d not in labels]
    if unknown:
        raise ValueError(f"process_group() over unknown dimension(s) {unknown}: mesh "
                         f"{getattr(mesh, 'name', 'mesh')!r} has {dict(zip(labels, mesh.extent.sizes))}")
    if backend not in BACKENDS:
        raise ValueError(f"process_group(backend={backend!r}): pass 'gloo', 'nccl' or None (NCCL where the procs "
                         f"have CUDA, gloo otherwise)")
    ctl.store.ensure(ctl)
    return RemoteProcessGroup(mesh, tuple(d for d in labels if d in names), backend)
