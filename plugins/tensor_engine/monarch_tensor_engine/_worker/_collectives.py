"""Collectives, the procs' side: a ``Reduce`` command on each member of a
group (the client's side is ``_client._collectives``).

The client checks the arguments, works out the result's shape (so that the
next operations can be checked and pipelined too) and sends one ``reduce``
command.  On the procs, the members of a group are the procs that share
their coordinates in every dimension *not* reduced over; each group is a
``torch.distributed`` process group (gloo for CPU tensors, NCCL for CUDA
ones) made at its first use and cached.  The groups' rendezvous is a
``TCPStore`` that the mesh's first proc starts on a free port of its host,
at the address the other procs already reach it at; its address travels in
the engine's own commands (no fixed port, nothing to configure).

Reductions: ``sum``, ``avg`` (floating point), ``product``, ``min``, ``max``,
``band``/``bor``/``bxor`` (integers and bool) and ``stack`` (all-gather: a new
first dimension of the group's size, in the group's rank order).
``mesh=`` a sub-mesh of the tensor's mesh (``mesh.slice(dp=0)``): the result
is a tensor of that mesh, each of its procs holding its group's result (the
reduction runs over the whole group, then each member of the sub-mesh keeps
its value, handed over inside its process).
``scatter=True``: reduce-scatter (the input's first dimension, divisible by
the group's size, is split; member i keeps the i-th block of the reduction;
done as an all-reduce followed by a slice: gloo has no reduce-scatter) or,
with ``stack``, all-to-all (the input's first dimension is the group's size;
member i receives block i of every member, stacked).

Failures: a collective's outcome is the same on every member.  A poisoned
input on one member poisons every member's result, naming that member and
its failed op (a poisoned flag per member travels with the data: in the
buffer of a small all-reduce, in a tiny all-reduce beside a bigger collective).  A member that the client knows is dead (it
marks deaths in the store, ``_client._store.StoreLink.mark_dead``) fails every group it belongs
to on every living member, at once: before the command is sent, while the
group forms (:func:`arrive`, :func:`form`) or while the collective runs
(:func:`watch`); a group of living procs is not concerned.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import threading
import time
from typing import Any

import torch

from monarch_core.runtime import format_duration, host_address
from monarch_tensor_engine._protocol import (DEAD_KEY, TIMEOUT_S, MemberDied, ProcessGroupRef, Reduce, TensorOpError,
                                             coordinates, dead_key, members_of)
from monarch_tensor_engine._worker._env import Poison, stream_key

logger = logging.getLogger("monarch.tensor")

class Group:
    """One process group of this proc, as :func:`_group` caches it.

    ``pg``: the torch process group; ``rank``/``size``: this proc's rank in
    it and its size; ``store``: the group's prefix of the mesh's store (where
    a poisoned member publishes its error, see :func:`run_reduce`);
    ``members``: the mesh's flat ranks of its members, in the group's rank
    order (to name them, and to find a dead one); ``seq``: how many
    collectives ran on it here (the same count on every member, since every
    member runs the same commands in the same order)."""

    __slots__ = ("pg", "rank", "size", "store", "members", "seq")

    def __init__(self, pg: Any, rank: int, size: int, store: Any, members: tuple[int, ...]) -> None:
        self.pg, self.rank, self.size, self.store, self.members = pg, rank, size, store, members
        self.seq = 0

    def __iter__(self) -> Any:
        """``pg, rank, size = group`` (and ``group[0]``: the process group), as the other modules take it."""
        return iter((self.pg, self.rank, self.size))

    def __getitem__(self, i: int) -> Any:
        return (self.pg, self.rank, self.size)[i]


def _group(worker: Any, names: tuple[str, ...], device: torch.device, view: tuple) -> Group:
    """The :class:`Group` of this proc for a reduction over ``names`` of
    ``view`` (labels, sizes) on the stream running now (each stream has its
    own groups), made at its first use.  Raises :class:`MemberDied` when one
    of its members is dead (the client marked it in the store) before the
    group has formed, or dies while it forms."""
    groups = worker.groups
    labels, sizes = view
    backend = "nccl" if device.type == "cuda" else "gloo"
    stream = stream_key()
    key = (names, view, backend, stream)
    got = groups.get(key)
    if got is not None:
        return got
    where = coordinates(worker.mesh_rank, labels, sizes)
    dim_sizes = dict(zip(labels, sizes))
    others = tuple((d, where[d]) for d in labels if d not in names)
    rank = 0
    for d in names:
        rank = rank * dim_sizes[d] + where[d]
    size = math.prod(dim_sizes[d] for d in names)
    members = members_of(worker.mesh_rank, names, view)
    shape = ",".join(f"{d}:{n}" for d, n in zip(labels, sizes))
    prefix = f"monarch-group/{stream}/{backend}/{shape}/{','.join(names)}/{','.join(f'{d}={c}' for d, c in others)}"
    store = torch.distributed.PrefixStore(prefix, worker.store.base)
    base = worker.store.watcher()
    if backend == "nccl":
        arrive(store, size, base, members, view)
        pg = form(lambda: torch.distributed.ProcessGroupNCCL(store, rank, size),  # type: ignore[call-arg]  # options default
                  base, members, view)
    else:
        pg = gloo_group(store, rank, size, base, members, view)
    groups[key] = got = Group(pg, rank, size, store, members)
    return got


#: seconds between two looks at the store for a dead member, while a collective (or a group) waits
POLL_S = 0.25


def dead_members(base: Any, members: tuple[int, ...] | None) -> dict[int, str]:
    """The members (flat ranks; None: the whole mesh) that the client marked
    dead in ``base``, the mesh's store: one round trip while no proc of the
    mesh died.  Raises what the store raises (its proc may be the dead one)."""
    if not base.check([DEAD_KEY]):
        return {}
    if members is None:
        return {-1: base.get(DEAD_KEY).decode()}
    out: dict[int, str] = {}
    for r in members:
        k = dead_key(r)
        if base.check([k]):
            out[r] = base.get(k).decode()
    return out


def describe_dead(dead: dict[int, str], view: tuple | None) -> str:
    """``rank 1 {'dp': 0, 'tp': 1} (why)`` for each dead member."""
    def one(r: int, why: str) -> str:
        if r < 0:
            return why
        return f"rank {r}" + (f" {coordinates(r, *view)}" if view is not None else "") + f" ({why})"

    return "; ".join(one(r, why) for r, why in sorted(dead.items()))


def _check_alive(base: Any, members: tuple[int, ...] | None, view: tuple | None, what: str) -> bool:
    """Raise :class:`MemberDied` if a member is marked dead.  Returns False
    when the store cannot be reached any more (its proc, the mesh's first,
    died): then a member that is that proc is dead, and the others cannot
    learn of deaths from the store any more."""
    try:
        dead = dead_members(base, members)
    except Exception as e:  # noqa: BLE001 - the store's proc (flat rank 0) is gone
        if members is None or 0 in members:
            raise MemberDied(f"{what}: the mesh's store, on rank 0, cannot be reached ({type(e).__name__}: {e}): "
                             f"rank 0 of the group died", {0: f"its store is gone: {e}"}) from e
        return False
    if dead:
        raise MemberDied(f"{what}: a member of this group died: {describe_dead(dead, view)}", dead)
    return True


def watch(done: threading.Event, base: Any, members: tuple[int, ...] | None, view: tuple | None,
          what: str, timeout: float = TIMEOUT_S) -> None:
    """Wait until ``done`` is set, looking at the mesh's store every
    :data:`POLL_S` for a dead member: raise :class:`MemberDied` at once when
    one is marked dead (the wait would otherwise last until gloo's timeout),
    ``TimeoutError`` after ``timeout``.  Costs nothing while ``done`` comes
    within :data:`POLL_S`."""
    deadline = time.monotonic() + timeout
    looking = True
    while not done.wait(POLL_S):
        if looking:
            looking = _check_alive(base, members, view, what)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done within {format_duration(timeout)}")


def form(make: Any, base: Any, members: tuple[int, ...] | None, view: tuple | None) -> Any:
    """``make()`` (a process group's constructor, which waits for every
    member to connect) on a thread of its own, watched (:func:`watch`): a
    member that dies while the group forms fails the others at once (the
    thread is left to end at its own timeout)."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["pg"] = make()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=run, daemon=True, name="monarch-group-form").start()
    watch(done, base, members, view, "forming a process group", TIMEOUT_S + 30)
    if "error" in box:
        raise box["error"]
    return box["pg"]


def arrive(store: Any, size: int, base: Any, members: tuple[int, ...] | None = None,
           view: tuple | None = None) -> None:
    """Wait until the ``size`` members of a new group (``store`` is its
    prefix of ``base``, the mesh's store) have arrived.  Raise
    :class:`MemberDied` when the client has marked one of ``members`` (flat
    ranks; None: any proc of the mesh) dead (:func:`dead_key`), and
    ``TimeoutError`` after :data:`TIMEOUT_S`: a group whose member died never
    forms, and its members must not wait for it; a death elsewhere in the
    mesh does not concern it."""
    n = store.add("arrived", 1)
    deadline = time.monotonic() + TIMEOUT_S
    pause = 0.001
    looking = True
    while n < size:
        if looking:
            looking = _check_alive(base, members, view, "forming a process group")
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {n} of the {size} members of this group arrived within "
                               f"{format_duration(TIMEOUT_S)}")
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
        n = store.add("arrived", 0)


def gloo_group(store: Any, rank: int, size: int, base: Any, members: tuple[int, ...] | None = None,
               view: tuple | None = None) -> Any:
    """A gloo process group on ``store``, bound to the address the other procs
    reach this one at (not whatever the host name resolves to), once its
    members have all arrived (:func:`arrive`), formed under :func:`form`."""
    arrive(store, size, base, members, view)
    opts = torch.distributed.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # not in torch's stubs
    opts._timeout = datetime.timedelta(seconds=TIMEOUT_S)
    opts._devices = [torch.distributed.ProcessGroupGloo.create_device(hostname=host_address())]
    return form(lambda: torch.distributed.ProcessGroupGloo(store, rank, size, opts), base, members, view)


_OPS = {"sum": "SUM", "avg": "SUM", "product": "PRODUCT", "min": "MIN", "max": "MAX", "band": "BAND",
        "bor": "BOR", "bxor": "BXOR"}


def _done_event(work: Any) -> threading.Event:
    """An event set when ``work`` (an async collective) completes, well or not."""
    ev = threading.Event()
    work.get_future().add_done_callback(lambda _f: ev.set())
    return ev


def _publish(g: Group, seq: int, error: Any) -> None:
    """A poisoned member's error, for the other members to name the cause (:func:`_causes`)."""
    try:
        g.store.set(f"poison/{seq}/{g.rank}", json.dumps({"op": getattr(error, "op", ""),
                                                          "coords": getattr(error, "coords", {}),
                                                          "error": str(error)}))
    except Exception as e:  # noqa: BLE001 - the others then name the member without its error
        logger.warning("tensor engine: could not publish a poisoned input's error: %s", e)


def _causes(g: Group, seq: int, ranks: list[int], view: tuple) -> list[dict]:
    """The errors the poisoned members ``ranks`` (ranks in ``g``) published (:func:`_publish`)."""
    out = []
    for r in ranks:
        coords = coordinates(g.members[r], *view)
        key = f"poison/{seq}/{r}"
        try:
            g.store.wait([key], datetime.timedelta(seconds=30))
            got = json.loads(g.store.get(key).decode())
        except Exception as e:  # noqa: BLE001 - named without its error
            got = {"op": "", "coords": coords, "error": f"(its error could not be read: {type(e).__name__}: {e})"}
        got["member"] = coords
        out.append(got)
    return out


def _poisoned_by(what: str, where: dict, causes: list[dict]) -> Any:
    """The error every healthy member's result carries when ``causes`` (the
    poisoned members' published errors) fed the collective: it names each
    poisoned member and its failed op, and carries the first one's ``op``
    and ``coords`` (where the failure is), like the poisoned member's own."""
    first = causes[0]
    lines = "\n".join(f"  the member at {c['member']}: {c['op'] or 'its input'} failed there: {c['error']}"
                      for c in causes)
    return TensorOpError(f"{what} on the proc at {where} is poisoned, like the result of every member of its group: "
                         f"the input of {len(causes)} member(s) was poisoned, so no member's result is valid:\n"
                         f"{lines}", first["op"] or "reduce", first["coords"] or first["member"])


def _died(what: str, dead: dict[int, str], view: tuple) -> Any:
    """The error every living member's result carries when a member of its group died."""
    first = min(dead)
    coords = coordinates(first, *view) if first >= 0 else {}
    return TensorOpError(f"{what}: a member of its group died, so no member's result is valid: "
                         f"{describe_dead(dead, view)}; work that needs it cannot run: start a new mesh for it",
                         "reduce", coords)


#: seconds a failed collective waits for the client to mark a member dead (a dead peer's closed
#: connection fails gloo at once, before the client has noticed the death)
GRACE_S = 10.0


def _death_behind(base: Any, members: tuple[int, ...]) -> dict[int, str]:
    """After a collective failed: the dead members that caused it, as the
    client marks them in the store within :data:`GRACE_S` (none: the error
    had another cause, or the store is gone too)."""
    deadline = time.monotonic() + GRACE_S
    while True:
        try:
            dead = dead_members(base, members)
        except Exception:  # noqa: BLE001 - the store's proc is gone: report the error as it is
            return {}
        if dead or time.monotonic() > deadline:
            return dead
        time.sleep(0.1)


#: an all-reduce of at most this many bytes carries the members' poisoned flags in its own buffer
#: (a copy, cheaper than a second collective); a bigger one runs a tiny flags all-reduce beside it
PACK_BYTES = 256 << 10
#: per reduction: (what a member writes in another member's flag slot, in its own when poisoned);
#: the reduction of a slot is then its member's idle value unless that member is poisoned
_SLOT_VALUES = {"sum": (0, 1), "avg": (0, 1), "max": (0, 1), "bor": (0, 1), "bxor": (0, 1),
                "min": (1, 0), "band": (1, 0), "product": (1, 2)}


def slots_idle(reduction: str) -> int:
    """The value of a flag slot, after the reduction, whose member is not poisoned."""
    return _SLOT_VALUES[reduction][0]


def _slots(reduction: str, data: torch.Tensor, size: int, rank: int, poisoned: bool) -> torch.Tensor | None:
    """The ``size`` flag slots this member appends to a small all-reduce (of
    a numeric, non-bool, real dtype, on the CPU), or None where the flags
    take a collective of their own (:data:`PACK_BYTES`)."""
    dtype = data.dtype
    if (reduction not in _SLOT_VALUES or data.device.type != "cpu" or dtype == torch.bool or dtype.is_complex
            or data.numel() * data.element_size() > PACK_BYTES):
        return None
    idle, mark = _SLOT_VALUES[reduction]
    slots = torch.full((size,), idle, dtype=dtype)
    if poisoned:
        slots[rank] = mark
    return slots


def _allreduce_opts(reduction: str) -> Any:
    opts = torch.distributed.AllreduceOptions()
    opts.reduceOp = getattr(torch.distributed.ReduceOp, _OPS[reduction])
    return opts


def run_reduce(worker: Any, cmd: Reduce) -> None:
    """One member's part of a ``reduce`` command (see the module docstring).

    Every member of the group ends with the same outcome: the result, or a
    poisoned result.  The members exchange a poisoned flag each (in slots
    appended to a small all-reduce's buffer, :data:`PACK_BYTES`; otherwise
    in a tiny all-reduce of an int tensor of the group's size, run beside
    the data's collective): when one member's input is poisoned (or missing), it keeps
    its own error, publishes it in the group's store under the collective's
    sequence number, and every other member's result is poisoned with an
    error that names it (:func:`_poisoned_by`).  A member the client knows
    is dead (``dead``: (flat rank, why) pairs, or flat ranks) poisons every
    living member's result at once, without a collective; one that dies
    while the group forms or while the collective runs does so within
    :data:`POLL_S` of the client's noticing (:func:`watch`)."""
    in_id, out_id, names, reduction, scatter, shape, dtype, view, dead = cmd
    what = f"reduce({names}, {reduction!r}, scatter={scatter})"
    if dead:
        known: dict[int, str] = dict(d if isinstance(d, tuple) else (d, "it died") for d in dead)
        mine = members_of(worker.mesh_rank, names, view)
        gone = {r: why for r, why in known.items() if r in mine}
        if gone:
            worker.env[out_id] = Poison(_died(what, gone, view))
            return

    src = worker.env.get(in_id)
    poison = src.error if isinstance(src, Poison) else None
    if src is None:
        poison = TensorOpError(f"the input of {what} does not exist on the proc at {worker.where}"
                               f"{' (' + worker.lost + ')' if worker.lost else ''}", "reduce", worker.where)
    x = src if poison is None else torch.zeros(shape, dtype=dtype)  # take part all the same: none may wait
    g: Group | None = None
    try:
        g = _group(worker, names, x.device, view)
        size, rank, seq = g.size, g.rank, g.seq
        g.seq += 1
        if poison is not None:
            _publish(g, seq, poison)
        data = x.contiguous() if not x.is_contiguous() else x
        slots = _slots(reduction, data, size, rank, poison is not None)
        if slots is not None:  # a small all-reduce: the flags ride in it, one collective
            n = data.numel()
            buf = torch.cat([data.reshape(-1), slots])
            works = [g.pg.allreduce([buf], _allreduce_opts(reduction))]
        else:  # the flags in a tiny all-reduce of their own, beside the data's: the two overlap
            flags = torch.zeros(size, dtype=torch.int32)
            if poison is not None:
                flags[rank] = 1
            works = [g.pg.allreduce([flags])]
            if reduction == "stack":
                if scatter:
                    result = torch.empty_like(data)
                    works.append(g.pg.alltoall_base(result, data, [], []))
                else:  # gathered straight into the rows of the result (no stack copy)
                    result = torch.empty((size, *data.shape), dtype=data.dtype, device=data.device)
                    works.append(g.pg.allgather([list(result.unbind(0))], [data]))
            else:
                buf = data if (in_id == out_id and data is x) else data.clone()
                works.append(g.pg.allreduce([buf], _allreduce_opts(reduction)))
        for w in works:
            watch(_done_event(w), worker.store.watcher(), g.members, view, what)
            w.wait()
        if slots is not None:
            flags = buf[n:] != slots_idle(reduction)
            buf = buf[:n].view(data.shape)
        if reduction != "stack":
            if reduction == "avg":
                buf.div_(size)
            result = buf.chunk(size)[rank].clone() if scatter else buf
    except MemberDied as e:
        worker.env[out_id] = Poison(_died(what, e.dead, view))
        return
    except Exception as e:  # noqa: BLE001 - contained: the result is poisoned
        dead_now = _death_behind(worker.store.watcher(), g.members) if g is not None else {}
        worker.env[out_id] = Poison(_died(what, dead_now, view) if dead_now else TensorOpError(
            f"{what} failed on the proc at {worker.where}: {type(e).__name__}: {e}", "reduce", worker.where))
        return
    if poison is not None:
        worker.env[out_id] = Poison(poison)
        return
    bad = flags.nonzero().flatten().tolist()
    if bad:
        worker.env[out_id] = Poison(_poisoned_by(what, worker.where, _causes(g, seq, bad, view)))
        return
    dest = worker.env.get(out_id)
    if out_id == in_id:
        if result is not x:
            x.copy_(result)
    elif isinstance(dest, torch.Tensor) and dest is not result:  # out=
        dest.copy_(result)
    else:
        worker.env[out_id] = result


def resolve_group(worker: Any, ref: ProcessGroupRef) -> Any:
    """This proc's process group for ``ref`` (a ``mesh.process_group(dims)``
    passed to a remote function), made at first use on the stream running
    now (:func:`_group`)."""
    backend = ref.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")
    return _group(worker, ref.dims, device, ref.view)[0]
