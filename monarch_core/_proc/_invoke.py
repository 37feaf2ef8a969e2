"""The invoker: one endpoint message from its header to its reply.

:class:`Invoker` is the part of an actor's runtime (``_host.ActorHost`` holds
one) that runs endpoint messages, on the actor's loop, one at a time: it reads
the header (the fields of :class:`ActorHeader`), looks the endpoint up, runs it --
sync, async (the awaiting half is awaited by the mailbox before the next
message) or concurrent (a task beside the queue) -- records the run with the
runtime's instrumentation (one :class:`Timing` record per instrumented call) and
sends the result or the error to the caller.  What it needs of its actor is
:class:`InvokerHost`.

Also here: :func:`loopless` (sync code of an actor sees no asyncio loop) and
the reference's refusal of ``async`` methods of synchronous actors.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
import weakref
from typing import Any, Awaitable, Callable, Coroutine, NamedTuple, Optional, Protocol

from monarch_core._proc import _lifecycle, _output, _serial, _state, _tree
from monarch_core._proc._instrumentation import Instrumentation
from monarch_core._proc._port import _DroppingPort, Port, send_raw_to_port, send_to_port, wrap_exception
from monarch_core._kernel import _wire as W
from monarch_core._mesh._shape import Extent, Point

logger = logging.getLogger("monarch.actor")

_now = time.perf_counter_ns
_nbytes = _serial.nbytes
_loads = _serial.loads
_make = tuple.__new__  # ``_make(Record, items)``: a NamedTuple without its Python-level ``__new__``
_message_rank = _state.current_message_rank
_get_running_loop = asyncio._get_running_loop
_set_running_loop = asyncio._set_running_loop


class ActorHeader(NamedTuple):
    """The layout of an endpoint message's header (built by the sender:
    ``_proc._send``, ``_actor._actor_mesh``; its shape checked by
    ``ActorHost.enqueue``).  Headers travel as plain tuples of these nine
    fields, a traced call's context as a tenth item (bytes; read by the
    instrumentation's ``server_span``); :meth:`Invoker.run_message` names them once,
    by unpacking, instead of making this object per message (about 0.1 µs of
    CPU a call).  ``ActorHeader._make(h[:9])`` names them off the per-call path."""

    key: str  #: the actor mesh's key (the kernel routes by it)
    method: str  #: the endpoint's name
    reply: Any  #: the caller's reply port reference ``(proc, address, port)`` (a list or tuple), or None
    rank: Any  #: the recipient's rank in the message's extent (an int, or coordinates)
    labels: tuple  #: the message's extent: its dimension names ...
    sizes: tuple  #: ... and sizes
    sender: str  #: the sending proc
    ret: Any  #: where undeliverable messages go back (the sender's return port), or None
    explicit: Any  #: truthy: the endpoint gets the reply port as its first argument


class Timing(NamedTuple):
    """One instrumented run of an endpoint, as the instrumentation records it."""

    stat: Any  #: the endpoint's server-side stat (``instrumentation.server_stat``: its ``record``)
    t0: int  #: when the run started (``perf_counter_ns``)
    req: int  #: the request's bytes
    span: Optional[tuple]  #: the run's span (``instrumentation.server_span``), or None when not traced


class InvokerHost(Protocol):
    """What the invoker reads and calls of its actor (``_host.ActorHost``)."""

    key: str
    name: str
    instance: Any
    init_error: BaseException | None
    failure: BaseException | None
    stopped: bool

    def request_stop(self, reason: str, reply: tuple | None) -> None: ...

    def _refuse_msg(self, h: tuple) -> None: ...

    def _die(self, exc: BaseException, why: str, current: tuple | None = None, category: str = "user",
             chain: list[dict] | None = None, where: str | None = None) -> None: ...


class Invoker:
    """Runs the endpoint messages of one actor (on its loop).

    ``current`` is ``(reply port, rank, endpoint)`` of the message being
    handled (None between messages): a failure refuses that call, a stop that
    gives up on the thread names it.  ``spawn(coro)`` starts a task the actor
    tracks (a concurrent endpoint's body; a stop cancels it)."""

    def __init__(self, host: InvokerHost, instrumentation: Instrumentation,
                 spawn: Callable[[Coroutine[Any, Any, None]], Any]) -> None:
        self.host = host
        self.instrumentation = instrumentation  # the runtime's (``_instrumentation``): stats, spans
        self.spawn = spawn
        self.current: tuple | None = None
        self.stats: dict[str, Any] = {}  # endpoint name -> its server-side stat (False: not instrumented)
        self._methods: dict[str, tuple] = {}  # endpoint name -> (class, property or None, function)
        self._extents: dict[tuple, Extent] = {}
        self._span_var = instrumentation.current_span

    def known_extent(self, extent: Extent) -> None:
        """Reuse ``extent`` for messages of that shape (the actor's own mesh's)."""
        self._extents[(extent.labels, extent.sizes)] = extent

    # ------------------------------------------------------------ one message

    def run_message(self, h: tuple, payload: Any, buffers: list) -> Optional[Awaitable[Any]]:
        """Handle one endpoint message (``h``: its header, an :class:`ActorHeader`'s
        fields) as far as it goes without awaiting (on the actor's loop).
        Returns None when done, else an awaitable the caller must await
        before the next message."""
        _key, method, reply, rank, labels, sizes, _sender, _ret, explicit = h[:9]  # (``ActorHeader``, in order)
        reply_ref = tuple(reply) if reply is not None else None
        if method == _tree.STOP_METHOD:  # a stop that came through a cast tree, in order
            self.host.request_stop(str(_loads(payload, buffers)), reply_ref)
            return None
        # Taken before the check: a stop that completes without this thread
        # (``stop_if_idle``) sets ``stopped`` and then reads ``current``.
        self.current = (reply_ref, rank, method)
        host = self.host
        if host.init_error is not None or host.failure is not None or host.stopped:
            self.current = None
            host._refuse_msg(h)
            return None
        point = self._point(rank, labels, sizes)
        token = _message_rank.set(point)
        stat = self.stats.get(method)
        if stat is None:
            stat = self._stat_for(method)
        if stat:
            t0 = _now()
            sp = self.instrumentation.server_span(h)
            req = len(payload) if not buffers else _nbytes(payload, buffers)
            tm: Timing | None = _make(Timing, (stat, t0, req, sp))
            span_token = self._span_var.set(sp) if sp is not None else None
        else:
            tm = span_token = None
        rest = None
        try:
            rest = self._call(method, reply_ref, rank, bool(explicit), point, payload, buffers, tm)
        finally:
            if span_token is not None:
                self._span_var.reset(span_token)
            if rest is None:
                self.current = None
            _message_rank.reset(token)
        return rest

    def _point(self, rank: Any, labels: tuple, sizes: tuple) -> Point:
        k = (labels, sizes)
        extent = self._extents.get(k)
        if extent is None:
            extent = self._extents[k] = Extent(labels, sizes)
        if type(rank) is int and 0 <= rank < extent.nelements:
            return Point._make(rank, extent)
        return Point(rank, extent)

    def _call(self, method: str, reply_ref: tuple | None, rank: int, explicit: bool, point: Point, payload: Any,
              buffers: list, tm: Timing | None) -> Optional[Awaitable[Any]]:
        """Unpickle the arguments, run the endpoint; a sync one's result or
        error goes to the caller here, an async one's in :meth:`_finish`."""
        try:
            args, kwargs = _loads(payload, buffers)
            instance = self.host.instance
            found = self._methods.get(method)
            if found is None or found[0] is not type(instance):  # (the cache hit of ``_lookup``, inlined)
                found = self._lookup(method)
            _cls, prop, func = found
            if prop is not None:
                explicit = prop._explicit_response_port
                if prop._concurrent:
                    return self._start_concurrent(func, args, kwargs, method, reply_ref, rank, explicit, tm)
            if explicit:
                args = (self._port(reply_ref, rank, method), *args)
            result = func(instance, *args, **kwargs)
            if result is not None and inspect.isawaitable(result):
                return self._finish(result, point, reply_ref, rank, method, explicit, tm)
            done, tm = tm, None  # (recorded once: an error of the reply itself is not the endpoint's)
            if reply_ref is not None and not explicit:  # (``_done``, inlined: the per-call path)
                self._reply_value(reply_ref, rank, result, method, done)
            elif done is not None:
                self._record(done, 0, None, method)
        except Exception as e:
            self._raised_here(e, tm, reply_ref, rank, method, explicit)
        except BaseException as e:
            self._died_here(e, tm, method, f"{self._where(method)} raised {type(e).__name__}")
        return None

    async def _finish(self, result: Awaitable[Any], point: Point, reply_ref: tuple | None, rank: int, method: str,
                      explicit: bool, tm: Timing | None) -> None:
        """The awaiting half of :meth:`run_message`."""
        token = _message_rank.set(point)
        span_token = self._span_var.set(tm.span) if tm is not None and tm.span is not None else None
        try:
            result = await result
            done, tm = tm, None  # (recorded once)
            self._done(result, reply_ref if not explicit else None, rank, method, done)
        except Exception as e:
            self._raised_here(e, tm, reply_ref, rank, method, explicit)
        except BaseException as e:
            self._died_here(e, tm, method, f"{self._where(method)} raised {type(e).__name__}")
        finally:
            if span_token is not None:
                self._span_var.reset(span_token)
            self.current = None
            _message_rank.reset(token)

    def _start_concurrent(self, func: Any, args: tuple, kwargs: dict, method: str, reply_ref: tuple | None,
                          rank: int, explicit: bool, tm: Timing | None) -> Awaitable[None]:
        """Run a concurrent endpoint's body as a task.  Without an explicit port
        its return value (or exception) goes to the caller; an exception that
        is not forwarded anywhere fails the actor.  Returns what the mailbox
        awaits before the next message (the body starts first)."""
        if explicit:
            args = (self._port(reply_ref, rank, method), *args)
            reply_ref = None
        self.spawn(self._concurrent_body(_message_rank.get(), self.current, func, args, kwargs, method, reply_ref,
                                         rank, tm))
        return asyncio.sleep(0)

    def _port(self, reply_ref: tuple | None, rank: int, method: str) -> Port[Any]:
        """The reply port an explicit-response-port endpoint gets as its first argument."""
        port: Port[Any] = Port(reply_ref, None, rank) if reply_ref is not None else _DroppingPort()
        port._where = (self.host.name, method)  # named by port.exception(e)
        return port

    async def _concurrent_body(self, msg_rank: Any, current: tuple | None, func: Any, args: tuple, kwargs: dict,
                               method: str, reply_ref: tuple | None, rank: int, tm: Timing | None) -> None:
        _message_rank.set(msg_rank)
        try:
            result = await func(self.host.instance, *args, **kwargs)
            done, tm = tm, None  # (recorded once, here)
            self._done(result, reply_ref, rank, method, done)
        except asyncio.CancelledError:
            if tm is not None:
                self._record(tm, 0, "CancelledError", method)
            raise
        except Exception as e:
            if tm is not None:
                self._record(tm, 0, type(e).__name__, method)
            _lifecycle.endpoint_raised(e)
            where = self._where(method)
            if reply_ref is not None:
                send_to_port(reply_ref, rank, W.S_ERROR, wrap_exception(e, where))
            else:
                self.host._die(e, f"concurrent endpoint {where} raised without forwarding it to its port", current,
                               where=where)
        except BaseException as e:
            self._died_here(e, tm, method, f"concurrent endpoint {self._where(method)} raised {type(e).__name__}",
                            current)

    # ------------------------------------------------------------ outcomes

    def _done(self, result: Any, reply_ref: tuple | None, rank: int, method: str, tm: Timing | None) -> None:
        """The endpoint returned ``result``: to the caller (``reply_ref``; None:
        nobody waits for it), the run recorded first."""
        if reply_ref is not None:
            self._reply_value(reply_ref, rank, result, method, tm)
        elif tm is not None:
            self._record(tm, 0, None, method)

    def _raised_here(self, e: Exception, tm: Timing | None, reply_ref: tuple | None, rank: int, method: str,
                     explicit: bool) -> None:
        if tm is not None:
            self._record(tm, 0, type(e).__name__, method)
        self._raised(e, reply_ref, rank, self._where(method), explicit)

    def _died_here(self, e: BaseException, tm: Timing | None, method: str, why: str,
                   current: tuple | None = None) -> None:
        if tm is not None:
            self._record(tm, 0, type(e).__name__, method)
        self.host._die(e, why, current, where=self._where(method))

    def _raised(self, e: Exception, reply_ref: tuple | None, rank: int, where: str, explicit: bool) -> None:
        _lifecycle.endpoint_raised(e)  # a debugger may stop here (post-mortem: docs/debugging.md)
        if reply_ref is not None and not explicit:
            logger.debug("endpoint %s raised %r", where, e)
            _output.capture.before_reply()
            send_to_port(reply_ref, rank, W.S_ERROR, wrap_exception(e, where))
        else:
            why = "explicit-response-port endpoint" if explicit else "broadcast (no caller to report to)"
            self.host._die(e, f"{where} raised in a {why}", where=where)

    def _reply_value(self, reply_ref: tuple, rank: int, result: Any, method: str, tm: Timing | None) -> None:
        """Send ``result`` to the caller; the run (``tm``) is recorded first --
        as failed with ``TypeError`` if the result cannot be pickled -- so that
        it is counted before the caller hears."""
        try:
            rp, rb = _serial.dumps(result)
        except Exception as e:
            if tm is not None:
                self._record(tm, 0, "TypeError", method)
            where = self._where(method)
            # never raised: the caller gets this one error, without the pickler's frames and ours
            self._raised(TypeError(
                f"{where} returned a {type(result).__qualname__}, which cannot be sent back to the caller: {e}. "
                "Return plain data (numbers, strings, lists, dicts, tensors, picklable objects) instead; keep what "
                "cannot be pickled (locks, sockets, open files) in the actor"), reply_ref, rank, where, False)
            return
        if tm is not None:  # (``_record``, inlined: the per-call path with metrics on)
            stat, t0, req, sp = tm
            dt = _now() - t0
            stat.record(dt, req, len(rp) if not rb else _nbytes(rp, rb))
            if sp is not None:
                self.instrumentation.end_server_span(sp, self.host, method, t0, dt, None)
        if _output.capture._queue:  # what the endpoint printed reaches the client before its reply
            _output.capture.before_reply()
        send_raw_to_port(reply_ref, rank, W.S_VALUE, rp, rb)

    def _record(self, tm: Timing, rep: int, err: str | None, method: str) -> None:
        """Record one run of ``method`` (``rep``: its reply's bytes; ``err``: the exception type's name)."""
        t0 = tm.t0
        dt = _now() - t0
        tm.stat.record(dt, tm.req, rep, err)
        sp = tm.span
        if sp is not None:
            self.instrumentation.end_server_span(sp, self.host, method, t0, dt, err)

    # ------------------------------------------------------------ endpoints

    def _stat_for(self, method: str) -> Any:
        try:
            _cls, prop, _func = self._lookup(method)
        except AttributeError:
            prop = None
        stat = self.stats[method] = self.instrumentation.server_stat(self.host, method, prop)
        return stat

    def _where(self, method: str) -> str:
        """``mesh.method``, for messages about an endpoint (built only when one is needed)."""
        return f"{self.host.name}.{method}"

    def _lookup(self, name: str) -> tuple[type, Any, Any]:
        """``(class, endpoint property or None, function)`` of endpoint ``name``
        of the actor's class (cached per name while the class stays the same)."""
        cls = type(self.host.instance)
        found = self._methods.get(name)
        if found is not None and found[0] is cls:
            return found
        for klass in cls.__mro__:
            attr = klass.__dict__.get(name)
            if attr is None:
                continue
            if getattr(type(attr), "__monarch_endpoint__", False):  # an @endpoint (``_actor._endpoint``)
                found = self._methods[name] = (cls, attr, loopless(attr._method))
                return found
            if callable(attr):
                if inspect.iscoroutinefunction(attr) and not has_async_endpoint(cls):
                    func = _refused_async(cls, name)
                else:
                    func = loopless(attr)
                found = self._methods[name] = (cls, None, func)
                return found
            break
        raise AttributeError(f"{cls.__qualname__} has no endpoint {name!r}")


#: class -> whether it is an asynchronous actor (``has_async_endpoint``), while the class lives
_ASYNC_CLASSES: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def has_async_endpoint(cls: type) -> bool:
    """Whether ``cls`` is an asynchronous actor in the reference's sense: one
    of its endpoints is ``async def`` (found once per class)."""
    known = _ASYNC_CLASSES.get(cls)
    if known is not None:
        return known
    found = any(getattr(type(attr), "__monarch_endpoint__", False) and inspect.iscoroutinefunction(attr._method)
                for klass in cls.__mro__ for attr in list(klass.__dict__.values()))
    _ASYNC_CLASSES[cls] = found
    return found


def _refused_async(cls: type, name: str) -> Any:
    """What ``as_endpoint`` of an ``async`` method of a synchronous actor runs:
    the reference refuses it at call time (the caller gets an ``ActorError``;
    the actor goes on)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"as_endpoint({cls.__qualname__}.{name}): {name} is async, and {cls.__qualname__} is a synchronous "
            f"actor (none of its endpoints is async), which torchmonarch refuses; make one of its endpoints "
            f"`async def`, or {name} synchronous")

    return refuse


def loopless(func: Any) -> Any:
    """``func`` itself if it is ``async def``; else a wrapper that runs it with
    no asyncio loop visible, as in the reference: ``asyncio.get_running_loop()``
    raises inside it, and it may run a loop of its own (``asyncio.run``) or
    block in ``Future.get()``.  The running loop (the actor's, once it has
    one) is hidden only for the call: an awaitable it returns is awaited on
    the actor's loop as usual.  With no loop running (an actor that has none
    yet) the wrapper calls ``func`` and nothing else."""
    if inspect.iscoroutinefunction(func):
        return func

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> Any:
        running = _get_running_loop()
        if running is None:
            return func(*args, **kwargs)
        _set_running_loop(None)
        try:
            return func(*args, **kwargs)
        finally:
            _set_running_loop(running)

    return run
