"""How an actor runs its endpoints: one message from its header to its reply.

:class:`EndpointCalls` is the half of :class:`~._host.ActorHost` that handles
an endpoint message on the actor's loop -- look the endpoint up, run it (sync,
async or ``@concurrent_endpoint``), record its metrics and span, send the
result or the error to the caller -- and the refusals of messages the actor
will not handle.  The lifecycle half (thread, construction, stop, failure,
supervision) is in ``_host``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from typing import Any

from monarch_core._proc import _lifecycle, _serial, _state, _tree
from monarch_core._proc._port import (
    _DroppingPort,
    Port,
    send_raw_to_port,
    send_to_port,
    this_proc_and_host,
    wrap_exception,
)
from monarch_core._kernel import _wire as W
from monarch_core._mesh._shape import Extent, Point
from monarch_core.errors import SupervisionError

logger = logging.getLogger("monarch.actor")

_now = time.perf_counter_ns
_nbytes = _serial.nbytes
_get_running_loop = asyncio._get_running_loop
_set_running_loop = asyncio._set_running_loop


class EndpointCalls:
    """Endpoint invocation, mixed into ``ActorHost`` (whose state it uses:
    ``instance``, ``loop``, ``name``, ``_methods``, ``_stats``, ``_die`` ...)."""

    def _extent(self, labels: tuple, sizes: tuple) -> Extent:
        k = (labels, sizes)
        e = self._extents.get(k)
        if e is None:
            e = self._extents[k] = Extent(labels, sizes)
        return e

    def _refuse_msg(self, h: tuple) -> None:
        """Answer a message this actor will not handle (failed or stopped)."""
        self.agent._reply_error(h, self._refusal(h[1]))

    def _refuse(self, reply: tuple | None, rank: int, method: str) -> None:
        if reply is None:
            return
        send_to_port(tuple(reply), rank, W.S_ERROR, self._refusal(method))

    def _refusal(self, method: str, started: bool = False) -> BaseException:
        """The error for a message this actor will not handle (``started``:
        one it began handling and will never finish)."""
        if self.init_error is not None:
            exc: BaseException = self.init_error
        elif self.failure is not None:
            proc, host = this_proc_and_host()
            on = f", on {proc}" if proc else ""
            if "on host " not in on:
                on += f" on host {host}"
            chain = ""
            if self._chain:  # a cascade: where it started, and how it came up to this actor
                from monarch_core._proc import _supervision as S

                chain = "\n" + S.cascade(self._chain)
            exc = SupervisionError(
                f"actor {self.display_name} ({self.class_name}{on}) and its descendants failed; "
                f"{method} was not completed. Cause: {self.failure}{chain}"
            )
        else:
            reason = f" ({self._stop_reason})" if self._stop_reason else ""
            outcome = "did not complete" if started else "was not run"
            exc = SupervisionError(f"actor {self.describe()} was stopped{reason}; {method} {outcome}")
        return exc

    def _run_message(self, h: tuple, payload: Any, buffers: list) -> Any:
        """Handle one endpoint message as far as it goes without awaiting
        (on the actor's loop).  Returns None when done, else an awaitable the
        caller must await before the next message."""
        method_name, reply, rank, labels, sizes, explicit_flag = h[1], h[2], h[3], h[4], h[5], h[8]
        if method_name == _tree.STOP_METHOD:  # a stop that came through a cast tree, in order
            self.request_stop(str(_serial.loads(payload, buffers)), tuple(reply) if reply is not None else None)
            return None
        if self.init_error is not None or self.failure is not None or self.stopped:
            self._refuse_msg(h)
            return None
        reply_ref = tuple(reply) if reply is not None else None
        extent = self._extent(labels, sizes)
        point = Point._make(rank, extent) if type(rank) is int and 0 <= rank < extent.nelements else Point(rank, extent)
        token = _state.current_message_rank.set(point)
        explicit = bool(explicit_flag)
        self._current_reply = (reply_ref, rank, method_name)
        # the observer's: the endpoint's stat, its span when the call is traced
        stat = self._stats.get(method_name)
        if stat is None:
            stat = self._stat_for(method_name)
        t0 = _now() if stat else 0
        sp = self.observer.server_span(h) if stat else None
        span_token = self.observer.current_span.set(sp) if sp is not None else None  # (its [0], [1]: trace, span id)
        rest: Any = None
        try:
            args, kwargs = _serial.loads(payload, buffers)
            prop, func = self._lookup(method_name)
            if prop is not None:
                explicit = prop._explicit_response_port
            if explicit:
                port: Port[Any] = Port(reply_ref, None, rank) if reply_ref is not None else _DroppingPort()
                port._where = (self.name, method_name)  # named by port.exception(e)
                args = (port, *args)
            if prop is not None and prop._concurrent:
                self._start_concurrent(func, args, kwargs, method_name, None if explicit else reply_ref, rank,
                                       (stat, t0, _nbytes(payload, buffers) if stat else 0, sp))
                sp = None  # the body's task ends it
                rest = asyncio.sleep(0)  # let the body start before the next message
                return rest
            result = func(self.instance, *args, **kwargs)
            if result is not None and inspect.isawaitable(result):
                rest = self._finish(result, point, reply_ref, rank, method_name, explicit,
                                    (stat, t0, _nbytes(payload, buffers) if stat else 0, sp))
                sp = None  # ``_finish`` ends it
                return rest
            if stat:  # recorded before the reply leaves: a caller that then reads the metrics finds the call
                tm = (stat, t0, len(payload) if not buffers else _nbytes(payload, buffers), sp)
                stat = False  # (recorded once, below)
            else:
                tm = None
            if reply_ref is not None and not explicit:
                self._reply_value(reply_ref, rank, result, method_name, tm)
            elif tm is not None:
                self._record(tm, 0, None, method_name)
        except Exception as e:
            if stat:
                self._record_error(stat, sp, t0, payload, buffers, method_name, e)
            self._raised(e, reply_ref, rank, self._where(method_name), explicit)
        except BaseException as e:
            if stat:
                self._record_error(stat, sp, t0, payload, buffers, method_name, e)
            self._die(e, f"{self._where(method_name)} raised {type(e).__name__}", where=self._where(method_name))
        finally:
            if span_token is not None:
                self.observer.current_span.reset(span_token)
            if rest is None:
                self._current_reply = None
            _state.current_message_rank.reset(token)
        return None

    def _record_error(self, stat: Any, sp: Any, t0: int, payload: Any, buffers: list, method: str,
                      e: BaseException) -> None:
        self._record((stat, t0, _nbytes(payload, buffers), sp), 0, type(e).__name__, method)

    def _record(self, tm: tuple, rep: int, err: str | None, method: str) -> None:
        """Record one invocation of ``method``: ``tm`` is (stat, start, request bytes, span)."""
        stat, t0, req, sp = tm
        dt = _now() - t0
        stat.record(dt, req, rep, err)
        if sp is not None:
            self.observer.end_server_span(sp, self, method, t0, dt, err)

    def _stat_for(self, method: str) -> Any:
        try:
            prop, _func = self._lookup(method)
        except AttributeError:
            prop = None
        stat = self._stats[method] = self.observer.server_stat(self, method, prop)
        return stat

    def _where(self, method: str) -> str:
        """``mesh.method``, for messages about an endpoint (built only when one is needed)."""
        return f"{self.name}.{method}"

    async def _finish(self, result: Any, point: Point, reply_ref: tuple | None, rank: int, method: str,
                      explicit: bool, tm: tuple = (False, 0, 0, None)) -> None:
        """The awaiting half of :meth:`_run_message` (``tm``: its stat, start
        time, request bytes and span)."""
        token = _state.current_message_rank.set(point)
        stat, t0, req, sp = tm
        span_token = self.observer.current_span.set(sp) if sp is not None else None
        try:
            result = await result
            rec = (stat, t0, req, sp) if stat else None
            stat = False  # (recorded once, below)
            if reply_ref is not None and not explicit:
                self._reply_value(reply_ref, rank, result, method, rec)
            elif rec is not None:
                self._record(rec, 0, None, method)
        except Exception as e:
            if stat:
                self._record((stat, t0, req, sp), 0, type(e).__name__, method)
            self._raised(e, reply_ref, rank, self._where(method), explicit)
        except BaseException as e:
            if stat:
                self._record((stat, t0, req, sp), 0, type(e).__name__, method)
            self._die(e, f"{self._where(method)} raised {type(e).__name__}", where=self._where(method))
        finally:
            if span_token is not None:
                self.observer.current_span.reset(span_token)
            self._current_reply = None
            _state.current_message_rank.reset(token)

    def _raised(self, e: Exception, reply_ref: tuple | None, rank: int, where: str, explicit: bool) -> None:
        _lifecycle.endpoint_raised(e)  # a debugger may stop here (post-mortem: docs/debugging.md)
        if reply_ref is not None and not explicit:
            logger.debug("endpoint %s raised %r", where, e)
            send_to_port(reply_ref, rank, W.S_ERROR, wrap_exception(e, where))
        else:
            why = "explicit-response-port endpoint" if explicit else "broadcast (no caller to report to)"
            self._die(e, f"{where} raised in a {why}", where=where)

    def _reply_value(self, reply_ref: tuple, rank: int, result: Any, method: str, tm: tuple | None = None) -> None:
        """Send ``result`` to the caller.  ``tm`` (stat, start, request bytes,
        span): record the invocation first -- as failed with ``TypeError`` if the
        result cannot be pickled -- so that it is counted before the caller hears."""
        try:
            rp, rb = _serial.dumps(result)
        except Exception as e:
            if tm is not None:
                self._record(tm, 0, "TypeError", method)
            raise TypeError(
                f"the result of {self._where(method)} ({type(result).__name__}) could not be pickled: {e}"
            ) from e
        if tm is not None:
            stat, t0, req, sp = tm
            rep = len(rp) if not rb else _nbytes(rp, rb)
            dt = _now() - t0  # (``_record``, inlined: the per-call path with metrics on)
            stat.add((dt, req, rep))
            if len(stat.pending) >= stat.FOLD_AT:
                stat.fold()
            if sp is not None:
                self.observer.end_server_span(sp, self, method, t0, dt, None)
        send_raw_to_port(reply_ref, rank, W.S_VALUE, rp, rb)

    def _lookup(self, name: str) -> tuple[Any, Any]:
        found = self._methods.get(name)
        if found is not None and found[0] is type(self.instance):
            return found[1], found[2]
        cls = type(self.instance)
        for klass in cls.__mro__:
            attr = klass.__dict__.get(name)
            if attr is None:
                continue
            if getattr(type(attr), "__monarch_endpoint__", False):  # an @endpoint (``_actor._endpoint``)
                func = _loopless(attr._method, self.loop)
                self._methods[name] = (cls, attr, func)
                return attr, func
            if callable(attr):
                if inspect.iscoroutinefunction(attr) and not _has_async_endpoint(cls):
                    func = _refused_async(cls, name)
                else:
                    func = _loopless(attr, self.loop)
                self._methods[name] = (cls, None, func)
                return None, func
            break
        raise AttributeError(f"{cls.__qualname__} has no endpoint {name!r}")

    def _start_concurrent(
        self, func: Any, args: tuple, kwargs: dict, method: str, reply_ref: tuple | None, rank: int,
        tm: tuple = (False, 0, 0, None),
    ) -> None:
        """Run a concurrent endpoint's body as a task.  Without an explicit port
        its return value (or exception) goes to the caller; an exception that
        is not forwarded anywhere fails the actor.  ``tm``: its stat, start
        time, request bytes and span (recorded when the body ends)."""
        msg_rank = _state.current_message_rank.get()
        current = self._current_reply
        stat, t0, req, sp = tm

        async def body() -> None:
            _state.current_message_rank.set(msg_rank)
            tm = (stat, t0, req, sp) if stat else None
            try:
                result = await func(self.instance, *args, **kwargs)
                rec, tm = tm, None  # (recorded once, here)
                if reply_ref is not None:
                    self._reply_value(reply_ref, rank, result, method, rec)
                elif rec is not None:
                    self._record(rec, 0, None, method)
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
                    self._die(e, f"concurrent endpoint {where} raised without forwarding it to its port", current,
                              where=where)
            except BaseException as e:
                if tm is not None:
                    self._record(tm, 0, type(e).__name__, method)
                self._die(e, f"concurrent endpoint {self._where(method)} raised {type(e).__name__}", current,
                          where=self._where(method))

        t = self.loop.create_task(body())
        self._concurrent.add(t)
        t.add_done_callback(self._concurrent.discard)


def _has_async_endpoint(cls: type) -> bool:
    """Whether ``cls`` is an asynchronous actor in the reference's sense: one of its endpoints is ``async def``."""
    for klass in cls.__mro__:
        for attr in klass.__dict__.values():
            if getattr(type(attr), "__monarch_endpoint__", False) and inspect.iscoroutinefunction(attr._method):
                return True
    return False


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


def _loopless(func: Any, loop: asyncio.AbstractEventLoop | None = None) -> Any:
    """``func`` itself if it is ``async def``; else a wrapper that runs it with
    no asyncio loop visible, as in the reference: ``asyncio.get_running_loop()``
    raises inside it, and it may run a loop of its own (``asyncio.run``) or
    block in ``Future.get()``.  The actor's loop is hidden only for the call:
    an awaitable it returns is awaited on the actor's loop as usual.  With
    ``loop`` (the actor's, which runs wherever the wrapper is called: its
    endpoints) the wrapper restores that loop without looking it up first
    (about 0.35 µs a call instead of 0.6)."""
    if inspect.iscoroutinefunction(func):
        return func
    if loop is not None:
        def run_on(*args: Any, **kwargs: Any) -> Any:
            _set_running_loop(None)
            try:
                return func(*args, **kwargs)
            finally:
                _set_running_loop(loop)

        return functools.update_wrapper(run_on, func)

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
