"""The client's side of the engine: one ``Controller`` per proc mesh, and the
torch function mode that turns operations into commands while it is active.

Contract:

* ``activate(mesh)`` spawns the mesh's workers once (an actor per proc), and
  returns a context manager that pushes the mode; ``no_mesh()`` pops it for
  a block; ``get_active_mesh()`` is the mesh whose mode is on top (or None).
* Every torch function called inside the mode is first run on the fake
  tensors of its arguments: its errors (a shape mismatch, a wrong dtype)
  are raised at once, in the client, and its results give the new handles'
  metadata.  Operations that produce or change tensors become a command
  (``_protocol.Op``: the function, the arguments with ``Ref`` s, the result ids,
  the grad mode); queries
  that only read metadata (``t.shape``, ``t.dim()``) are answered locally.
* Commands are sent in batches, in order, to every proc: one cast of the
  batch to the workers' mesh (``ActorMesh.run.broadcast``: a message per proc
  on a small mesh, the cast tree's fanout messages on a large one; a later
  fetch from one proc travels that proc's route too, so it comes after them;
  once a proc is gone, one message per live proc); the
  batch is pickled once for all of them, as actor messages are pickled
  (``runtime.dumps``: a function of ``__main__`` keeps its file name, for the
  procs' tracebacks)):
  when :data:`BATCH` are pending, when the tensors freed since the last
  batch add up to :data:`FREE_BYTES`, when a value is fetched, when the
  mesh's block ends, and at :func:`flush`.  The client never waits for the procs
  to run them.
* An operation on local tensors only (a fetched value) runs locally, as
  usual.  Reading a value (``t.item()``, ``bool(t)``, ``t.tolist()``) of a
  distributed tensor, or mixing a local tensor, or a tensor of another mesh,
  into an operation on distributed tensors is an error that says what to do.
* An in-place operation that changes a tensor's metadata (``unsqueeze_``,
  ``t_``, ``resize_``, a resizing ``out=``) changes its handle's (``_sync``)
  as the procs change their tensors.  The op cache (``cached``) is bounded
  (``MONARCH_TENSOR_OP_CACHE_SIZE``, least recently used out).
* When every proc of a mesh is gone (it was stopped), its controller leaves
  the registry and lets go of its caches and workers (``release_state``);
  one proc-failure listener serves every controller, so none is kept alive.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import weakref
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensor,
                                           FakeTensorMode)
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from monarch_core import runtime
from monarch_core.errors import SupervisionError
from monarch_tensor_engine import _protocol as P
from monarch_tensor_engine import _settings
from monarch_tensor_engine._client import _active, _collectives, _globals, _known, _streams, _transfer
from monarch_tensor_engine._client._active import active
from monarch_tensor_engine._client._cache import Cache
from monarch_tensor_engine._client._ops import VALUE_READS as _VALUE_READS
from monarch_tensor_engine._client._ops import flatten as _flatten
from monarch_tensor_engine._client._ops import func_ref, is_mutating, op_name
from monarch_tensor_engine._client._ops import unflatten as _unflatten
from monarch_tensor_engine._client._store import StoreLink
from monarch_tensor_engine._client._tensor import Tensor
from monarch_tensor_engine._protocol import MeshMismatch, Meta, Ref, meta_key
from monarch_tensor_engine._worker._actor import Worker

__all__ = ["Active", "Controller", "Fetched", "NoMesh", "active", "controller"]

logger = logging.getLogger("monarch.tensor")


class _QuietFakeFailures(logging.Filter):
    """Drops torch's ERROR record of a meta kernel that raised (``failed
    while attempting to run meta for ...``, with a 20-line traceback) when
    the engine ran it on its fakes: the caller gets that exception itself,
    once (a shape mismatch raised in the client).  Others' fake runs keep
    the record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("failed while attempting to run meta"):
            return True
        f: Any = sys._getframe(1)
        while f is not None:
            if f.f_globals.get("__name__", "").startswith("monarch_tensor_engine."):
                return False
            f = f.f_back
        return True


logging.getLogger("torch._subclasses.fake_tensor").addFilter(_QuietFakeFailures())

#: commands sent in one message per proc, at most
BATCH = 256
#: bytes of freed tensors that send the pending batch at once (with their drops)
FREE_BYTES = 32 << 20
#: seconds the first proc may take to run and describe a function (propagate 'cached'/'inspect')
DESCRIBE_TIMEOUT_S = 300

#: functions run for real in the client (global state, not tensors)
_LOCAL = {f for f in (getattr(torch._C, "_set_grad_enabled", None), torch.is_grad_enabled,
                      getattr(torch.ops.profiler, "_record_function_enter_new", None),
                      getattr(torch.ops.profiler, "_record_function_exit", None)) if f is not None}
#: names of functions run for real in the client (profiler markers the optimizers emit)
_LOCAL_NAMES = {"_record_function_enter_new", "_record_function_exit", "_set_grad_enabled", "_RecordFunction"}

def _ranks_text(mesh: Any) -> str:
    """``"ranks 1, 3"``: the ranks of ``mesh``'s procs in the mesh it was
    sliced from (its region's root ranks; a long run as ``"ranks 0-63"``)."""
    region = getattr(mesh, "_region", None)
    try:
        ranks = list(region.root_ranks()) if region is not None else list(range(len(mesh.proc_ids)))
    except Exception:  # noqa: BLE001 - a mesh-like object without a region: its own numbering
        ranks = list(range(len(mesh.proc_ids)))
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    shown = ", ".join(map(str, ranks[:8]))
    return f"rank{'s' if len(ranks) != 1 else ''} {shown}{', ...' if len(ranks) > 8 else ''}"


class Controller:
    """The client's state for one proc mesh (see the module docstring)."""

    #: the default dtype last sent to the procs (None: not yet); see ``_globals.sync``
    default_dtype: Any = None

    def __init__(self, mesh: Any) -> None:
        self.proc_ids = list(mesh.proc_ids)
        #: how errors tell this mesh from another part of the same mesh (``where``)
        self.ranks_text = _ranks_text(mesh)
        self.set_view(mesh)
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.ids = itertools.count(1)
        self.lock = threading.RLock()
        self.pending: list[P.Command] = []
        self.dropped: list[tuple[int, Any]] = []
        self.dropped_bytes = 0
        #: flat ranks whose proc died -> why (commands are no longer sent there)
        self.dead: dict[int, str] = {}
        _listen()
        #: the stream the last command sent belongs to (the procs keep it until told otherwise)
        self.wire_stream: Any = _streams.MAIN
        self.by_fake: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
        # a name of its own: views of overlapping procs (a mesh and its slices) each spawn their workers there
        self.workers = mesh.spawn(f"_tensor_workers_{next(_worker_meshes)}", Worker)
        #: each proc's worker, in the procs' order (the same in every view)
        self.ranks = [self.workers.slice(**c) for c in self.coords]
        #: the mesh's store (the groups' rendezvous), started when first needed
        self.store = StoreLink()
        size = _settings.get("MONARCH_TENSOR_OP_CACHE_SIZE")
        #: (function, inputs' metadata and scalars) -> (result's metadata, function ref, name): see ``cached``
        self.op_cache = Cache(size)
        #: what ``_propagate`` learned: (function, signature) -> description of its results
        self.propagations = Cache(size)
        #: set when every proc of the mesh is gone (``_proc_failed``): its state is released, and sends refused
        self.closed = False

    def set_view(self, mesh: Any) -> Any:
        """Name the procs as ``mesh`` does (a ``rename``/``split``/``flatten``
        of them: the same procs in the same order); returns the previous view."""
        previous = getattr(self, "mesh", None)
        self.mesh = mesh
        self.mesh_name = getattr(mesh, "name", "mesh")
        self.labels = list(mesh.extent.labels)
        self.sizes = dict(zip(self.labels, mesh.extent.sizes))
        self.coords = [dict(zip(self.labels, c)) for c in itertools.product(*(range(s) for s in self.sizes.values()))]
        return previous

    def view(self) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """The active view's (labels, sizes), as the procs' commands carry it."""
        return tuple(self.labels), tuple(self.sizes.values())

    # ---------------------------------------------------------------- handles
    def make_fake(self, shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A fake tensor of that shape (whatever mode is active)."""
        with torch._C.DisableTorchFunction(), self.fake_mode:
            return torch.empty(shape, dtype=dtype, device=device)

    def new_handle(self, fake: torch.Tensor, stream: Any = None) -> Tensor:
        h = Tensor(fake, next(self.ids), self, stream or _streams.get_active_stream())
        self.by_fake[id(fake)] = h
        return h

    def materialize(self, h: Tensor) -> torch.Tensor:
        """A fake for a handle that has only its metadata (a cached operation's result)."""
        fake = self.fake_of(h._key)
        self.by_fake[id(fake)] = h
        return fake

    def release(self, ident: int, stream: Any, nbytes: int = 0) -> None:
        """A handle was collected: free its tensor on the procs (next batch, on
        its stream; the next command sends the batch at once when the tensors
        freed add up to :data:`FREE_BYTES`, so that the procs reuse memory)."""
        self.dropped.append((ident, stream))  # list.append is atomic; read under the lock at flush
        self.dropped_bytes += nbytes  # approximate (finalizers of other threads): it only times a flush

    def handle_of(self, fake: torch.Tensor) -> Tensor | None:
        h = self.by_fake.get(id(fake))
        return h if h is not None and h._fake is fake else None

    # ---------------------------------------------------------------- commands
    def send(self, cmd: P.Command, stream: Any = None) -> None:
        """Queue ``cmd`` for every proc, on ``stream`` (default: the active one);
        raises once every proc of the mesh is gone (it was stopped)."""
        if self.closed:
            raise self.gone()
        with self.lock:
            self._on_stream(stream or _streams.get_active_stream())
            if type(cmd) is not P.Op and _known.any_live():  # a command that may write or alias a known value
                _known.taint(self, cmd)
            self.pending.append(cmd)
            if len(self.pending) >= BATCH or self.dropped_bytes >= FREE_BYTES:
                self.flush()

    def _on_stream(self, stream: Any) -> None:
        """The next pending command belongs to ``stream``: tell the procs if it is not the last one's (under the lock)."""
        if stream is not self.wire_stream:
            self.pending.append(P.SetStream(stream.key))
            self.wire_stream = stream

    def flush(self) -> None:
        """Send every pending command to every proc, in order (the caller's thread)."""
        with self.lock:
            if self.closed:
                return
            if self.dropped:
                drops, self.dropped[:] = list(self.dropped), []
                self.dropped_bytes = 0
                by_stream: dict[Any, list[int]] = {}
                for ident, stream in drops:
                    by_stream.setdefault(stream, []).append(ident)
                for stream, ids in by_stream.items():
                    self._on_stream(stream)
                    self.pending.append(P.Drop(ids))
            if not self.pending:
                return
            batch, self.pending = self.pending, []
            data = runtime.dumps(P.encode(batch))  # once, not once per proc; plain tuples pickle fast
            if not self.dead:
                try:  # one cast to the whole mesh (the cast tree's fanout messages from here on a large one)
                    self.workers.run.broadcast(data)
                    return
                except SupervisionError:  # a proc died: the cast is refused whole, nothing was sent
                    pass
            for i, r in enumerate(self.ranks):  # some proc is gone: the live ones, one message each
                if i in self.dead:
                    continue
                try:
                    r.run.broadcast(data)
                except SupervisionError as e:  # that proc died: the others go on without it
                    if self._rank_gone(i, str(e).splitlines()[-1], False):
                        logger.warning("tensor engine: rank %d of mesh %r is gone (%s); the other ranks go on",
                                       i, self.mesh_name, self.dead[i])

    def _proc_failed(self, proc_id: str, why: str, stopped: bool) -> None:
        """A proc failed or stopped (the kernel's thread: hand the work over).
        When every proc is gone, the controller releases its state
        (:meth:`release_state`) and leaves the registry: a stopped mesh keeps
        nothing alive in the client but what its leftover handles hold."""
        if proc_id not in self.proc_ids or self.closed:
            return
        rank = self.proc_ids.index(proc_id)
        if self._rank_gone(rank, why.splitlines()[-1] if why else "it stopped", stopped) and \
                len(self.dead) == len(self.proc_ids):
            self.release_state()

    def _rank_gone(self, rank: int, why: str, stopped: bool) -> bool:
        """Record that ``rank`` is gone, for ``why`` (any thread); a death
        (not a stop) of one of the ranks is also marked in the mesh's store,
        so that every group waiting for that rank fails at once.  Whichever
        learns of it first -- the kernel (:meth:`_proc_failed`) or a refused
        send (:meth:`flush`) -- marks it: the second one used to find the rank
        recorded and skip the store, and the groups waited out their timeout.
        False: it was known already."""
        if rank in self.dead:
            return False
        self.dead[rank] = why
        if not stopped and len(self.dead) < len(self.proc_ids):
            threading.Thread(target=self.store.mark_dead, args=(self, f"rank {rank}: {why}"),
                             daemon=True, name="monarch-tensor-dead").start()
        return True

    def check_alive(self, ranks: Any, what: str) -> None:
        """Raise if one of ``ranks`` (flat ranks; None: all) died."""
        dead = [i for i in self.dead if ranks is None or i in ranks]
        if dead:
            raise RuntimeError(f"{what}: rank(s) {dead} of mesh {self.mesh_name!r} died ({self.dead[dead[0]]}); "
                               f"work that needs them cannot run: start a new mesh for it")

    def fetch(self, t: Tensor, coords: dict[str, int]) -> "Fetched":
        """A Future of the value of ``t`` on the proc at ``coords``."""
        rank = self.rank_of(coords)
        _streams.check_use(t, False, "fetch_shard")
        if self.closed:
            raise self.gone()
        with self.lock:
            self.flush()
            return Fetched(self.ranks[rank].fetch.call_one(t._id, t._stream.key))

    def rank_of(self, coords: dict[str, Any]) -> int:
        unknown = sorted(set(coords) - set(self.labels))
        if unknown:
            raise ValueError(f"unknown mesh dimension(s) {unknown}; mesh {self.mesh_name!r} has {self.sizes}")
        rank = 0
        for label in self.labels:
            size = self.sizes[label]
            c = coords.get(label, 0)
            if isinstance(c, bool) or not isinstance(c, int):
                raise TypeError(f"coordinate {label}={c!r} must be an int")
            if not 0 <= c < size:
                raise IndexError(f"coordinate {label}={c} is out of range for mesh {self.mesh_name!r} {self.sizes}")
            rank = rank * size + c
        return rank

    # ---------------------------------------------------------------- borrows
    def borrow(self, t: Tensor, stream: Any, mutable: bool) -> tuple[Tensor, Any]:
        """``stream.borrow(t, mutable)`` (see ``_streams``)."""
        b = _streams.Borrow(self, t, stream, mutable)
        with torch._C.DisableTorchFunction(), self.fake_mode:
            fake = t._fake.detach()
        r = self.new_handle(fake, stream)
        r._guard = b
        b.borrowed_id = r._id
        if t._guard is None:
            t._guard = _streams.Lent()
        t._guard.borrows.append(b)
        with self.lock:
            self.send(P.Lend(b.id, t._id), t._stream)
            self.send(P.Take(b.id, r._id), stream)
        return r, b

    def end_borrow(self, b: Any) -> None:
        with self.lock:
            if b.dropped:
                return
            b.dropped = True
            self.send(P.GiveBack(b.id, b.borrowed_id), b.stream)
            self.send(P.WaitBack(b.id), b.lender_stream)
        lender = b.lender()
        if lender is not None and isinstance(lender._guard, _streams.Lent):
            lender._guard.borrows = [x for x in lender._guard.borrows if x is not b]
            if not lender._guard.borrows:
                lender._guard = None

    # ---------------------------------------------------------------- other meshes, collectives, transfers
    def controller_of(self, mesh: Any) -> "Controller":
        """The controller of ``mesh``'s procs (this one for a view of the same procs; see :func:`controller`)."""
        return controller(mesh)

    def activate(self, view: Any = None) -> "Active":
        """``with mesh.activate():`` of ``view`` (default: this controller's current view)."""
        return Active(view if view is not None else self.mesh)

    def reduce(self, t: Tensor, dims: Any, reduction: str, scatter: bool, mesh: Any, out: Tensor | None, *,
               inplace: bool) -> Tensor:
        """``t.reduce(...)``/``t.reduce_(...)`` (``_collectives.reduce``)."""
        return _collectives.reduce(t, dims, reduction, scatter, mesh, out, inplace=inplace)

    def to_mesh(self, t: Tensor, mesh: Any) -> Tensor:
        """``t.to_mesh(mesh)`` (``_transfer.to_mesh``)."""
        return _transfer.to_mesh(t, mesh)

    def close(self) -> None:
        with self.lock:
            self.flush()
            self.closed = True

    def release_state(self) -> None:
        """Every proc is gone: drop this controller from the registry and let
        go of what it holds for the procs (the caches, the pending commands,
        the workers' handles).  Lock-free (the kernel's thread calls it while
        the client's may hold the lock): each attribute is replaced whole.
        The fake mode and the mesh stay, for the leftover handles' metadata."""
        self.closed = True
        _forget(self)
        self.op_cache, self.propagations = Cache(0), Cache(0)
        self.pending, self.dropped, self.dropped_bytes = [], [], 0
        self.ranks = []
        self.workers = None

    def gone(self) -> RuntimeError:
        """The error of using this controller after its mesh stopped."""
        why = next(iter(self.dead.values()), "it stopped")
        return RuntimeError(f"mesh {self.mesh_name!r} {self.sizes} was stopped ({why}): its tensors are gone; "
                            f"spawn procs again (and activate the new mesh) for more work")

    # ---------------------------------------------------------------- dispatch
    def cached(self, func: Callable[..., Any], args: tuple) -> Any:
        """The fast path: an operation already seen with inputs of this
        metadata gets its result's metadata from :attr:`op_cache`, without
        running on the fakes (the result's fake is made if it is needed).
        Returns ``(result or MISS, the operation's key or None)``: the key
        (``_op_key``) fills the cache when the slow path finds the result."""
        key = _op_key(self, func, args)
        if key is None:
            return MISS, None
        hit = self.op_cache.get(key)
        if hit is None:
            return MISS, key
        out_key, fref, name = hit
        h = Tensor(None, next(self.ids), self, _streams.get_active_stream(), out_key)
        if name in _known.COMPUTED:  # a factory or pure operation: its value may be known (optimizers' steps)
            _known.on_hit(self, func, args, h)
        self.send(P.Op(fref, tuple(Ref(x._id) if type(x) is Tensor else x for x in args), {}, [h._id],
                       torch.is_grad_enabled(), name))
        return h, key

    def dispatch(self, func: Callable[..., Any], args: tuple, kwargs: dict, *, fake_func: Any = None,
                 always: bool = False) -> Any:
        if torch.get_default_dtype() is not self.default_dtype or torch._C._is_any_autocast_enabled():
            _globals.sync(self)  # the procs follow the client's default dtype; autocast is refused
        op_key = None
        if not kwargs and fake_func is None:
            got, op_key = self.cached(func, args)
            if got is not MISS:
                return got
        name = getattr(func, "__name__", "")
        if func in _LOCAL or name in _LOCAL_NAMES or name.startswith("_record_function_exit"):
            return func(*args, **kwargs)
        flat, spec = _flatten(args, kwargs)
        local = [x for x in flat if isinstance(x, torch.Tensor) and not isinstance(x, Tensor)]
        if local and (len(local) == len([x for x in flat if isinstance(x, torch.Tensor)])
                      or any(isinstance(x, FakeTensor) for x in local)):
            # only local tensors (a fetched value), or the engine's own work on fakes: torch as usual
            with torch._C.DisableTorchFunction():
                return func(*args, **kwargs)
        if name in _VALUE_READS:
            got = _known.read(func, flat, spec)  # a value the client knows (an optimizer's step count)
            if got is not _known.UNKNOWN:
                return got
            raise RuntimeError(
                f"{op_name(func)}() reads a value, and the values of a distributed tensor live on the procs of mesh "
                f"{self.mesh_name!r}: fetch one with monarch_core.inspect(t, **coords) (or fetch_shard(t).get())")
        foreign: list[Tensor] = []
        handles, fakes = self._inputs(func, flat, foreign)
        mutating = bool(handles) and is_mutating(func)
        if foreign and (mutating or always):
            raise self.mismatch(func, foreign[0])
        if mutating:  # checked before the fakes change
            self.check_streams(func, handles, kwargs, handles[0])
        fargs, fkwargs = _unflatten(fakes, spec)
        if fake_func is not None:  # called from the user's code, the mode active: keep it out of the fakes
            with torch._C.DisableTorchFunction(), self.fake_mode:
                out = fake_func(*fargs, **fkwargs)
        else:
            try:
                with self.fake_mode:
                    out = func(*fargs, **fkwargs)
            except Exception as e:
                if foreign:  # fakes of two meshes do not mix: the mesh is the error to report
                    raise self.mismatch(func, foreign[0]) from e
                if isinstance(e, (DataDependentOutputException, DynamicOutputShapeException)):
                    raise _data_dependent(func, flat, self.mesh_name) from None
                raise
        if isinstance(out, torch.Tensor):
            out_flat, out_spec = [out], None
        else:
            out_flat, out_spec = tree_flatten(out)
        has_tensor = out_spec is None or any(isinstance(o, torch.Tensor) for o in out_flat)
        if not always and not has_tensor and not mutating:
            return out  # a metadata query, or a function of no tensor at all
        if foreign:
            raise self.mismatch(func, foreign[0])
        if not mutating:
            self.check_streams(func, handles, kwargs, None)
        results = []
        out_ids: list[int | None] = []
        for o in out_flat:
            if isinstance(o, torch.Tensor):
                h = None if always else self.handle_of(o)  # a remote function's results are new tensors
                if always and any(o is f for f in fakes):
                    o = self.make_fake(tuple(o.shape), o.dtype, o.device)
                if h is None:
                    h = self.new_handle(o)
                else:
                    _sync(h, o)
                results.append(h)
                out_ids.append(h._id)
            else:
                results.append(o)
                out_ids.append(None)
        if mutating:  # an in-place change of requires_grad (requires_grad_, Parameter)
            for h in handles:
                _sync(h, h._fake)
        elif (op_key is not None and out_spec is None and spec is None and not always and out._base is None
              and not out.requires_grad and not any(out is f for f in fakes)):
            # a fresh tensor of metadata that the inputs' determine: cache it
            self.op_cache[op_key] = (results[0]._key, func_ref(func), op_name(func))
        _known.track(self, func, flat, spec, kwargs, handles, results, mutating, always, op_key)
        args_t = _unflatten([Ref(x._id) if isinstance(x, Tensor) else x for x in flat], spec)
        self.send(P.Op(func_ref(func), args_t[0], args_t[1], out_ids, torch.is_grad_enabled(), op_name(func)))
        return results[0] if out_spec is None else tree_unflatten(results, out_spec)


    def _inputs(self, func: Any, flat: list, foreign: list | None = None) -> tuple[list[Tensor], list]:
        """(the distributed tensors among ``flat``, ``flat`` with each one's
        fake).  A tensor of another mesh is an error, unless ``foreign`` (a
        list) collects them, for a metadata query to be answered anyway."""
        fakes = []
        handles = []
        for x in flat:
            if isinstance(x, Tensor):
                if x._ctl is not self:
                    if foreign is None:
                        raise self.mismatch(func, x)
                    foreign.append(x)
                handles.append(x)
                fakes.append(x._fake)
            elif isinstance(x, torch.Tensor):
                raise RuntimeError(
                    f"{op_name(func)}: a local tensor (shape {tuple(x.shape)}) was mixed with the distributed tensors "
                    f"of mesh {self.mesh_name!r}: create it inside `with mesh.activate():` so that it exists on every "
                    f"proc, or compute it locally under monarch_core.no_mesh()")
            else:
                fakes.append(x)
        return handles, fakes

    def where(self) -> str:
        """This mesh as errors name it: its name, its sizes and which procs
        of the named mesh it holds (two slices of one mesh differ there)."""
        return f"mesh {self.mesh_name!r} {self.sizes} ({self.ranks_text} of {self.mesh_name!r})"

    def mismatch(self, func: Any, x: Tensor) -> MeshMismatch:
        return MeshMismatch(
            f"{op_name(func)}: a tensor of {x._ctl.where()} used inside {self.where()}: move it first "
            f"(t.to_mesh(mesh)) or activate its mesh")

    def dispatch_described(self, func: Callable[..., Any], args: tuple, kwargs: dict,
                           described: Any = None) -> tuple[Any, Any]:
        """Run ``func`` on every proc and learn its results from the first
        proc's (``propagate='cached'``/``'inspect'``): one round trip, unless
        ``described`` (a cached description) is given.  Returns (the results,
        with handles for tensors; their description).  Every proc checks its
        results against the description (a mismatch poisons them).  A failure
        on the first proc raises here, as the ``ActorError`` of its
        ``TensorOpError``."""
        if torch.get_default_dtype() is not self.default_dtype or torch._C._is_any_autocast_enabled():
            _globals.sync(self)  # the procs follow the client's default dtype; autocast is refused
        flat, spec = _flatten(args, kwargs)
        handles, _ = self._inputs(func, flat)
        self.check_streams(func, handles, kwargs, None)
        stream = _streams.get_active_stream()
        key = next(self.ids)
        args_t = _unflatten([Ref(x._id) if isinstance(x, Tensor) else x for x in flat], spec)
        with self.lock:
            self.send(P.Keep(func_ref(func), args_t[0], args_t[1], key, torch.is_grad_enabled(), op_name(func)))
            if described is None:
                self.flush()
                future = self.ranks[0].describe.call_one(key, stream.key)
        if described is None:
            try:
                described = future.get(timeout=DESCRIBE_TIMEOUT_S)
            except BaseException:
                self.send(P.Bind(key, [], []))  # frees what every proc kept
                raise
        leaves, out_spec = tree_flatten(described, is_leaf=lambda x: isinstance(x, Meta))
        results, out_ids, metas = [], [], []
        for leaf in leaves:
            if isinstance(leaf, Meta):
                h = self.new_handle(self.fake_of(leaf.key()))
                results.append(h)
                out_ids.append(h._id)
                metas.append(leaf)
            else:
                results.append(leaf)
        self.send(P.Bind(key, out_ids, metas))
        return tree_unflatten(results, out_spec), described

    def fake_of(self, key: tuple) -> torch.Tensor:
        """A fake tensor of ``key``: ``(shape, strides, dtype, device, requires_grad)`` (``_tensor.meta_key``)."""
        shape, stride, dtype, device, requires_grad = key
        with torch._C.DisableTorchFunction(), self.fake_mode:
            return torch.empty_strided(shape, stride, dtype=dtype, device=device, requires_grad=requires_grad)

    @staticmethod
    def check_streams(func: Any, handles: list, kwargs: dict, written: Any) -> None:
        """Raise unless the active stream may use every handle (see ``_streams``)."""
        active_stream = _streams.get_active_stream()
        out_kw = kwargs.get("out") if kwargs else None
        for h in handles:
            if h._stream is not active_stream or h._guard is not None:
                _streams.check_use(h, h is written or h is out_kw, op_name(func))


#: what ``Controller.cached`` returns when the fast path does not apply
MISS = object()
#: numbers the controllers' worker meshes (a proc mesh refuses two live actor meshes of one name)
_worker_meshes = itertools.count(1)
#: argument types an operation's cache key holds as they are (with their type: 1, 1.0 and True differ)
_KEYABLE = (int, float, bool, complex, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout)
#: operations whose results' metadata depend on a number argument's type only, never on its value (element-wise
#: arithmetic and comparisons, clamps, fills): their cache key holds an int, float or complex as its type, so a
#: value that changes at every step (a learning-rate schedule, a step counter) reuses one entry.  Not ``pow`` nor
#: shape arguments (``reshape``, ``view``, ``expand``, ``narrow``...), whose values the fakes check or use.
_VALUE_FREE = {f for n in ("add", "sub", "mul", "div", "true_divide", "subtract", "multiply", "divide", "rsub",
                           "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
                           "__rtruediv__", "__div__", "__rdiv__", "eq", "ne", "lt", "le", "gt", "ge", "__eq__",
                           "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "clamp", "clamp_min", "clamp_max", "clip",
                           "where", "masked_fill", "lerp")
               for f in (getattr(torch, n, None), getattr(torch.Tensor, n, None)) if f is not None}
#: ints held by type only lie in this range (the fakes refuse a larger one: it must reach them)
_I64 = 1 << 63


def _op_key(ctl: Controller, func: Any, args: tuple) -> tuple | None:
    """The cache key of ``func(*args)``, or None when it may not be cached:
    an argument that is not a distributed tensor of this mesh on the active
    stream, unguarded and not requiring grad, nor a plain scalar.  A tensor
    is keyed by its metadata (``Tensor._key``, which in-place operations
    keep current); a scalar by its type and value, or by its type alone for
    the operations of :data:`_VALUE_FREE`."""
    key: list[Any] = [func]
    stream = _streams.get_active_stream()
    free = func in _VALUE_FREE
    for x in args:
        t = type(x)
        if t is Tensor:
            k = x._key
            if x._ctl is not ctl or x._guard is not None or x._stream is not stream or k[4]:
                return None
            key.append(k)
        elif t in _KEYABLE:
            if free and (t is float or t is complex or (t is int and -_I64 <= x < _I64)):
                key.append(t)  # the type alone (a value is a (type, value) pair)
            else:
                key.append((t, x))
        else:
            return None
    return tuple(key)


class Fetched:
    """The future of a fetched value: like ``monarch_core.actor.Future``
    (``get(timeout)``, ``result(timeout)``, ``await``), with the value decoded
    as a local tensor even inside an active mesh."""

    __slots__ = ("_future",)

    def __init__(self, future: Any) -> None:
        self._future = future

    def get(self, timeout: float | None = None) -> Any:
        with torch._C.DisableTorchFunction():
            return self._future.get(timeout)

    result = get

    def __await__(self) -> Any:
        async def wait() -> Any:
            with torch._C.DisableTorchFunction():
                return await self._future

        return wait().__await__()

    def __repr__(self) -> str:
        return f"Fetched({self._future!r})"


def _sync(h: Tensor, fake: torch.Tensor) -> None:
    """``h`` was changed in place (its fake was, and the procs' tensors will
    be): it takes the fake's metadata.  An in-place view (``unsqueeze_``,
    ``squeeze_``, ``t_``, ``transpose_``, ``as_strided_``), a ``resize_``, a
    resizing ``out=`` change the shape and strides; ``requires_grad_`` the
    flag.  ``h._key`` (what the op cache keys on, and what ``materialize``
    makes a fake from) follows; every metadata query of a handle is answered
    from its fake, through torch function."""
    key = meta_key(fake)
    if key != h._key:
        if key[4] != h._key[4]:
            with torch._C.DisableTorchFunctionSubclass():
                torch.Tensor.requires_grad_(h, key[4])
        h._key = key


def _data_dependent(func: Any, flat: list, mesh_name: str) -> RuntimeError:
    """The error of an operation whose result's shape (or an index) depends
    on a distributed tensor's values, which the client does not have."""
    name = op_name(func)
    index = next((x for x in flat[1:] if isinstance(x, Tensor) and x._key[0] == () and x._key[2] is not torch.bool
                  and not x._key[2].is_floating_point and not x._key[2].is_complex), None)
    if name in ("__getitem__", "__setitem__") and index is not None:
        return RuntimeError(
            f"{name}: indexing by a distributed 0-d tensor (x[i]) reads its value, which lives on the procs of mesh "
            f"{mesh_name!r}: index with a 1-element tensor instead, x[i.reshape(1)] (the result keeps that dimension: "
            f"x[i.reshape(1)][0], or torch.index_select(x, 0, i.reshape(1)).squeeze(0)); x[i.reshape(1)] = v assigns")
    return RuntimeError(
        f"{name}: its result's shape depends on the values of a distributed tensor, which live on the procs of mesh "
        f"{mesh_name!r} (the client knows only shapes): use an operation of fixed shape (torch.where(mask, x, 0) "
        f"for x[mask]), run it in remote(fn, propagate='inspect'), or fetch the values first "
        f"(monarch_core.inspect(t))")


class _Mode(TorchFunctionMode):
    def __init__(self, ctl: Controller) -> None:
        super().__init__()
        self.ctl = ctl

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self.ctl.dispatch(func, tuple(args), dict(kwargs or {}))


# ---------------------------------------------------------------- the active mesh

#: (mesh name, its procs) -> controller: a view of the same procs (another ``slice()`` of
#: them) is the same mesh
_controllers: dict[tuple, Controller] = {}
_lock = threading.Lock()


def _forget(ctl: Controller) -> None:
    """Take ``ctl`` out of the registry (its procs are gone; any thread)."""
    key = tuple(ctl.proc_ids)
    if _controllers.get(key) is ctl:
        _controllers.pop(key, None)


#: the runtime (``runtime.local_ref()``) whose proc failures :func:`_on_proc_failed` hears
_listening: tuple | None = None


def _listen() -> None:
    """Hear this runtime's proc failures (once per runtime, under ``_lock``):
    one listener for every controller, so that no listener keeps one alive."""
    global _listening
    ref = runtime.local_ref()
    if _listening != ref:
        runtime.on_proc_failed(_on_proc_failed)
        _listening = ref


def _on_proc_failed(proc_id: str, why: str, stopped: bool) -> None:
    """A proc failed or stopped (the kernel's thread): tell the controllers of meshes that hold it."""
    for ctl in list(_controllers.values()):
        ctl._proc_failed(proc_id, why, stopped)


def controller(mesh: Any) -> Controller:
    """The controller of the mesh's procs (its workers spawned on first
    use).  Meshes of the same procs in the same order (another ``slice()``
    of them, a ``rename``/``split``/``flatten``) share one controller, and
    tensors: the names are the active view's."""
    key = tuple(mesh.proc_ids)
    with _lock:
        ctl = _controllers.get(key)
        if ctl is None:
            ctl = _controllers[key] = Controller(mesh)
        return ctl


class Active:
    """``with mesh.activate():`` (see the module docstring)."""

    def __init__(self, mesh: Any) -> None:
        self.ctl = controller(mesh)
        self.view = mesh
        self.previous: Any = None
        self.mode: _Mode | None = None

    def __enter__(self) -> Any:
        self.previous = self.ctl.set_view(self.view)
        self.mode = _Mode(self.ctl)
        self.mode.__enter__()
        _active.stack().append(self)
        return self.view

    def __exit__(self, *exc: Any) -> None:
        stack = _active.stack()
        if stack and stack[-1] is self:
            stack.pop()
        assert self.mode is not None
        self.mode.__exit__(*exc)
        self.ctl.flush()
        if self.previous is not None:
            self.ctl.set_view(self.previous)


class NoMesh:
    """``with no_mesh():`` torch runs locally inside, whatever mesh is active
    (the active mesh's mode is left for the block, then entered again)."""

    def __enter__(self) -> None:
        stack = _active.stack()
        self.top: Active | None = stack[-1] if stack else None
        if self.top is not None and self.top.mode is not None:
            self.top.ctl.flush()
            self.top.mode.__exit__(None, None, None)
            stack.append(None)

    def __exit__(self, *exc: Any) -> None:
        if self.top is not None:
            stack = _active.stack()
            if stack and stack[-1] is None:
                stack.pop()
            self.top.mode = _Mode(self.top.ctl)
            self.top.mode.__enter__()


