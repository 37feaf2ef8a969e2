"""The procs' side of the engine: one ``Worker`` actor per proc holds that
proc's tensors (``id -> torch.Tensor``) and runs the client's commands in
the order they were issued.

Contract:

* ``run(batch)`` runs every command of the batch and never raises (it is
  sent with ``broadcast``): an operation that fails stores a
  :class:`Poison` under each of its result ids, carrying a
  :class:`TensorOpError` (the op, this proc's coordinates, the traceback);
  an operation whose input is poisoned poisons its results with the same
  error, without running.  Later, unrelated operations run as usual.
* ``fetch(id)`` returns a copy of the tensor, or raises its error.
* Collectives (``reduce``) run in every member of the group in the same
  order, because every member receives the same commands in the same order.
  Their outcome is the same on every member: a member whose input is
  poisoned still takes part (with zeros, so that the others never wait for
  it) and keeps its error, and every other member's result is poisoned too,
  with an error that names that member and its failed op (never a partial
  result).  A group with a dead member poisons every living member's result
  at once, whether the client knew of the death when it sent the command or
  learns of it while the group forms or the collective runs
  (``_collectives.run_reduce``); a death elsewhere in the mesh does not
  concern the group.
* Streams: ``("stream", key)`` switches the stream the following commands
  belong to.  The ``main`` stream's commands run in ``run`` itself; every
  other stream's run in order on a thread of its own, so that streams
  overlap.  A borrow is two pairs of commands: ``lend`` (on the lender's
  stream) / ``take`` (on the borrower's: it waits for the ``lend``), and at
  the drop ``give_back`` (borrower) / ``wait_back`` (lender: it waits for
  the ``give_back``).  Each waits only for a command issued before it, so
  the streams cannot deadlock.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import traceback
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from monarch_core.actor import Actor, current_rank, endpoint
from monarch_core.runtime import format_duration
from monarch_tensor_engine._process_group import ProcessGroupRef
from monarch_tensor_engine._tensor import Ref

logger = logging.getLogger("monarch.tensor")

#: how long a stream waits for another (a borrow), or a fetch for its stream, at most
WAIT_S = 300.0

_tls = threading.local()


def stream_key() -> str:
    """The stream whose command this thread runs now (``main`` in the actor itself)."""
    return getattr(_tls, "stream", "main")


class TensorOpError(RuntimeError):
    """An operation on a distributed tensor failed on a proc: ``op``, the
    proc's ``coords``, and the remote traceback in the message."""

    def __init__(self, message: str, op: str = "", coords: dict | None = None) -> None:
        super().__init__(message)
        self.op, self.coords = op, dict(coords or {})

    def __reduce__(self) -> Any:
        return (TensorOpError, (str(self), self.op, self.coords))


class Poison:
    """What a failed operation leaves where its results would be."""

    __slots__ = ("error",)

    def __init__(self, error: TensorOpError) -> None:
        self.error = error


def _getter(name: str) -> Any:
    return lambda t: getattr(t, name)


def _setter(name: str) -> Any:
    def set_(t: Any, value: Any) -> None:
        setattr(t, name, value)

    return set_


#: worker mesh name -> this proc's worker of it (see :func:`local_tensor`)
_local: dict[str, "Worker"] = {}


def local_tensor(workers: str, ident: int, mesh_name: str) -> Any:
    """What a distributed tensor passed to an actor's endpoint becomes in
    that actor (unpickled in its proc): this proc's tensor ``ident`` of the
    engine's worker mesh ``workers``, once the worker has made it (the
    reference's rule: each actor receives the shard on its own proc).  Raises
    the tensor's error if it is poisoned, ``RuntimeError`` on a proc that is
    not one of the tensor's mesh's, ``TimeoutError`` after :data:`WAIT_S`."""
    import time

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


class Worker(Actor):
    """Holds this proc's tensors of one mesh and runs its commands (see the module docstring)."""

    def __init__(self) -> None:
        point = current_rank()
        self.where = dict(point.items())
        self.mesh_rank = point.rank
        self.env: dict[int, Any] = {}
        self.lost = ""  # why commands were lost here (a batch that could not be unpickled), if they were
        self.groups: Any = None  # (dims, view, backend, stream) -> _collectives.Group, made at first use
        self.queue: queue.SimpleQueue | None = None  # the current stream's, None for main
        self.streams: dict[str, queue.SimpleQueue] = {}
        self.slots: dict[int, _Slot] = {}  # borrow id -> its hand-over
        self.kept: dict[int, Any] = {}  # results not described yet (propagate 'cached'/'inspect')
        self.generators: dict[int, Any] = {}  # grad_generator id -> _grads.Backward
        from monarch_core.actor import context

        _local[context().actor_instance.name] = self  # for local_tensor: actors of this proc receive its tensors

    # ---------------------------------------------------------------- endpoints
    @endpoint
    def run(self, data: bytes) -> None:
        """Run a batch of commands (pickled once by the client for every proc)."""
        try:
            batch = pickle.loads(data)
        except Exception as e:  # noqa: BLE001 - a broadcast endpoint must never raise
            logger.exception("tensor engine: a batch of commands could not be read on %s", self.where)
            self.lost = f"a batch of commands could not be read on the proc at {self.where}: {type(e).__name__}: {e}"
            return
        for cmd in batch:
            q = self.queue
            if q is None or cmd[0] == "stream":
                self._exec(cmd)
            else:
                q.put(cmd)

    def _exec(self, cmd: tuple) -> None:
        try:
            getattr(self, "_c_" + cmd[0])(*cmd[1:])
        except BaseException:  # noqa: BLE001 - a broadcast endpoint must never raise
            logger.exception("tensor engine: command %r failed on %s", cmd[0], self.where)

    def _stream_loop(self, key: str, q: queue.SimpleQueue) -> None:
        _tls.stream = key
        while True:
            cmd = q.get()
            if cmd is None:
                return
            self._exec(cmd)

    def _reach(self, stream: str) -> None:
        """Wait until ``stream`` has run every command sent before now (``main``: it has)."""
        q = self.streams.get(stream)
        if q is not None:
            done = threading.Event()
            q.put(("mark", done))
            if not done.wait(WAIT_S):
                raise TimeoutError(f"stream {stream.split('#')[0]!r} on the proc at {self.where} did not get here "
                                   f"within {format_duration(WAIT_S)} (it waits for another stream or a collective)")

    @endpoint
    def describe(self, key: int, stream: str = "main") -> Any:
        """The results kept under ``key``, each tensor as its :class:`Meta`."""
        self._reach(stream)
        out = self.kept.get(key)
        if isinstance(out, Poison):
            raise out.error
        return tree_map(lambda x: Meta.of(x) if isinstance(x, torch.Tensor) else x, out)

    @endpoint
    def fetch(self, ident: int, stream: str = "main") -> Any:
        self._reach(stream)
        v = self.env.get(ident)
        if isinstance(v, Poison):
            raise v.error
        if v is None:
            raise KeyError(f"tensor {ident} does not exist on the proc at {self.where} "
                           f"({self.lost or 'it was freed'})")
        return v.detach().clone() if isinstance(v, torch.Tensor) else v

    @endpoint
    def result(self, key: int, stream: str = "main") -> Any:
        """The result a remote function's adverb (``remote(fn).call()``, see
        ``_values``) kept under ``key`` on this proc, tensors detached;
        raises its error.  Each key is read once."""
        self._reach(stream)
        out = self.kept.pop(key, None)
        if isinstance(out, Poison):
            raise out.error
        return tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, out)

    @endpoint
    def send_result(self, key: int, stream: str, port: Any) -> None:
        """Send :meth:`result` to ``port`` (``send(remote(fn), ..., port=port)``),
        or its error as the port's exception; never raises (a broadcast)."""
        try:
            value = self.result(key, stream)
        except Exception as e:  # noqa: BLE001 - the caller's port receives it
            port.exception(e)
            return
        port.send(value)

    @endpoint
    def start_store(self) -> tuple[str, int]:
        from monarch_tensor_engine import _collectives

        return _collectives.start_store(self)

    def __cleanup__(self, exc: Any = None) -> None:
        for q in self.streams.values():
            q.put(None)

    # ---------------------------------------------------------------- streams
    def _c_stream(self, key: str) -> None:
        if key == "main":
            self.queue = None
            return
        q = self.streams.get(key)
        if q is None:
            q = self.streams[key] = queue.SimpleQueue()
            threading.Thread(target=self._stream_loop, args=(key, q), daemon=True,
                             name=f"monarch-stream-{key}").start()
        self.queue = q

    def _c_mark(self, event: threading.Event) -> None:
        event.set()

    def _slot(self, bid: int) -> "_Slot":
        return self.slots.setdefault(bid, _Slot())

    def _c_lend(self, bid: int, src: int) -> None:
        slot = self._slot(bid)
        v = self.env.get(src)
        slot.value = v if v is not None else Poison(TensorOpError(
            f"tensor {src} does not exist on the proc at {self.where}", "borrow", self.where))
        slot.lent.set()

    def _c_take(self, bid: int, dst: int) -> None:
        slot = self._slot(bid)
        if not slot.lent.wait(WAIT_S):
            self.env[dst] = Poison(TensorOpError(f"borrow: the lending stream did not reach the borrow within "
                                                 f"{format_duration(WAIT_S)} on the proc at {self.where}",
                                                 "borrow", self.where))
            return
        v = slot.value
        self.env[dst] = v.detach() if isinstance(v, torch.Tensor) else v

    def _c_give_back(self, bid: int, dst: int) -> None:
        self.env.pop(dst, None)
        self._slot(bid).back.set()

    def _c_wait_back(self, bid: int) -> None:
        slot = self._slot(bid)
        if not slot.back.wait(WAIT_S):
            logger.error("tensor engine: borrow %d was not given back within %.0f s on %s", bid, WAIT_S, self.where)
        self.slots.pop(bid, None)

    # ---------------------------------------------------------------- gradients
    def _c_grads(self, gen: int, roots: Any, params: Any, grad_roots: Any) -> None:
        from monarch_tensor_engine import _grads

        self.generators[gen] = _grads.Backward(self, roots, params, grad_roots)

    def _c_grad(self, gen: int, index: int, out: int) -> None:
        self.env[out] = self.generators[gen].take(index)

    def _c_grads_end(self, gen: int) -> None:
        b = self.generators.pop(gen, None)
        if b is not None:
            b.finish()

    # ---------------------------------------------------------------- commands
    def _c_op(self, fref: Any, args: Any, kwargs: Any, out_ids: list, grad: bool, name: str) -> None:
        out = self._call(fref, args, kwargs, grad, name)
        if isinstance(out, Poison):
            self._poison(out_ids, out.error)
            return
        leaves = tree_flatten(out)[0]
        for oid, leaf in zip(out_ids, leaves):
            if oid is not None:
                self.env[oid] = leaf

    def _call(self, fref: Any, args: Any, kwargs: Any, grad: bool, name: str) -> Any:
        """``fref(*args, **kwargs)`` over this proc's tensors, or a ``Poison``."""
        poison = self._poisoned((args, kwargs))
        if poison is not None:
            return poison
        func = fref
        if isinstance(fref, tuple):
            func = _getter(fref[1]) if fref[0] == "get" else _setter(fref[1])
        a, k = tree_map(self._value, (args, kwargs))
        try:
            with torch.set_grad_enabled(grad):
                return func(*a, **k)
        except Exception as e:  # noqa: BLE001 - contained: the results are poisoned
            tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])
            return Poison(TensorOpError(
                f"{name} failed on the proc at {self.where}: {type(e).__name__}: {e}\n{tb}", name, self.where))

    def _c_keep(self, fref: Any, args: Any, kwargs: Any, key: int, grad: bool, name: str) -> None:
        """Run an operation whose results the client does not know yet: keep
        them whole until ``bind`` (the client asks one proc to ``describe``)."""
        self.kept[key] = self._call(fref, args, kwargs, grad, name)

    def _c_value(self, fref: Any, args: Any, kwargs: Any, key: int | None, grad: bool, name: str,
                 ranks: list[int] | None) -> None:
        """A remote function run for its value (``_values``): on the procs of
        ``ranks`` (None: every proc), its result (or ``Poison``) kept under
        ``key`` for :meth:`result`; with no key, a failure is logged."""
        if ranks is not None and self.mesh_rank not in ranks:
            return
        out = self._call(fref, args, kwargs, grad, name)
        if key is not None:
            self.kept[key] = out
        elif isinstance(out, Poison):
            logger.error("tensor engine: remote function %s failed (its result was not asked for): %s",
                         name, out.error)

    def _c_bind(self, key: int, out_ids: list, metas: list) -> None:
        """Bind the results kept under ``key`` to ``out_ids``, checked against
        the first proc's ``metas``: a distributed tensor has one shape."""
        out = self.kept.pop(key, None)
        if isinstance(out, Poison):
            self._poison(out_ids, out.error)
            return
        leaves = [x for x in tree_flatten(out)[0] if isinstance(x, torch.Tensor)]
        if len(leaves) != len(out_ids):
            self._poison(out_ids, TensorOpError(
                f"the results on the proc at {self.where} hold {len(leaves)} tensor(s), the first proc's "
                f"{len(out_ids)}: a function run with propagate='cached'/'inspect' must return the same structure "
                f"on every proc", "propagate", self.where))
            return
        for oid, leaf, meta in zip(out_ids, leaves, metas):
            if (tuple(leaf.shape), leaf.dtype) != (tuple(meta.shape), meta.dtype):
                self.env[oid] = Poison(TensorOpError(
                    f"a result on the proc at {self.where} has shape {tuple(leaf.shape)} and dtype {leaf.dtype}, the "
                    f"client expected {tuple(meta.shape)} and {meta.dtype} (the first proc's result, when it was "
                    f"described): a distributed tensor has one shape on every proc; use propagate='inspect' if the "
                    f"shape depends on values",
                    "propagate", self.where))
            else:
                self.env[oid] = leaf

    def _c_drop(self, ids: list[int]) -> None:
        for i in ids:
            self.env.pop(i, None)

    def _c_rank(self, dim: str, view: tuple, oid: int) -> None:
        from monarch_tensor_engine._collectives import coordinates

        self.env[oid] = torch.tensor(coordinates(self.mesh_rank, *view)[dim])

    def _c_store(self, addr: str, port: int) -> None:
        from monarch_tensor_engine import _collectives

        _collectives.connect_store(self, addr, port)

    def _c_send(self, *spec: Any) -> None:
        from monarch_tensor_engine import _transfer

        _transfer.run_send(self, *spec)

    def _c_recv(self, *spec: Any) -> None:
        from monarch_tensor_engine import _transfer

        _transfer.run_recv(self, *spec)

    def _c_reduce(self, *spec: Any) -> None:
        from monarch_tensor_engine import _collectives

        _collectives.run_reduce(self, *spec)

    # ---------------------------------------------------------------- helpers
    def _value(self, x: Any) -> Any:
        if isinstance(x, Ref):
            return self.env[x.id]
        if type(x) is ProcessGroupRef:  # mesh.process_group(dims), passed to a remote function
            return x.resolve(self)
        return x

    def _poisoned(self, tree: Any) -> Poison | None:
        for x in tree_flatten(tree)[0]:
            if isinstance(x, Ref):
                v = self.env.get(x.id)
                if isinstance(v, Poison):
                    return v
                if v is None:
                    return Poison(TensorOpError(f"tensor {x.id} does not exist on the proc at {self.where}"
                                                f"{' (' + self.lost + ')' if self.lost else ''}", "", self.where))
        return None

    def _poison(self, out_ids: list, error: TensorOpError) -> None:
        for oid in out_ids:
            if oid is not None:
                self.env[oid] = Poison(error)


class _Slot:
    """One borrow's hand-over between two streams of a proc."""

    __slots__ = ("value", "lent", "back")

    def __init__(self) -> None:
        self.value: Any = None
        self.lent = threading.Event()
        self.back = threading.Event()


class Meta:
    """A tensor's metadata, as ``describe`` returns it."""

    __slots__ = ("shape", "stride", "dtype", "device", "requires_grad")

    def __init__(self, shape: tuple, stride: tuple, dtype: torch.dtype, device: str, requires_grad: bool) -> None:
        self.shape, self.stride, self.dtype, self.device, self.requires_grad = shape, stride, dtype, device, \
            requires_grad

    @classmethod
    def of(cls, t: torch.Tensor) -> "Meta":
        return cls(tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device), bool(t.requires_grad))

    def key(self) -> tuple:
        """As ``_tensor.meta_key`` has it: ``(shape, strides, dtype, device, requires_grad)``."""
        return (self.shape, self.stride, self.dtype, self.device, self.requires_grad)

    def __reduce__(self) -> Any:
        return (Meta, (self.shape, self.stride, self.dtype, self.device, self.requires_grad))
