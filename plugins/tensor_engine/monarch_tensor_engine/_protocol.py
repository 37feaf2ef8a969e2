"""The engine's shared vocabulary: what the client (``_client``) sends the
procs' workers (``_worker``), and what both sides name.  It imports neither
side; both import it.

* **Commands** (:data:`Command`): one immutable, typed record per kind
  (``typing.NamedTuple``: a tuple on the wire, pickled once per batch).  The
  client queues them in order and sends each batch as one message
  (``Worker.run``); the worker runs each through its table
  (``_worker._actor.Worker.HANDLERS``, keyed by the command's type).  On
  the wire each is a plain tuple tagged with its type (:func:`encode`,
  :func:`decode`), which pickles several times faster.  A
  tensor in a command is a :class:`Ref` (its id on the procs); the client's
  handles never travel.
* **Values**: :class:`Ref`, :class:`Meta` (a tensor's metadata, as a proc
  describes its results), :func:`meta_key`, :class:`ProcessGroupRef` (a
  ``mesh.process_group(dims)`` passed to a remote function).
* **Errors**: :class:`TensorEngineError` and its subclasses, in
  ``monarch_core.errors``' tree (a ``MonarchError``).
* **The mesh's store** (the groups' rendezvous): its client
  (:func:`store_client`), the keys that mark a dead proc
  (:data:`DEAD_KEY`, :func:`dead_key`), and how a flat rank maps to
  coordinates (:func:`coordinates`, :func:`members_of`).
"""

from __future__ import annotations

import datetime
import math
from typing import Any, NamedTuple, Union

import torch

from monarch_core.errors import MonarchError

#: seconds a collective (and a group's rendezvous, and the store's start) may wait for its members
TIMEOUT_S = 300
#: how long a stream waits for another (a borrow), or a fetch for its stream, at most
WAIT_S = 300.0


# ---------------------------------------------------------------- errors


class TensorEngineError(MonarchError):
    """Base of what monarch-tensor-engine raises on purpose (``monarch_core.errors``' tree)."""


class TensorOpError(TensorEngineError, RuntimeError):
    """An operation on a distributed tensor failed on a proc: ``op``, the
    proc's ``coords``, and the remote traceback in the message."""

    def __init__(self, message: str, op: str = "", coords: dict | None = None) -> None:
        super().__init__(message)
        self.op, self.coords = op, dict(coords or {})

    def __reduce__(self) -> Any:
        return (TensorOpError, (str(self), self.op, self.coords))


class MeshMismatch(TensorEngineError, RuntimeError):
    """A tensor of one mesh used inside another (the message names both, and which procs each holds)."""


class MemberDied(TensorEngineError, RuntimeError):
    """On a proc: a member of a collective's group is dead; ``dead`` maps its flat rank to why."""

    def __init__(self, message: str, dead: dict[int, str]) -> None:
        super().__init__(message)
        self.dead = dead


# ---------------------------------------------------------------- values


class Ref:
    """A handle's place in a command: the id of the tensor on the procs."""

    __slots__ = ("id",)

    def __init__(self, ident: int) -> None:
        self.id = ident

    def __reduce__(self) -> Any:
        return (Ref, (self.id,))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


def meta_key(fake: torch.Tensor) -> tuple:
    """``(shape, strides, dtype, device, requires_grad)`` of a (fake) tensor."""
    with torch._C.DisableTorchFunction():
        return (tuple(fake.shape), tuple(fake.stride()), fake.dtype, fake.device, bool(fake.requires_grad))


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
        """As :func:`meta_key` has it: ``(shape, strides, dtype, device, requires_grad)``."""
        return (self.shape, self.stride, self.dtype, self.device, self.requires_grad)

    def __reduce__(self) -> Any:
        return (Meta, (self.shape, self.stride, self.dtype, self.device, self.requires_grad))


class ProcessGroupRef:
    """A ``RemoteProcessGroup`` as a command carries it to the procs: the
    worker gives the remote function its own process group over ``dims`` of
    ``view`` (``_worker._collectives.group``).  Not a tuple: commands'
    arguments are walked as pytrees, and this is one leaf."""

    __slots__ = ("dims", "view", "backend")

    def __init__(self, dims: tuple[str, ...], view: tuple, backend: str | None) -> None:
        self.dims, self.view, self.backend = dims, view, backend

    def __reduce__(self) -> Any:
        return (ProcessGroupRef, (self.dims, self.view, self.backend))


# ---------------------------------------------------------------- commands
# ``fn``: a function, pickled by reference, or ("get" | "set", attribute name) for a getset descriptor.


class SetStream(NamedTuple):
    """The following commands belong to the stream ``key`` (``"main"``: the worker's own thread)."""
    key: str


class Op(NamedTuple):
    """Run ``fn(*args, **kwargs)`` (tensors as :class:`Ref`) and store the tensor results under ``out_ids``."""
    fn: Any
    args: tuple
    kwargs: dict
    out_ids: list
    grad: bool
    name: str


class Keep(NamedTuple):
    """Run ``fn`` and keep its results whole under ``key`` until :class:`Bind` (the client asks one proc to
    describe them: ``propagate='cached'``/``'inspect'``)."""
    fn: Any
    args: tuple
    kwargs: dict
    key: int
    grad: bool
    name: str


class Value(NamedTuple):
    """A remote function run for its value (``remote(fn).call()``...): on the procs of ``ranks`` (None:
    every proc), its result kept under ``key`` for the worker's ``result`` endpoint (None: not kept)."""
    fn: Any
    args: tuple
    kwargs: dict
    key: int | None
    grad: bool
    name: str
    ranks: list | None


class Bind(NamedTuple):
    """Bind the results kept under ``key`` to ``out_ids``, checked against the first proc's ``metas``."""
    key: int
    out_ids: list
    metas: list


class Drop(NamedTuple):
    """Free these tensors."""
    ids: list


class Lend(NamedTuple):
    """Borrow ``bid``: the lender's stream hands tensor ``src`` over."""
    bid: int
    src: int


class Take(NamedTuple):
    """Borrow ``bid``: the borrower's stream waits for the :class:`Lend`, and binds the tensor to ``dst``."""
    bid: int
    dst: int


class GiveBack(NamedTuple):
    """Borrow ``bid`` ends on the borrower's stream: ``dst`` is freed."""
    bid: int
    dst: int


class WaitBack(NamedTuple):
    """Borrow ``bid`` ends on the lender's stream: it waits for the :class:`GiveBack`."""
    bid: int


class StartGrads(NamedTuple):
    """``grad_generator`` ``gen``: start the backward of ``roots`` on a thread of its own."""
    gen: int
    roots: Any
    params: Any
    grad_roots: Any


class TakeGrad(NamedTuple):
    """Bind gradient ``nth`` of generator ``gen`` to ``out``, once the backward has it."""
    gen: int
    nth: int
    out: int


class EndGrads(NamedTuple):
    """The client is done with generator ``gen``."""
    gen: int


class RankTensor(NamedTuple):
    """``out`` = this proc's coordinate along ``dim`` of ``view`` (labels, sizes)."""
    dim: str
    view: tuple
    out: int


class ConnectStore(NamedTuple):
    """The mesh's store runs at ``addr:port`` (the first proc started it)."""
    addr: str
    port: int


class Send(NamedTuple):
    """A transfer's source side: ``routes[flat rank]`` is (destination rank, same proc) or None."""
    ident: int
    key: str
    pair: str
    routes: list
    store: Any
    shape: tuple
    dtype: torch.dtype


class Recv(NamedTuple):
    """A transfer's destination side: ``routes[flat rank]`` is (source rank, same proc)."""
    ident: int
    key: str
    pair: str
    routes: list
    store: Any
    shape: tuple
    dtype: torch.dtype
    what: str


class Reduce(NamedTuple):
    """A collective over ``names`` of ``view``; ``dead``: (flat rank, why) of procs known dead when sent."""
    in_id: int
    out_id: int
    names: tuple
    reduction: str
    scatter: bool
    shape: tuple
    dtype: torch.dtype
    view: tuple
    dead: tuple


#: every command the client sends
Command = Union[SetStream, Op, Keep, Value, Bind, Drop, Lend, Take, GiveBack, WaitBack, StartGrads, TakeGrad, EndGrads,
                RankTensor, ConnectStore, Send, Recv, Reduce]
#: every command type, in a fixed order: on the wire a command is (its index here, *its fields) (:func:`encode`)
COMMANDS: tuple[type, ...] = (SetStream, Op, Keep, Value, Bind, Drop, Lend, Take, GiveBack, WaitBack, StartGrads,
                              TakeGrad, EndGrads, RankTensor, ConnectStore, Send, Recv, Reduce)
_TAGS: dict[type, tuple[int]] = {cls: (i,) for i, cls in enumerate(COMMANDS)}


def encode(batch: list[Command]) -> list[tuple]:
    """``batch`` as it is pickled: each command a plain tuple, its type's index
    in :data:`COMMANDS` first.  A ``NamedTuple`` pickles through a Python-level
    ``__getnewargs__`` call per command, which made a batch's pickling about
    4 times slower than plain tuples'; the worker rebuilds the typed command
    (:func:`decode`) for its table."""
    tags = _TAGS
    return [tags[type(c)] + c for c in batch]


def decode(item: tuple) -> Command:
    """The typed command ``item`` (from :func:`encode`) stands for.  ``IndexError``
    for a tag this version does not know (a client of another version)."""
    cmd: Command = tuple.__new__(COMMANDS[item[0]], item[1:])
    return cmd


# ---------------------------------------------------------------- the mesh's store

#: the key of a mesh's store that the client sets when one of the mesh's procs dies (any of them)
DEAD_KEY = "monarch-dead"


def dead_key(flat_rank: int) -> str:
    """The key of a mesh's store that says why the proc at ``flat_rank`` died (set before :data:`DEAD_KEY`)."""
    return f"{DEAD_KEY}/{flat_rank}"


def store_client(addr: str, port: int) -> Any:
    """A client of the store at ``addr:port``."""
    return torch.distributed.TCPStore(addr, port, None, False, datetime.timedelta(seconds=TIMEOUT_S))


def coordinates(flat_rank: int, labels: tuple[str, ...], sizes: tuple[int, ...]) -> dict[str, int]:
    """The coordinates of the proc at ``flat_rank`` in a view (row-major)."""
    out: dict[str, int] = {}
    for label, size in zip(reversed(labels), reversed(sizes)):
        flat_rank, out[label] = divmod(flat_rank, size)
    return {label: out[label] for label in labels}


def members_of(flat_rank: int, names: tuple[str, ...], view: tuple) -> tuple[int, ...]:
    """The flat ranks of the group of ``flat_rank`` for a reduction over
    ``names`` of ``view``, in the group's rank order (row-major over ``names``)."""
    labels, sizes = view
    mine = coordinates(flat_rank, labels, sizes)
    n = math.prod(sizes)
    members = [r for r in range(n)
               if all(c == mine[d] for d, c in coordinates(r, labels, sizes).items() if d not in names)]
    return tuple(members)  # row-major in the view, hence in the order of the reduced dims too
