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
  (``_worker._collectives.run_reduce``); a death elsewhere in the mesh does not
  concern the group.
* Commands are the typed records of ``_protocol``; :attr:`Worker.HANDLERS`
  maps each command type to the method that runs it.
* Streams: ``SetStream(key)`` switches the stream the following commands
  belong to.  The ``main`` stream's commands run in ``run`` itself; every
  other stream's run in order on a thread of its own, so that streams
  overlap.  A borrow is two pairs of commands: ``Lend`` (on the lender's
  stream) / ``Take`` (on the borrower's: it waits for the ``Lend``), and at
  the drop ``GiveBack`` (borrower) / ``WaitBack`` (lender: it waits for
  the ``GiveBack``).  Each waits only for a command issued before it, so
  the streams cannot deadlock.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import traceback
from typing import Any, Callable, NamedTuple

import torch
from torch.utils._pytree import tree_flatten, tree_map

from monarch_core.actor import Actor, context, current_rank, endpoint
from monarch_core.runtime import format_duration
from monarch_tensor_engine import _protocol as P
from monarch_tensor_engine._protocol import WAIT_S, Meta, ProcessGroupRef, Ref, TensorOpError
from monarch_tensor_engine._worker import _collectives, _env, _grads, _transfer
from monarch_tensor_engine._worker._env import Poison
from monarch_tensor_engine._worker._store import MeshStore

__all__ = ["Worker"]

logger = logging.getLogger("monarch.tensor")

def _getter(name: str) -> Any:
    return lambda t: getattr(t, name)


def _setter(name: str) -> Any:
    def set_(t: Any, value: Any) -> None:
        setattr(t, name, value)

    return set_


class Worker(Actor):
    """Holds this proc's tensors of one mesh and runs its commands (see the module docstring)."""

    #: command type -> the method that runs it (filled below the class, once its methods exist)
    HANDLERS: dict[type, Callable[["Worker", Any], None]] = {}

    def __init__(self) -> None:
        point = current_rank()
        self.where = dict(point.items())
        self.mesh_rank = point.rank
        self.env: dict[int, Any] = {}
        self.lost = ""  # why commands were lost here (a batch that could not be unpickled), if they were
        self.groups: dict[tuple, _collectives.Group] = {}  # (dims, view, backend, stream) -> its group, made at first use
        self.pairs: dict[tuple, Any] = {}  # (pair, source rank, destination rank, stream) -> a transfer's gloo group
        self.store = MeshStore()  # the mesh's store, as this proc holds it
        self.queue: queue.SimpleQueue | None = None  # the current stream's, None for main
        self.streams: dict[str, queue.SimpleQueue] = {}
        self.slots: dict[int, _Slot] = {}  # borrow id -> its hand-over
        self.kept: dict[int, Any] = {}  # results not described yet (propagate 'cached'/'inspect')
        self.generators: dict[int, _grads.Backward] = {}  # grad_generator id -> its backward
        _env.register(context().actor_instance.name, self)  # for local_tensor: actors of this proc receive its tensors

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
        for item in batch:
            try:
                cmd = P.decode(item)
            except (IndexError, TypeError) as e:  # noqa: BLE001 - a broadcast endpoint must never raise
                logger.error("tensor engine: a command of an unknown kind on %s (a client of another version?): %s",
                             self.where, e)
                continue
            q = self.queue
            if q is None or type(cmd) is P.SetStream:
                self._exec(cmd)
            else:
                q.put(cmd)

    def _exec(self, cmd: Any) -> None:
        handler = self.HANDLERS.get(type(cmd))
        if handler is None:
            logger.error("tensor engine: unknown command %s on %s (a client of another version?)",
                         type(cmd).__name__, self.where)
            return
        try:
            handler(self, cmd)
        except BaseException:  # noqa: BLE001 - a broadcast endpoint must never raise
            logger.exception("tensor engine: command %s failed on %s", type(cmd).__name__, self.where)

    def _stream_loop(self, key: str, q: queue.SimpleQueue) -> None:
        _env.set_stream_key(key)
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
            q.put(_Mark(done))
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
        """In the mesh's first proc: start the mesh's store (once); its address."""
        return self.store.start()

    def __cleanup__(self, exc: Any = None) -> None:
        for q in self.streams.values():
            q.put(None)

    # ---------------------------------------------------------------- streams
    def _c_stream(self, cmd: P.SetStream) -> None:
        key = cmd.key
        if key == "main":
            self.queue = None
            return
        q = self.streams.get(key)
        if q is None:
            q = self.streams[key] = queue.SimpleQueue()
            threading.Thread(target=self._stream_loop, args=(key, q), daemon=True,
                             name=f"monarch-stream-{key}").start()
        self.queue = q

    def _c_mark(self, cmd: "_Mark") -> None:
        cmd.event.set()

    def _slot(self, bid: int) -> "_Slot":
        return self.slots.setdefault(bid, _Slot())

    def _c_lend(self, cmd: P.Lend) -> None:
        bid, src = cmd
        slot = self._slot(bid)
        v = self.env.get(src)
        slot.value = v if v is not None else Poison(TensorOpError(
            f"tensor {src} does not exist on the proc at {self.where}", "borrow", self.where))
        slot.lent.set()

    def _c_take(self, cmd: P.Take) -> None:
        bid, dst = cmd
        slot = self._slot(bid)
        if not slot.lent.wait(WAIT_S):
            self.env[dst] = Poison(TensorOpError(f"borrow: the lending stream did not reach the borrow within "
                                                 f"{format_duration(WAIT_S)} on the proc at {self.where}",
                                                 "borrow", self.where))
            return
        v = slot.value
        self.env[dst] = v.detach() if isinstance(v, torch.Tensor) else v

    def _c_give_back(self, cmd: P.GiveBack) -> None:
        bid, dst = cmd
        self.env.pop(dst, None)
        self._slot(bid).back.set()

    def _c_wait_back(self, cmd: P.WaitBack) -> None:
        bid = cmd.bid
        slot = self._slot(bid)
        if not slot.back.wait(WAIT_S):
            logger.error("tensor engine: borrow %d was not given back within %.0f s on %s", bid, WAIT_S, self.where)
        self.slots.pop(bid, None)

    # ---------------------------------------------------------------- gradients
    def _c_grads(self, cmd: P.StartGrads) -> None:
        self.generators[cmd.gen] = _grads.Backward(self, cmd.roots, cmd.params, cmd.grad_roots)

    def _c_grad(self, cmd: P.TakeGrad) -> None:
        self.env[cmd.out] = self.generators[cmd.gen].take(cmd.nth)

    def _c_grads_end(self, cmd: P.EndGrads) -> None:
        b = self.generators.pop(cmd.gen, None)
        if b is not None:
            b.finish()

    # ---------------------------------------------------------------- commands
    def _c_op(self, cmd: P.Op) -> None:
        fref, args, kwargs, out_ids, grad, name = cmd
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

    def _c_keep(self, cmd: P.Keep) -> None:
        """Run an operation whose results the client does not know yet: keep
        them whole until ``bind`` (the client asks one proc to ``describe``)."""
        self.kept[cmd.key] = self._call(cmd.fn, cmd.args, cmd.kwargs, cmd.grad, cmd.name)

    def _c_value(self, cmd: P.Value) -> None:
        """A remote function run for its value (``_values``): on the procs of
        ``ranks`` (None: every proc), its result (or ``Poison``) kept under
        ``key`` for :meth:`result`; with no key, a failure is logged."""
        fref, args, kwargs, key, grad, name, ranks = cmd
        if ranks is not None and self.mesh_rank not in ranks:
            return
        out = self._call(fref, args, kwargs, grad, name)
        if key is not None:
            self.kept[key] = out
        elif isinstance(out, Poison):
            logger.error("tensor engine: remote function %s failed (its result was not asked for): %s",
                         name, out.error)

    def _c_bind(self, cmd: P.Bind) -> None:
        """Bind the results kept under ``key`` to ``out_ids``, checked against
        the first proc's ``metas``: a distributed tensor has one shape."""
        key, out_ids, metas = cmd
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

    def _c_drop(self, cmd: P.Drop) -> None:
        for i in cmd.ids:
            self.env.pop(i, None)

    def _c_rank(self, cmd: P.RankTensor) -> None:
        self.env[cmd.out] = torch.tensor(P.coordinates(self.mesh_rank, *cmd.view)[cmd.dim])

    def _c_store(self, cmd: P.ConnectStore) -> None:
        self.store.connect(cmd.addr, cmd.port)

    def _c_send(self, cmd: P.Send) -> None:
        _transfer.run_send(self, cmd)

    def _c_recv(self, cmd: P.Recv) -> None:
        _transfer.run_recv(self, cmd)

    def _c_reduce(self, cmd: P.Reduce) -> None:
        _collectives.run_reduce(self, cmd)

    # ---------------------------------------------------------------- helpers
    def _value(self, x: Any) -> Any:
        if isinstance(x, Ref):
            return self.env[x.id]
        if type(x) is ProcessGroupRef:  # mesh.process_group(dims), passed to a remote function
            return _collectives.resolve_group(self, x)
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


class _Mark(NamedTuple):
    """A stream's queue reached this point (``_reach``; never sent: put on the queue here)."""
    event: threading.Event


#: command type -> the worker's method that runs it: the dispatch table of ``_exec``
Worker.HANDLERS = {
    P.SetStream: Worker._c_stream, _Mark: Worker._c_mark, P.Op: Worker._c_op, P.Keep: Worker._c_keep,
    P.Value: Worker._c_value, P.Bind: Worker._c_bind, P.Drop: Worker._c_drop, P.Lend: Worker._c_lend,
    P.Take: Worker._c_take, P.GiveBack: Worker._c_give_back, P.WaitBack: Worker._c_wait_back,
    P.StartGrads: Worker._c_grads, P.TakeGrad: Worker._c_grad, P.EndGrads: Worker._c_grads_end,
    P.RankTensor: Worker._c_rank, P.ConnectStore: Worker._c_store, P.Send: Worker._c_send, P.Recv: Worker._c_recv,
    P.Reduce: Worker._c_reduce,
}
