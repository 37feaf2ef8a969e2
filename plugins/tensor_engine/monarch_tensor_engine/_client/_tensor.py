"""``Tensor``: the client's handle to a tensor that lives on every proc of a mesh.

A handle is a ``torch.Tensor`` wrapper subclass with the shape, dtype, device
and ``requires_grad`` of a *fake* tensor (``torch._subclasses.FakeTensor``)
that the client keeps in step by running every operation on the fakes too.
It holds no data.  Inside ``mesh.activate()`` the controller's torch function
mode turns each operation on handles into a command for the procs; outside
it, any use is an error that says how to get a value (``inspect``,
``fetch_shard``).  Dropping the last reference to a handle frees the tensor
on the procs (with the next batch of commands).
"""

from __future__ import annotations

import collections
import math
import weakref
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from monarch_tensor_engine._client._ops import VALUE_READS, is_mutating, op_name
from monarch_tensor_engine._protocol import meta_key
from monarch_tensor_engine._worker._env import local_tensor

__all__ = ["Tensor", "outside_mesh"]


def _nbytes(shape: tuple, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


#: the distributed tensors last pickled for an actor: kept alive a while, so that their drop reaches the
#: procs well after the actor took them (see ``_worker._env.local_tensor``)
_SENT: collections.deque = collections.deque(maxlen=256)


class Tensor(torch.Tensor):
    """A distributed tensor: one tensor per proc of ``mesh``, all with this
    shape, dtype and device (see the module docstring).  ``reduce`` and
    ``reduce_`` are the collectives; ``to_mesh`` moves it to another mesh."""

    _id: int
    _ctl: Any
    #: the stream it belongs to (``_streams.Stream``)
    _stream: Any
    #: None, or what checks its uses while it is lent or borrowed (``_streams.Lent``/``Borrow``)
    _guard: Any
    #: (shape, strides, dtype, device, requires_grad): what a cached operation's key holds; an in-place
    #: operation that changes the metadata (``unsqueeze_``, ``t_``, ``resize_``...) updates it with the fake
    #: (``_controller._sync``).  Every metadata query goes through torch function to the fake: the wrapper's
    #: own sizes are those it was made with
    _key: tuple
    #: its fake tensor, or None until something needs it (a result of a cached operation)
    _fk: Any
    #: the client's copy of its value, where it is known (``_known``; absent otherwise)
    _known: torch.Tensor

    @staticmethod
    def __new__(cls, fake: torch.Tensor | None, ident: int, ctl: Any, stream: Any, key: tuple | None = None) -> "Tensor":
        if key is None:
            assert fake is not None, "a handle needs its fake or its metadata"
            key = meta_key(fake)
        shape, stride, dtype, device, requires_grad = key
        with torch._C.DisableTorchFunction():
            r = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
                cls, shape, strides=stride, dtype=dtype, device=device, requires_grad=requires_grad)
        r._fk, r._id, r._ctl, r._stream, r._guard, r._key = fake, ident, ctl, stream, None, key
        weakref.finalize(r, ctl.release, ident, stream, _nbytes(shape, dtype))
        return r

    def __init__(self, fake: torch.Tensor | None, ident: int, ctl: Any, stream: Any, key: tuple | None = None) -> None:
        pass

    @property
    def _fake(self) -> Any:
        """Its fake tensor (made from its metadata on first use)."""
        fk = self._fk
        if fk is None:
            fk = self._fk = self._ctl.materialize(self)
        return fk

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # reached only outside an active mesh: the mode handles everything inside
        return outside_mesh(func, args, kwargs)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (),  # type: ignore[override]
                           kwargs: Any = None) -> Any:
        raise RuntimeError(f"a distributed tensor reached torch's dispatcher ({func}): this is a bug of the tensor "
                           f"engine, please report it with the operation that led here")

    @property
    def mesh(self) -> Any:
        """The proc mesh this tensor lives on."""
        return self._ctl.mesh

    @property
    def stream(self) -> Any:
        """The stream it belongs to (the only one that may use it, unless borrowed)."""
        return self._stream

    def reduce(self, dims: Any, reduction: str = "sum", scatter: bool = False, mesh: Any = None,
               out: "Tensor | None" = None) -> "Tensor":
        """The collective over the mesh dimensions ``dims`` (a name or several):
        ``reduction`` ``sum``/``avg``/``product``/``min``/``max``/``band``/
        ``bor``/``bxor`` (all-reduce; the result has this shape) or ``stack``
        (all-gather: a new first dimension, one entry per member of the group).
        ``scatter=True``: reduce-scatter (this tensor's first dimension is
        split across the group) or, with ``stack``, all-to-all.  ``out``: write
        the result there."""
        return self._ctl.reduce(self, dims, reduction, scatter, mesh, out, inplace=False)

    def reduce_(self, dims: Any, reduction: str = "sum", scatter: bool = False, mesh: Any = None) -> "Tensor":
        """:meth:`reduce` in place (``sum``... only: not ``stack`` nor ``scatter``)."""
        return self._ctl.reduce(self, dims, reduction, scatter, mesh, None, inplace=True)

    def to_mesh(self, mesh: Any) -> "Tensor":
        """This tensor on ``mesh`` (same sizes): rank i's value goes to rank i of ``mesh``."""
        return self._ctl.to_mesh(self, mesh)

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        ctl = self.__dict__.get("_ctl")
        where = f" on mesh {ctl.mesh_name!r} {ctl.sizes}" if ctl is not None else ""
        return (f"monarch Tensor(shape={tuple(self.shape)}, dtype={self.dtype}, device={self.device}{where}; "
                f"values live on the procs: inspect(t) or fetch_shard(t) fetches one)")

    __str__ = __repr__

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Passed to an actor's endpoint (call, broadcast, ...): each actor receives its own proc's tensor, as in
        # the reference.  The commands that make it are sent first; the handle is kept a while (_SENT), so that
        # its drop does not overtake the message.
        ctl = self._ctl
        if ctl.closed or ctl.workers is None:
            raise ctl.gone()
        ctl.flush()
        _SENT.append(self)
        return (local_tensor, (ctl.workers._name, self._id, ctl.mesh_name))


def outside_mesh(func: Any, args: Any, kwargs: Any) -> Any:
    """An operation on a distributed tensor with no mesh active: it runs on
    the mesh of its distributed tensors, as if that mesh were active (the
    reference's rule: the tensors' mesh is the mesh; the commands are sent
    at once).  Metadata queries are answered from the fake; reading a value,
    or tensors of two meshes, is an error."""
    kwargs = kwargs or {}
    flat, spec = tree_flatten((tuple(args), kwargs))
    owners = {x._ctl for x in flat if isinstance(x, Tensor)}
    name = getattr(func, "__name__", "")
    if len(owners) == 1 and name not in VALUE_READS:
        ctl = next(iter(owners))
        if ctl.closed:
            raise ctl.gone()
        try:
            return ctl.dispatch(func, tuple(args), dict(kwargs))
        finally:
            ctl.flush()
    fakes = [x._fake if isinstance(x, Tensor) else x for x in flat]
    name = getattr(func, "__name__", "")
    if name not in VALUE_READS and not is_mutating(func):
        ctl = next(iter(owners))
        fargs, fkwargs = tree_unflatten(fakes, spec)
        with ctl.fake_mode:
            out = func(*fargs, **fkwargs)
        if not any(isinstance(o, torch.Tensor) for o in tree_flatten(out)[0]):
            return out
    mesh = ", ".join(repr(c.mesh_name) for c in owners)
    raise RuntimeError(
        f"{op_name(func)}: a distributed tensor of mesh {mesh} was used outside `with mesh.activate():`; its values "
        f"live on the procs: run the operation inside the mesh, or fetch a local value first with "
        f"monarch_core.inspect(t, **coords) / fetch_shard(t, **coords).get()")
