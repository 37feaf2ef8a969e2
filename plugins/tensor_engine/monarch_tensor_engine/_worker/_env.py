"""What the worker's modules share: :class:`Poison` (what a failed operation
leaves where its results would be), the stream whose command this thread
runs (:func:`stream_key`), and this proc's workers by mesh name, for
:func:`local_tensor` (a distributed tensor passed to an actor's endpoint)."""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from monarch_core.runtime import format_duration
from monarch_tensor_engine._protocol import WAIT_S, TensorOpError

__all__ = ["Poison", "local_tensor", "register", "set_stream_key", "stream_key"]


class Poison:
    """What a failed operation leaves where its results would be."""

    __slots__ = ("error",)

    def __init__(self, error: TensorOpError) -> None:
        self.error = error


_tls = threading.local()


def stream_key() -> str:
    """The stream whose command this thread runs now (``main`` in the actor itself)."""
    return getattr(_tls, "stream", "main")


def set_stream_key(key: str) -> None:
    """This thread runs the commands of stream ``key`` (a stream's thread, at its start)."""
    _tls.stream = key


class _HoldsTensors(Protocol):
    """A worker, as :func:`local_tensor` reads it: this proc's tensors by id."""

    env: dict[int, Any]


#: worker mesh name -> this proc's worker of it (see :func:`local_tensor`)
_local: dict[str, _HoldsTensors] = {}


def register(name: str, worker: _HoldsTensors) -> None:
    """``worker`` is this proc's worker of the worker mesh ``name`` (its constructor)."""
    _local[name] = worker


def local_tensor(workers: str, ident: int, mesh_name: str) -> Any:
    """What a distributed tensor passed to an actor's endpoint becomes in
    that actor (unpickled in its proc): this proc's tensor ``ident`` of the
    engine's worker mesh ``workers``, once the worker has made it (the
    reference's rule: each actor receives the shard on its own proc).  Raises
    the tensor's error if it is poisoned, ``RuntimeError`` on a proc that is
    not one of the tensor's mesh's, ``TimeoutError`` after :data:`WAIT_S`."""
    w = _local.get(workers)
    if w is None:
        raise RuntimeError(f"a distributed tensor of mesh {mesh_name!r} was sent to an actor on a proc that is not one "
                           f"of that mesh's procs: send it to actors spawned on its mesh, or fetch its value first "
                           f"(fetch_shard(t, **coords).get())")
    deadline = time.monotonic() + WAIT_S
    delay = 0.0005
    while True:
        value = w.env.get(ident)
        if value is not None:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"tensor {ident} of mesh {mesh_name!r} was not made on this proc within "
                               f"{format_duration(WAIT_S)}")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    if isinstance(value, Poison):
        raise value.error
    return value
