"""The messaging adverbs of a remote function (``remote(fn).call()`` ...):
``fn`` runs on procs of the active mesh and its *values* come back to the
client, as an endpoint's results do (the reference's ``Remote`` is an
endpoint of the active mesh).

Contract:

* Every adverb needs an active mesh (``with mesh.activate():``), else
  ``ValueError`` naming the fix, before anything is sent.
* The function runs on the procs in the order of the mesh's other commands
  (a ``value`` command on the active stream): it sees every tensor made
  before the call, and the operations issued after it see what it changed.
  Distributed tensors among the arguments arrive as each proc's tensor.
* ``call()`` runs it on every proc and resolves to a ``ValueMesh`` of the
  results (tensors as local tensors, detached, even inside the active mesh:
  the futures are ``Fetched``, as ``fetch_shard``'s); ``call_one()`` needs a mesh
  of one proc; ``choose()`` runs it on one proc, chosen at random;
  ``stream()`` yields a future per proc, in rank order; ``broadcast()``
  runs it everywhere and keeps nothing; ``send(remote, args, kwargs,
  port=p)`` sends each proc's result to ``p``.  A failure on a proc is that
  proc's result: the future raises it (``TensorOpError``), or ``send``
  delivers it to the port as an exception.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Iterator

import torch

from monarch_core.actor import Extent, Future, ValueMesh
from monarch_tensor_engine._client import _controller
from monarch_tensor_engine._client._ops import flatten, func_ref, op_name, unflatten
from monarch_tensor_engine._client._streams import get_active_stream
from monarch_tensor_engine._client._tensor import Tensor
from monarch_tensor_engine._protocol import Ref, Value

__all__ = ["broadcast", "call", "call_one", "choose", "send", "stream"]


def _active(what: str) -> Any:
    ctl = _controller.active()
    if ctl is None:
        raise ValueError(f"{what} runs the function on the procs of the active mesh: call it inside "
                         f"`with proc_mesh.activate():` (or call the function itself for a local call)")
    return ctl


def _run(ctl: Any, fn: Callable[..., Any], args: tuple, kwargs: dict, ranks: list[int] | None,
         keep: bool) -> tuple[int | None, str]:
    """Queue ``fn`` on ``ranks`` (None: every proc) of ``ctl``'s mesh; returns
    (the key its results are kept under, or None when ``keep`` is false; the stream's key)."""
    flat, spec = flatten(args, kwargs)
    handles, _ = ctl._inputs(fn, flat)
    ctl.check_streams(fn, handles, kwargs, None)
    key = next(ctl.ids) if keep else None
    a, k = unflatten([Ref(x._id) if isinstance(x, Tensor) else x for x in flat], spec)
    ctl.send(Value(func_ref(fn), a, k, key, torch.is_grad_enabled(), op_name(fn), ranks))
    return key, get_active_stream().key


def _results(ctl: Any, fn: Callable[..., Any], args: tuple, kwargs: dict, ranks: list[int]) -> list[Any]:
    """Run ``fn`` on ``ranks`` and return a future of each one's result, in that order."""
    ctl.check_alive(ranks, f"remote({getattr(fn, '__name__', fn)})")
    with ctl.lock:
        key, stream = _run(ctl, fn, args, kwargs, ranks, True)
        ctl.flush()
        # decoded as local tensors even inside the active mesh (``Fetched``)
        return [_controller.Fetched(ctl.ranks[r].result.call_one(key, stream)) for r in ranks]


def call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``remote(fn).call(...)``: a future of the ``ValueMesh`` of every proc's result."""
    ctl = _active(f"remote({getattr(fn, '__name__', fn)}).call()")
    futures = _results(ctl, fn, args, kwargs, list(range(len(ctl.ranks))))
    extent = Extent(list(ctl.labels), list(ctl.sizes.values()))

    async def gather() -> Any:
        return ValueMesh(extent, [await f for f in futures])

    return _controller.Fetched(Future(coro=gather()))


def call_one(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``remote(fn).call_one(...)``: the result of the active mesh's only proc."""
    ctl = _active(f"remote({getattr(fn, '__name__', fn)}).call_one()")
    if len(ctl.ranks) != 1:
        raise ValueError(f"remote({getattr(fn, '__name__', fn)}).call_one() needs an active mesh of exactly one proc, "
                         f"but {ctl.where()} has {len(ctl.ranks)}: activate a slice of it, or use call()/choose()")
    return _results(ctl, fn, args, kwargs, [0])[0]


def choose(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """``remote(fn).choose(...)``: the result of one proc of the active mesh, chosen at random."""
    ctl = _active(f"remote({getattr(fn, '__name__', fn)}).choose()")
    return _results(ctl, fn, args, kwargs, [random.randrange(len(ctl.ranks))])[0]


def stream(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Iterator[Any]:
    """``remote(fn).stream(...)``: a future per proc's result, in rank order."""
    ctl = _active(f"remote({getattr(fn, '__name__', fn)}).stream()")
    return iter(_results(ctl, fn, args, kwargs, list(range(len(ctl.ranks)))))


def broadcast(fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """``remote(fn).broadcast(...)``: run it on every proc, keeping nothing
    (a failure is logged on its proc)."""
    ctl = _active(f"remote({getattr(fn, '__name__', fn)}).broadcast()")
    _run(ctl, fn, args, kwargs, None, False)


def send(fn: Callable[..., Any], args: tuple, kwargs: dict, port: Any, selection: str) -> None:
    """``monarch.actor.send(remote(fn), args, kwargs, port=port, selection=...)``:
    each chosen proc sends its result to ``port`` (``selection`` ``"all"`` or
    ``"choose"``); with no port it is :func:`broadcast` (``"all"``)."""
    name = getattr(fn, "__name__", fn)
    ctl = _active(f"send(remote({name}), ...)")
    if selection == "all":
        ranks = list(range(len(ctl.ranks)))
    elif selection == "choose":
        ranks = [random.randrange(len(ctl.ranks))]
    else:
        raise ValueError(f"send(remote({name}), selection={selection!r}): selection must be 'all' or 'choose'")
    if port is None:
        with ctl.lock:
            _run(ctl, fn, args, kwargs, ranks, False)
        return
    ctl.check_alive(ranks, f"send(remote({name}), ...)")
    with ctl.lock:
        key, stream_key = _run(ctl, fn, args, kwargs, ranks, True)
        ctl.flush()
        for r in ranks:
            ctl.ranks[r].send_result.broadcast(key, stream_key, port)
