"""What this plugin provides as the tensor engine (the ``monarch_tensor_engine``
hook returns this module): ``ProcMesh.activate``/``rank_tensor``/
``rank_tensors`` and the reference's top-level names, which ``monarch_core``
re-exports (``import monarch_core as monarch; monarch.inspect(t)``).
Loading it wraps torch's global-state functions that must reach the procs
(``torch.manual_seed``, ...; see ``_globals``); ``api.random`` is the
reference's ``monarch.random`` (:mod:`monarch_tensor_engine.random`)."""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

from monarch_core.actor import context
from monarch_tensor_engine import _values, random
from monarch_tensor_engine._client import _controller, _globals, _grads, _process_group, _propagate, _transfer
from monarch_tensor_engine._client._collectives import reduce as _reduce
from monarch_tensor_engine._client._process_group import RemoteProcessGroup
from monarch_tensor_engine._client._streams import Borrow, Stream, get_active_stream
from monarch_tensor_engine._client._tensor import Tensor
from monarch_tensor_engine._protocol import RankTensor, TensorOpError

__all__ = [
    "Borrow", "RemoteProcessGroup", "Stream", "Tensor", "TensorOpError", "activate", "exit_engine", "start_engine",
    "get_active_stream", "call_on_shard_and_fetch", "fetch_shard", "get_active_mesh",
    "grad_generator", "inspect",
    "no_mesh", "process_group", "random", "rank_tensor", "rank_tensors", "reduce", "reduce_", "remote", "rref", "show", "slice_mesh", "to_mesh",
]


_globals.install()


def activate(proc_mesh: Any) -> _controller.Active:
    """``ProcMesh.activate()``: a context manager inside which torch runs on every proc of ``proc_mesh``.
    Refused while the client's default device is not the CPU (``_globals.check_activate``)."""
    _globals.check_activate()
    return _controller.Active(proc_mesh)


def start_engine(proc_mesh: Any) -> None:
    """Spawn the engine's workers on ``proc_mesh``'s procs now, rather than at
    its first ``activate()`` (the reference's ``spawn_tensor_engine``); does
    nothing when they run already."""
    _controller.controller(proc_mesh)


def exit_engine(proc_mesh: Any, timeout: float = 60.0) -> None:
    """Stop the engine's workers on ``proc_mesh``'s procs and wait for them
    (the reference's ``DeviceMesh.exit()``); the procs and their actors keep
    running.  The mesh's commands not yet sent are sent first; its
    distributed tensors are gone after this (using one is an error), and a
    later ``activate()`` spawns new workers.  Does nothing when no workers
    run there.  ``TimeoutError`` if they are not stopped within ``timeout``
    seconds (they keep stopping)."""
    with _controller._lock:
        ctl = _controller._controllers.get(tuple(proc_mesh.proc_ids))
    if ctl is None:
        return
    workers = ctl.workers
    if not ctl.closed:
        ctl.close()  # what is pending reaches the workers before their stop
    ctl.release_state()  # out of the registry: the next activate() makes a new controller
    if workers is not None:
        workers.stop("the tensor engine exited (exit_engine / DeviceMesh.exit())").get(timeout=timeout)


def process_group(proc_mesh: Any, dims: Any, backend: str | None = None) -> RemoteProcessGroup:
    """``ProcMesh.process_group(dims)``: a ``torch.distributed`` process group over
    ``dims`` for remote functions on the procs (see ``_process_group``)."""
    return _process_group.process_group(_controller.controller(proc_mesh), proc_mesh, dims, backend)


def get_active_mesh() -> Any:
    """The proc mesh of the innermost ``activate()`` of this thread, or ``None``."""
    ctl = _controller.active()
    return ctl.mesh if ctl is not None else None


def no_mesh() -> _controller.NoMesh:
    """A context manager inside which torch runs locally, whatever mesh is active."""
    return _controller.NoMesh()


def _check(t: Any, what: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise TypeError(f"{what} takes a distributed tensor (made inside `with mesh.activate():`), got "
                        f"{type(t).__name__}")
    return t


def fetch_shard(t: Any, shard: dict[str, int] | None = None, **coords: int) -> Any:
    """A ``Future`` of the value of ``t`` on the proc at ``coords`` (a mapping,
    or keywords; a dimension left out is 0), as a local ``torch.Tensor``.  An
    operation that failed there raises its :class:`TensorOpError` (inside an
    ``ActorError``) when the future is read."""
    t = _check(t, "fetch_shard()")
    where = dict(shard or {}, **coords)
    return t._ctl.fetch(t, where)


def inspect(t: Any, shard: dict[str, int] | None = None, **coords: int) -> torch.Tensor:
    """The value of ``t`` on the proc at ``coords``: ``fetch_shard(...).get()``."""
    return fetch_shard(t, shard, **coords).get()


def show(t: Any, shard: dict[str, int] | None = None, **coords: int) -> None:
    """Print the value of ``t`` on the proc at ``coords`` (every proc's with no coordinates and a
    mesh of at most 16 procs)."""
    t = _check(t, "show()")
    ctl = t._ctl
    if shard or coords or len(ctl.coords) > 16:
        where = dict(shard or {}, **coords)
        print(f"{where or dict.fromkeys(ctl.labels, 0)}:\n{inspect(t, where)}")
        return
    futures = [(c, ctl.fetch(t, c)) for c in ctl.coords]
    for c, f in futures:
        print(f"{c}:\n{f.get()}")


def rank_tensor(proc_mesh: Any, dim: str) -> Tensor:
    """``ProcMesh.rank_tensor(dim)``: an int64 scalar on every proc, its coordinate along ``dim``."""
    ctl = _controller.controller(proc_mesh)
    labels, sizes = tuple(proc_mesh.extent.labels), tuple(proc_mesh.extent.sizes)
    if dim not in labels:
        raise ValueError(f"unknown dimension {dim!r}: mesh {getattr(proc_mesh, 'name', 'mesh')!r} has "
                         f"{dict(zip(labels, sizes))}")
    h = ctl.new_handle(ctl.make_fake((), torch.int64, torch.device("cpu")))
    ctl.send(RankTensor(dim, (labels, sizes), h._id))
    return h


def rank_tensors(proc_mesh: Any) -> dict[str, Tensor]:
    """``ProcMesh.rank_tensors()``: ``{dim: rank_tensor(dim)}`` for every dimension."""
    return {d: rank_tensor(proc_mesh, d) for d in proc_mesh.extent.labels}


def reduce(t: Any, dims: Any, reduction: str = "sum", scatter: bool = False, mesh: Any = None,
           out: Any = None) -> Tensor:
    """``t.reduce(...)`` as a function (see :meth:`Tensor.reduce`)."""
    return _reduce(_check(t, "reduce()"), dims, reduction, scatter, mesh, out, inplace=False)


def reduce_(t: Any, dims: Any, reduction: str = "sum", scatter: bool = False, mesh: Any = None) -> Tensor:
    """``t.reduce_(...)`` as a function."""
    return _reduce(_check(t, "reduce_()"), dims, reduction, scatter, mesh, None, inplace=True)


class _Remote:
    """``remote(fn, propagate=...)``: ``fn`` called on every proc of the active
    mesh, over the procs' tensors; how the client learns the results' shapes
    is ``propagate``'s (see ``_propagate``).  With no active mesh it is an
    ordinary local call."""

    def __init__(self, fn: Callable[..., Any] | str, propagate: Any) -> None:
        if isinstance(fn, str):
            module, _, name = fn.rpartition(".")
            if not module:
                raise ValueError(f"remote({fn!r}): name a function as 'package.module.function'")
            fn = getattr(importlib.import_module(module), name)
        if not callable(fn):
            raise TypeError(f"remote() takes a function or 'module.function', got {fn!r}")
        _propagate.check(propagate, f"remote({getattr(fn, '__name__', fn)})")
        self.fn, self.propagate = fn, propagate
        self.__name__ = getattr(fn, "__name__", "remote")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _propagate.run_remote(self.fn, args, kwargs, self.propagate)

    # the reference's Remote is an endpoint of the active mesh: its adverbs
    # bring the function's values back to the client (``_values``)
    def call(self, *args: Any, **kwargs: Any) -> Any:
        """A ``Future`` of the ``ValueMesh`` of ``fn``'s result on every proc of the active mesh."""
        return _values.call(self.fn, args, kwargs)

    def call_one(self, *args: Any, **kwargs: Any) -> Any:
        """A ``Future`` of ``fn``'s result on the active mesh's only proc."""
        return _values.call_one(self.fn, args, kwargs)

    def choose(self, *args: Any, **kwargs: Any) -> Any:
        """A ``Future`` of ``fn``'s result on one proc of the active mesh, chosen at random."""
        return _values.choose(self.fn, args, kwargs)

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        """A ``Future`` per proc of the active mesh of ``fn``'s result there, in rank order."""
        return _values.stream(self.fn, args, kwargs)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Run ``fn`` on every proc of the active mesh, keeping nothing."""
        _values.broadcast(self.fn, args, kwargs)

    def _send(self, args: tuple, kwargs: dict, port: Any, selection: str) -> None:
        """``monarch_core.actor.send(remote(fn), args, kwargs, port=..., selection=...)``."""
        _values.send(self.fn, tuple(args), dict(kwargs), port, selection)

    def __repr__(self) -> str:
        return f"remote({self.__name__}, propagate={self.propagate!r})"


def remote(fn: Callable[..., Any] | str | None = None, *, propagate: Any = None) -> Any:
    """Run ``fn`` on every proc of the active mesh (see :class:`_Remote`);
    ``@remote(propagate=...)`` decorates."""
    if fn is None:
        return lambda f: _Remote(f, propagate)
    return _Remote(fn, propagate)


def call_on_shard_and_fetch(fn: Any, *args: Any, shard: dict[str, int] | None = None, **kwargs: Any) -> Any:
    """Run ``remote(fn)`` over the active mesh and return a ``Future`` of its
    (single tensor) result on the proc at ``shard``."""
    result = (fn if isinstance(fn, _Remote) else remote(fn))(*args, **kwargs)
    return fetch_shard(result, shard or {})


def grad_generator(roots: Any, with_respect_to: Any, grad_roots: Any = None) -> Any:
    """Yield the gradient of ``roots`` with respect to each tensor of
    ``with_respect_to``, one at a time, in that order (``None`` for one that
    took no part).  Pass the parameters in reverse (the backward reaches the
    last layers first) and reduce each gradient as it comes: on the procs
    one backward runs on a thread of its own and each gradient is handed
    over as soon as it is complete, so reductions issued on another stream
    (``comms.borrow(grad, mutable=True)``) overlap the rest of the backward.
    See ``_grads`` for the contract."""
    return _grads.grad_generator(roots, with_respect_to, grad_roots)


def rref(endpoint: Any, args: tuple, kwargs: dict) -> Any:
    """``Endpoint.rref``: call the endpoint on every actor of its mesh, inside
    the active mesh (the actors' mesh must have its shape: actors spawned on
    it); distributed tensors among the arguments arrive as each proc's
    tensor, and the tensor results stay on the procs as distributed tensors,
    whose shapes the endpoint's ``propagate`` gives (a callable run on fakes,
    ``"cached"`` (the default) or ``"inspect"``; see ``_propagate``)."""
    ctl = _controller.active()
    if ctl is None:  # the mesh of the distributed tensors among the arguments, as in the reference
        owners = {x._ctl for x in tree_flatten((args, kwargs))[0] if isinstance(x, Tensor)}
        if len(owners) != 1:
            raise RuntimeError("Endpoint.rref() runs inside `with mesh.activate():` of the mesh its actors live on "
                               "(or, outside one, on the mesh of the distributed tensors among its arguments)")
        ctl = next(iter(owners))
        try:
            with _controller.Active(ctl.mesh):
                return rref(endpoint, args, kwargs)
        finally:
            ctl.flush()
    prop = endpoint.propagate
    _propagate.check(prop, f"rref() of {endpoint.name}")
    actors = endpoint.mesh
    if dict(zip(actors.extent.labels, actors.extent.sizes)) != ctl.sizes:
        raise ValueError(f"rref() of {endpoint.name}: its actors' mesh {dict(actors.extent.items())} is not the "
                         f"active mesh {ctl.sizes}: spawn them on the active mesh")
    call = _ActorCall(actors, endpoint.name)
    return _propagate.call(ctl, call, tuple(args), dict(kwargs), prop,
                           owner=("rref", getattr(actors, "name", id(actors)), endpoint.name), local_fn=None)


class _ActorCall:
    """What a worker runs for ``rref``: the endpoint of the actor at its own coordinates."""

    def __init__(self, actors: Any, name: str) -> None:
        self.actors, self.name = actors, name
        self.__name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        where = dict(context().actor_instance.rank.items())
        ep = getattr(self.actors.slice(**where), self.name)
        return ep.call_one(*args, **kwargs).get(timeout=3600)


def to_mesh(t: Any, mesh: Any) -> Tensor:
    """``t.to_mesh(mesh)``: rank i's value of ``t`` on rank i of ``mesh`` (the meshes need the same sizes)."""
    return _transfer.to_mesh(_check(t, "to_mesh()"), mesh)


def slice_mesh(t: Any, **coords: Any) -> Tensor:
    """``t`` on the sub-mesh ``t.mesh.slice(**coords)``, each proc keeping its value."""
    return _transfer.slice_mesh(_check(t, "slice_mesh()"), **coords)
