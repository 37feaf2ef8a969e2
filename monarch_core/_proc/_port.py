"""Ports: where replies and channel messages arrive.

A *port* is an id registered in this process's kernel with a handler.  The
public :class:`Port` is a picklable reference to one (it can be sent to other
actors, which then send to it); :class:`PortReceiver` reads from one.  The
reply collectors used by the adverbs (``call_one``, ``call``, ``stream``) are
port handlers too.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, Protocol, TypeVar

from monarch_core._proc import _portmsg, _serial, _state
from monarch_core._proc._portmsg import decode_batch
from monarch_core._proc._future import Cell, Future
from monarch_core._kernel import _wire as W
from monarch_core._kernel._ports import PortHandler
from monarch_core.errors import ActorError

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel
    from monarch_core._mesh._shape import Extent

R = TypeVar("R")
_S_VALUE = W.S_VALUE
_now = time.perf_counter_ns
_nbytes = _serial.nbytes


def _decode_value(status: int, payload: Any, buffers: list) -> Any:
    obj = _serial.loads(payload, buffers)
    if status == W.S_ERROR:
        raise obj
    return obj


def send_to_port(ref: tuple, rank: int | None, status: int, obj: Any, kernel: Kernel | None = None) -> None:
    """Send ``obj`` (pickled) to the port ``ref = (proc_id, address, port_id)``:
    :func:`send_raw_to_port` with the object's pickle."""
    payload, bufs = _serial.dumps(obj)
    _portmsg.send(kernel or _state.current().kernel, ref, rank, status, payload, bufs)


def send_raw_to_port(ref: tuple, rank: int | None, status: int, payload: Any, bufs: list,
                     kernel: Kernel | None = None, reply_port: int | None = None) -> None:
    """Send ``payload`` and ``bufs`` (already serialized) to the port ``ref``
    through ``kernel`` (None: this process's): :func:`._portmsg.send`, the one
    way a port message is sent (its contract: ``rank``, ``status``,
    ``reply_port``, a malformed ``ref``)."""
    _portmsg.send(kernel or _state.current().kernel, ref, rank, status, payload, bufs, reply_port)


def wrap_exception(e: BaseException, where: str = "") -> ActorError:
    """An :class:`ActorError` carrying ``e`` and its formatted traceback,
    picklable even when ``e`` itself is not.  ``where`` is ``"mesh.endpoint"``
    (or just the mesh's name); the actor, its class, proc and host come from
    the actor this runs in."""
    if isinstance(e, ActorError):
        return e
    tb = "".join(traceback.format_exception(type(e), e, _user_frames(e.__traceback__)))
    ctx = _state.current_actor.get()
    actor = ctx.display_name if ctx is not None else None
    payload_exc: BaseException = e
    try:
        _serial.dumps(e)
    except Exception:
        payload_exc = RuntimeError(f"{type(e).__name__}: {e} (the original exception could not be pickled)")
    msg = f"Actor call {where} failed." if where else "A remote actor call has failed."
    endpoint = where.rsplit(".", 1)[1] if "." in where else None
    proc, host = this_proc_and_host()
    return ActorError(payload_exc, msg, remote_traceback=tb, actor=actor, endpoint=endpoint,
                      actor_class=(ctx.class_name or None) if ctx is not None else None, proc=proc, host=host)


def _user_frames(tb: Any) -> Any:
    """``tb`` without its leading frames of the actor runtime (the frames that
    called the endpoint), so that a remote traceback starts in the user's code."""
    t = tb
    while t is not None and t.tb_next is not None and \
            str(t.tb_frame.f_globals.get("__name__", "")).startswith("monarch_core._actor."):
        t = t.tb_next
    return t


_here: tuple[str | None, str] | None = None


def this_proc_and_host() -> tuple[str | None, str]:
    """This proc's name as the user gave it (``"proc trainers{'gpus': 1/4}"``;
    ``None`` in the client) and the machine's host name, for failure texts."""
    global _here
    here = _here
    if here is None:
        import socket

        rt = _state.current_runtime_or_none()
        proc = rt.name if rt is not None and not rt.is_client else None
        here = (proc, socket.gethostname())
        if rt is not None:
            _here = here
    return here


class Port(Generic[R]):
    """A port that sends messages to a (possibly remote) receiver.

    Picklable: pass it as an endpoint argument and the receiving actor can
    ``send`` to it.  ``rank`` is stamped on each message (for ranked
    receivers); when ``None`` the sender's current message rank is used.
    """

    __slots__ = ("_ref", "_rank", "_once", "_where")

    def __init__(self, port_ref: tuple, instance: Any = None, rank: int | None = None) -> None:
        self._ref = tuple(port_ref)
        self._rank = rank
        self._once = False
        #: ``(mesh name, endpoint)`` for the response port of an
        #: ``explicit_response_port`` endpoint, named in what ``exception`` sends
        self._where: tuple[str, str] | None = None

    def _stamp(self) -> int | None:
        if self._rank is not None:
            return self._rank
        r = _state.current_message_rank.get()
        return r.rank if r is not None else None

    def send(self, obj: R) -> None:
        """Send ``obj`` to the receiver.  Returns at once, unless this process
        already holds a full send window of unacknowledged messages for the
        receiver's proc (``MONARCH_SEND_WINDOW_MB`` / ``_MSGS``): then it first
        waits until the receiver acknowledges enough of them (or dies).  See
        docs/architecture.md, *Flow control*."""
        send_to_port(self._ref, self._stamp(), W.S_VALUE, obj)

    def send_message(self, message: Any) -> None:
        """Alias of :meth:`send` (reference-API compatibility)."""
        self.send(message)

    async def resolve_and_send(self, result: Any) -> None:
        """Await ``result`` if it is awaitable, then send it."""
        import inspect

        if inspect.isawaitable(result):
            result = await result
        self.send(result)

    def exception(self, e: BaseException) -> None:
        """Deliver ``e`` to the receiver, where it is raised (as an
        :class:`~monarch_core.errors.ActorError` carrying ``e``, naming the
        endpoint: the one this port answers for, else the one being handled)."""
        send_to_port(self._ref, self._stamp(), W.S_ERROR, wrap_exception(e, self._endpoint_where()))

    def _endpoint_where(self) -> str:
        w = self._where
        if w is not None:
            return f"{w[0]}.{w[1]}"
        host = _state.current_actor.get()
        cur = host._current_reply if host is not None else None
        return f"{host.name}.{cur[2]}" if cur is not None else (host.name if host is not None else "")

    @property
    def return_undeliverable(self) -> bool:
        return True

    def __reduce__(self) -> Any:
        if self._where is None:
            return (Port, (self._ref, None, self._rank))
        return (_rebuild_port, (self._ref, self._rank, self._where))

    def __repr__(self) -> str:
        return f"Port({self._ref[0]}#{self._ref[2]})"


def _rebuild_port(ref: tuple, rank: int | None, where: tuple[str, str]) -> Port[Any]:
    p: Port[Any] = Port(ref, None, rank)
    p._where = where
    return p


class _DroppingPort(Port[Any]):
    """Used where nobody waits for a reply (broadcast): values are dropped,
    exceptions are raised in the actor (and so fail it)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(("", None, 0))

    def send(self, obj: Any) -> None:
        return None

    def exception(self, e: BaseException) -> None:
        raise e

    def __reduce__(self) -> Any:
        return (_DroppingPort, ())


# ----------------------------------------------------------------- receivers


class QueueHandler(PortHandler):
    """Buffers arriving messages; hands them to waiting cells in order."""

    def __init__(self, once: bool) -> None:
        self._lock = threading.Lock()
        self._items: collections.deque = collections.deque()
        self._waiters: collections.deque[tuple[Cell, bool]] = collections.deque()
        self._once = once
        self.port_id = 0

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        item = (rank, status, payload, buffers)
        with self._lock:
            if self._waiters:
                cell, ranked = self._waiters.popleft()
            else:
                self._items.append(item)
                cell = None
        if cell is not None:
            _resolve(cell, ranked, item)
        if self._once:
            _state.current().kernel.remove_port(self.port_id)

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        with self._lock:
            waiters = list(self._waiters)
            self._waiters.clear()
        for cell, _ranked in waiters:
            cell.set_exception(exc)

    def next(self, ranked: bool) -> Cell:
        cell = Cell()
        with self._lock:
            if self._items:
                item = self._items.popleft()
            else:
                self._waiters.append((cell, ranked))
                return cell
        _resolve(cell, ranked, item)
        return cell


def _resolve(cell: Cell, ranked: bool, item: tuple) -> None:
    rank, status, payload, buffers = item

    def decode() -> Any:
        v = _decode_value(status, payload, buffers)
        if ranked:
            if rank < 0:
                raise ValueError("ranked port receiver got a message without a rank")
            return (rank, v)
        return v

    cell.set_lazy(decode)


class PortReceiver(Generic[R]):
    """Receives the messages sent to the matching :class:`Port`, in order."""

    _ranked = False

    def __init__(self, mailbox: Any, receiver: QueueHandler) -> None:
        self._handler = receiver

    def recv(self) -> Future[R]:
        """A future for the next message (raises what a sender passed to
        ``Port.exception``).

        As in the reference, the future claims a message only when it is
        first observed (``get``, ``result``, ``exception``, ``done``,
        ``await``, ``as_asyncio``): futures receive messages in the order
        they are observed, not created, and one dropped unobserved claims
        nothing.  Once observed it keeps its claim: a ``get(timeout=...)``
        that times out does not consume it, a later ``get`` still receives
        the message it claimed."""
        handler, ranked = self._handler, self._ranked
        return Future._on_observe(lambda: handler.next(ranked))

    def ranked(self) -> RankedPortReceiver[R]:
        """A view of this receiver whose ``recv`` returns ``(rank, value)``."""
        return RankedPortReceiver(None, self._handler)


class RankedPortReceiver(PortReceiver[R]):
    """A receiver whose ``recv()`` resolves to ``(sender_rank, value)``."""

    _ranked = True


# ----------------------------------------------------------------- reply collectors


class CallSite(Protocol):
    """What a reply collector knows about the call it collects for, to name
    it when the call fails (implemented by ``Endpoint``; consulted only on
    failure, never per reply)."""

    def _failure_context(self, adverb: str, ranks: list[int] | None, proc_id: str | None,
                         exc: BaseException) -> str | None:
        """The call, as the caller sees it (``"call_one() of m.ep (actor mesh 'm',
        class C) failed on rank ..."``), or ``None`` when ``exc`` names it already."""


def _decode_reply(status: int, payload: Any, buffers: list, site: Any, adverb: str, rank: int) -> Any:
    """Decode a reply; an error reply is raised with the call's context added."""
    if status != W.S_ERROR or not site:
        return _decode_value(status, payload, buffers)
    try:
        obj = _serial.loads(payload, buffers)
    except BaseException as e:  # noqa: BLE001 - an undecodable error is still the call's error
        obj = e
    raise _in_context(obj, site, adverb, [rank] if rank >= 0 else None, None)


def _in_context(exc: BaseException, site: Any, adverb: str, ranks: list[int] | None,
                proc_id: str | None) -> BaseException:
    """``exc`` as the failure of the call ``site`` describes (``site`` a
    :class:`CallSite`, a plain description, or empty: ``exc`` unchanged)."""
    if not site:
        return exc
    if isinstance(site, str):
        return _annotate(exc, site)
    try:
        context = site._failure_context(adverb, ranks, proc_id, exc)
    except Exception:  # pragma: no cover - a failure text must never hide the failure
        logging.getLogger("monarch.actor").exception("describing a failed call failed")
        return exc
    if not context:
        return exc
    if isinstance(exc, ActorError):
        return ActorError(exc.exception, f"{context}: {exc.message}", remote_traceback=exc.remote_traceback,
                          actor=exc.actor, endpoint=exc.endpoint, actor_class=exc.actor_class, proc=exc.proc,
                          host=exc.host)
    return _annotate(exc, context)


class OneReply(Cell, PortHandler):
    """Collects exactly one reply: it is the call's cell (``call_one``,
    ``choose``; one object per call rather than two).

    ``describe`` names the call in its failures: a :class:`CallSite` (with
    ``index``, the rank called, and ``adverb``) or a plain text.  ``stat``
    (an endpoint stat, from the runtime's instrumentation): the call is counted there
    when its reply or failure arrives -- latency from construction, ``req``
    request bytes, the reply's bytes, the error's type.  (Built in rather than
    a subclass: it is the per-call path of ``call_one`` with metrics on.)"""

    __slots__ = ("port_id", "proc_id", "kernel", "describe", "index", "adverb", "stat", "req", "t0")

    def __init__(self, kernel: Kernel, describe: Any, adverb: str = "call_one", index: int = -1,
                 stat: Any = None, req: int = 0) -> None:
        Cell.__init__(self)
        self.kernel = kernel
        self.port_id = kernel.add_port(self)
        self.proc_id = ""
        self.describe = describe
        self.adverb = adverb
        self.index = index
        self.stat = stat
        if stat is not None:
            self.req = req
            self.t0 = _now()

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        stat = self.stat
        if stat is not None:
            dt = _now() - self.t0
            rep = len(payload) if not buffers else _nbytes(payload, buffers)
            stat.record(dt, self.req, rep, None if status == _S_VALUE else stat.error_type(payload))
        self.kernel.remove_port(self.port_id)
        self._forget()
        if status == _S_VALUE:
            self.set_lazy(_decode_value, (status, payload, buffers))
        else:
            self.set_lazy(_decode_reply, (status, payload, buffers, self.describe, self.adverb, self.index))

    @property
    def cell(self) -> Cell:
        """The call's cell: this object."""
        return self

    def _forget(self) -> None:
        pid = self.proc_id
        if type(pid) is str:
            self.kernel.reply_done(pid, self.port_id)
        else:  # a call through a cast tree waits on every proc on the way
            for p in pid:
                self.kernel.reply_done(p, self.port_id)

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        if self.stat is not None:
            self.stat.record(_now() - self.t0, self.req, 0, type(exc).__name__)
        self.kernel.remove_port(self.port_id)
        if type(self.proc_id) is not str:
            self._forget()
        self.set_exception(_in_context(exc, self.describe, self.adverb, [self.index], proc_id))


class RankProcs:
    """The proc that answers for each rank of a cast sent straight to its
    members (``procs[rank]``), and how many of each proc's ranks have not
    answered yet: a proc that answered for all its ranks and then ended (a
    stop, right after its last reply) does not fail the call, whose other
    ranks may still be on their way.  Used under its port's lock."""

    __slots__ = ("procs", "owed")

    def __init__(self, procs: list[str]) -> None:
        self.procs = procs
        owed: dict[str, int] = {}
        for p in procs:
            owed[p] = owed.get(p, 0) + 1
        self.owed = owed

    def answered(self, rank: int) -> str | None:
        """Rank ``rank`` answered: its proc, if that proc owes nothing more."""
        if not 0 <= rank < len(self.procs):
            return None
        p = self.procs[rank]
        left = self.owed[p] - 1
        if left < 0:
            return None
        self.owed[p] = left
        return p if left == 0 else None

    def settled(self, proc_id: str | None) -> bool:
        """Whether ``proc_id`` answered for every rank it had."""
        return proc_id is not None and self.owed.get(proc_id) == 0

    @staticmethod
    def of(procs: list[str], n: int) -> RankProcs | None:
        """The ranks' procs of a port expecting ``n`` replies (None: not one per rank)."""
        return RankProcs(procs) if len(procs) == n else None

    @staticmethod
    def concerns(ranks: RankProcs | None, lock: threading.Lock, proc_id: str | None) -> bool:
        """Whether the end of ``proc_id`` fails a port whose ranks' procs are
        ``ranks`` (guarded by ``lock``): it still owes a reply, or that is not known."""
        if ranks is None:
            return True
        with lock:
            return not ranks.settled(proc_id)


class GatherReplies(PortHandler):
    """Collects one reply per rank of a cast into a ``ValueMesh`` (``call``,
    ``initialized``).  The first error fails the whole future, named as a
    failure of the call ``describe`` (a :class:`CallSite` or a plain text);
    the end of a proc that had answered for all its ranks is not one, when
    the ranks' procs are known (:meth:`by_rank`)."""

    def __init__(self, kernel: Kernel, extent: Extent, describe: Any, build: Callable[[Extent, list], Any],
                 adverb: str = "call") -> None:
        self.cell = Cell()
        self.kernel = kernel
        self.extent = extent
        self.n = extent.nelements
        self.results: list = [None] * self.n
        self.count = 0
        self.lock = threading.Lock()
        self.describe = describe
        self.adverb = adverb
        self.build = build
        self.port_id = kernel.add_port(self)
        self.procs: list[str] = []
        self.ranks: RankProcs | None = None

    def by_rank(self, procs: list[str]) -> None:
        """``procs[rank]`` answers for ``rank`` (a cast straight to the
        members, told before it is sent): a proc that answered for all its
        ranks is no longer waited on, and its end fails nothing."""
        self.ranks = RankProcs.of(procs, self.n)

    def concerns(self, proc_id: str | None) -> bool:
        """Whether the end of ``proc_id`` fails this call (``RankProcs.concerns``)."""
        return RankProcs.concerns(self.ranks, self.lock, proc_id)

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        if status == W.S_BATCH:  # replies gathered by a cast tree
            for item in decode_batch("a cast-tree forwarder", payload, buffers):
                if item[1] == W.S_BATCH:
                    continue  # batches do not nest
                self.deliver(*item)
            return
        if status != W.S_VALUE:
            self._finish_error(status, payload, buffers, rank)
            return
        with self.lock:
            if not 0 <= rank < self.n or self.results[rank] is not None:
                return
            self.results[rank] = (payload, buffers)
            self.count += 1
            done = self.count == self.n
            ranks = self.ranks
            settled = ranks.answered(rank) if ranks is not None and not done else None
        if settled is not None:
            self.kernel.reply_done(settled, self.port_id)
        if done:
            self._done()
            results, extent, build = self.results, self.extent, self.build
            self.cell.set_lazy(lambda: build(extent, [_serial.loads(p, b) for p, b in results]))

    def _done(self) -> None:
        self.kernel.remove_port(self.port_id)
        for p in self.procs:
            self.kernel.reply_done(p, self.port_id)

    def _finish_error(self, status: int, payload: Any, buffers: list, rank: int = -1) -> None:
        self._done()
        describe, adverb = self.describe, self.adverb
        self.cell.set_lazy(_decode_reply, (status, payload, buffers, describe, adverb, rank))

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        if not self.concerns(proc_id):  # it answered for all its ranks before it ended
            return
        self._done()
        self.cell.set_exception(_in_context(exc, self.describe, self.adverb, None, proc_id))


class StreamReplies(PortHandler):
    """Hands replies out in arrival order, one cell each (``stream``);
    failures are named as failures of the call ``describe``; the end of a
    proc that had answered for all its ranks is not one, when the ranks'
    procs are known (:meth:`by_rank`)."""

    def __init__(self, kernel: Kernel, n: int, describe: Any, adverb: str = "stream") -> None:
        self.kernel = kernel
        self.n = n
        self.describe = describe
        self.adverb = adverb
        self.cells = [Cell() for _ in range(n)]
        self.next = 0
        self.lock = threading.Lock()
        self.port_id = kernel.add_port(self)
        self.procs: list[str] = []
        self.ranks: RankProcs | None = None

    def by_rank(self, procs: list[str]) -> None:
        """``procs[rank]`` answers for ``rank`` (as ``GatherReplies.by_rank``)."""
        self.ranks = RankProcs.of(procs, self.n)

    def concerns(self, proc_id: str | None) -> bool:
        """Whether the end of ``proc_id`` fails the replies still to come (``RankProcs.concerns``)."""
        return RankProcs.concerns(self.ranks, self.lock, proc_id)

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        with self.lock:
            if self.next >= self.n:
                return
            cell = self.cells[self.next]
            self.next += 1
            last = self.next == self.n
            ranks = self.ranks
            settled = ranks.answered(rank) if ranks is not None and not last else None
        if settled is not None:
            self.kernel.reply_done(settled, self.port_id)
        if last:
            self.kernel.remove_port(self.port_id)
            for p in self.procs:
                self.kernel.reply_done(p, self.port_id)
        if status == _S_VALUE:
            cell.set_lazy(_decode_value, (status, payload, buffers))
        else:
            describe, adverb = self.describe, self.adverb
            cell.set_lazy(_decode_reply, (status, payload, buffers, describe, adverb, rank))

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        if not self.concerns(proc_id):  # it answered for all its ranks before it ended
            return
        exc = _in_context(exc, self.describe, self.adverb, None, proc_id)
        with self.lock:
            rest = self.cells[self.next :]
            self.next = self.n
        for c in rest:
            c.set_exception(exc)
        self.kernel.remove_port(self.port_id)


def _annotate(exc: BaseException, describe: str) -> BaseException:
    """``exc``, of the same type, with ``describe`` before its text (``exc`` itself
    if that cannot be built, or if it says so already)."""
    if describe and isinstance(exc, Exception) and describe not in str(exc):
        try:
            new = type(exc)(f"{describe}: {exc}")
        except Exception:
            return exc
        try:
            new.__dict__.update(vars(exc))  # e.g. ConnectError.refused
        except TypeError:  # pragma: no cover - no instance dict
            pass
        return new
    return exc


class ReturnPort(PortHandler):
    """Where undeliverable messages come back: hands the error to
    ``target.undeliverable(exc)`` (an actor, or the proc agent for messages
    sent outside any actor)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def deliver(self, rank: int, status: int, payload: Any, buffers: list) -> None:
        try:
            exc = _serial.loads(payload, buffers)
        except Exception as e:  # noqa: BLE001 - an undecodable error is still an error
            exc = e
        self.target.undeliverable(exc)

    def fail(self, exc: BaseException, proc_id: str | None = None) -> None:
        self.target.undeliverable(exc)


class StreamIterator(Generic[R]):
    """What ``Endpoint.stream`` returns: iterate for futures in arrival order
    (``for f in ep.stream(): f.get()``), or ``async for`` for values."""

    def __init__(self, handler: StreamReplies) -> None:
        self._h = handler
        self._i = 0

    def __iter__(self) -> Iterator[Future[R]]:
        return self

    def __next__(self) -> Future[R]:
        if self._i >= self._h.n:
            raise StopIteration
        c = self._h.cells[self._i]
        self._i += 1
        return Future._of(c)

    def __len__(self) -> int:
        return self._h.n - self._i

    def __aiter__(self) -> StreamIterator[R]:
        return self

    async def __anext__(self) -> R:
        try:
            f = next(self)
        except StopIteration:
            raise StopAsyncIteration from None
        return await f
