"""The remote pdb of a proc: ``breakpoint()`` and post-mortem stops.

:func:`set_trace` (what ``_hook.breakpointhook`` calls) stops the caller's
frame in a :class:`RemotePdb`: a ``pdb.Pdb`` whose prompt and output travel
to the client's debug controller (``_controller.DebugController``, spawned on
the root client the first time with ``get_or_spawn_controller``) as endpoint
calls over the proc's own actor channels, and whose input is what
``monarch debug`` answers.  The actor's thread waits in that call, so the
endpoint waits at the breakpoint until a debugger continues it; the proc's
kernel and its other actors keep running.

A session ends (the controller is told, and ``monarch debug`` detaches) when
the rank continues with no breakpoint left, quits, or its endpoint returns;
tracing stops with it.  It is released without a debugger (continued, its
breakpoints cleared) when the proc stops, when the controller is gone (the
client exited), or when the client runs with ``PYTHONBREAKPOINT=0``.

Source lines: pdb reads them through ``linecache``.  A file the proc cannot
read (code defined in the client's ``__main__`` on another host, or compiled
from a string the client registered in its own ``linecache``, as notebooks
do) is asked of the controller once and registered in this proc's
``linecache``, so ``l``/``ll`` and the ``->`` lines show the real source.

Post-mortem: when an endpoint raises in a message that already stopped at a
breakpoint, the plugin's ``monarch_endpoint_raised`` hook calls :func:`post_mortem`
before the error goes to the caller: a new session stops where the error was
raised, with its traceback, until continued.
"""

from __future__ import annotations

import bdb
import dis
import linecache
import logging
import os
import pdb
import socket
import sys
import threading
import traceback
from types import FrameType, TracebackType
from typing import Any

from monarch_core.actor import context, get_or_spawn_controller
from monarch_debugger import _state
from monarch_debugger._protocol import CONTROLLER_NAME

__all__ = ["RemotePdb", "post_mortem", "set_trace"]

logger = logging.getLogger("monarch.debug")

#: Seconds between two checks, while a rank waits for the debugger, of
#: whether it must be released (the proc stopping).
POLL = 0.5
#: Seconds the controller may take to start, or to answer anything but a read.
CONTROLLER_TIMEOUT = 60.0
#: Module name prefixes whose frames end the user's part of a stack.
_RUNTIME = ("monarch_core.", "monarch_debugger.", "asyncio.", "concurrent.futures.", "threading")
_YIELDS = {dis.opmap[n] for n in ("YIELD_VALUE", "INSTRUMENTED_YIELD_VALUE") if n in dis.opmap}

_lock = threading.Lock()
_controller: Any = None
#: thread ident -> the message (its ``current_message_rank`` Point: one
#: object per message) that stopped at a breakpoint on that thread.
_hits: dict[int, Any] = {}
#: files whose source this proc has (or the client had not either).
_sources_checked: set[str] = set()
_warned: set[str] = set()


# ---------------------------------------------------------------- entry points


def set_trace(frame: FrameType, *args: Any, header: str | None = None, **kwargs: Any) -> None:
    """Stop ``frame`` (the caller of ``breakpoint()``) in a remote pdb session."""
    if args or kwargs:
        logger.warning("breakpoint() arguments %r %r ignored (only header= is understood)", args, kwargs)
    _state.arm()
    _hits[threading.get_ident()] = context().message_rank
    p = RemotePdb(_Link(_identity()), _endpoint_frame(frame))
    if header is not None:
        p.message(header)
    p.start(frame)


def post_mortem(exc: BaseException) -> None:
    """If the message being handled on this thread stopped at a breakpoint,
    stop where ``exc`` was raised (its traceback, then pdb), until continued."""
    hit = _hits.pop(threading.get_ident(), None)
    if hit is None or hit is not context().message_rank or isinstance(exc, bdb.BdbQuit):
        return
    tb = _user_traceback(exc.__traceback__)
    if tb is None:
        return
    p = RemotePdb(_Link(_identity()), None, post_mortem=True)
    p.message("".join(traceback.format_exception(type(exc), exc, tb)).rstrip("\n"))
    p.message("Post-mortem: the endpoint raised; 'c' (or 'q') lets the error go to its caller.")
    p.reset()
    p.interaction(None, tb)
    p.finish("the post-mortem session ended; the error goes to the caller")


# ---------------------------------------------------------------- the debugger


class _Output:
    """pdb's stdout: collects what it prints until the next prompt."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self) -> None:
        self._parts: list[str] = []

    def write(self, s: str) -> int:
        self._parts.append(s)
        return len(s)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def drain(self) -> str:
        out = "".join(self._parts)
        self._parts.clear()
        return out


class _Input:
    """pdb's stdin: each line is asked of the debugger."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, owner: RemotePdb) -> None:
        self._owner = owner

    def readline(self, size: int = -1) -> str:
        return self._owner.remote_readline()

    def isatty(self) -> bool:
        return False


class RemotePdb(pdb.Pdb):
    """A ``pdb.Pdb`` driven by ``monarch debug`` through the debug controller.

    ``endpoint_frame`` is the outermost frame of user code (the endpoint's):
    the stack pdb shows ends there, and its return ends the session.
    """

    def __init__(self, link: _Link, endpoint_frame: FrameType | None, post_mortem: bool = False) -> None:
        self._out = _Output()
        super().__init__(stdin=_Input(self), stdout=self._out,  # type: ignore[arg-type]  # (pdb uses only their readline/write/flush)
                         skip=["monarch_core.*", "monarch_debugger.*"], nosigint=True, readrc=False)
        self.prompt = "(Pdb) "
        self._link = link
        self._endpoint_frame = endpoint_frame
        self._post_mortem = post_mortem
        self._continued = False
        self._ended = False

    # -- starting and ending
    def start(self, frame: FrameType) -> None:
        """Like ``Bdb.set_trace(frame)``, with the stack cut at the endpoint's frame."""
        self.reset()
        f: FrameType | None = frame
        while f is not None:
            f.f_trace = self.trace_dispatch
            self.botframe = f
            if f is self._endpoint_frame:
                break
            f = f.f_back
        self.set_step()
        sys.settrace(self.trace_dispatch)

    def finish(self, why: str) -> None:
        """The session is over: say so to the controller, with what is left to show."""
        if self._ended:
            return
        self._ended = True
        self._link.end(self._out.drain(), why)

    def set_continue(self) -> None:
        super().set_continue()
        if not self.breaks:
            self._continued = True

    def interaction(self, frame: FrameType | None, traceback: TracebackType | None) -> None:
        if self._ended:  # a breakpoint set in this session hit after it ended: a new one
            self._ended = False
            self._link = _Link(_identity())
        super().interaction(frame, traceback)
        if self._post_mortem:
            return  # post_mortem() ends it
        if self.quitting:
            self.finish("quit: the endpoint raises BdbQuit")
        elif self._continued:
            self.finish("continued")

    def dispatch_return(self, frame: FrameType, arg: Any) -> Any:
        r = super().dispatch_return(frame, arg)
        if frame is self._endpoint_frame and not _suspended(frame):
            # The endpoint returns (or raises): tracing ends with it.
            sys.settrace(None)
            frame.f_trace = None  # type: ignore[assignment]
            self.finish("the endpoint returned")
            return None
        return r

    def setup(self, f: FrameType | None, tb: TracebackType | None) -> Any:
        r = super().setup(f, tb)
        for frame, _lineno in self.stack:
            _ensure_source(frame, self._link)
        return r

    # -- input
    def remote_readline(self) -> str:
        """The next command line for pdb (its prompt was just written)."""
        kind, line = self.ask(self.prompt)
        if kind == "line":
            return line + "\n"
        self.clear_all_breaks()  # `continue` of monarch debug, or released: nothing more stops here
        return "continue\n"

    def ask(self, prompt: str) -> tuple[str, str]:
        """Show what was printed, wait for the debugger's next line after
        ``prompt``: ``(kind, line)`` (see :meth:`_Link.read`)."""
        out = self._out.drain().removesuffix(prompt)
        return self._link.read({**self._where(), "prompt": prompt}, out)

    def _where(self) -> dict[str, Any]:
        frame, lineno = self.stack[-1] if self.stack else (None, 0)
        where = ""
        if self.curframe is not None and self.stack:
            where = "> " + self.format_stack_entry(self.stack[self.curindex], "\n-> ")
        return {
            "function": frame.f_code.co_name if frame is not None else "?",
            "filename": frame.f_code.co_filename if frame is not None else "?",
            "lineno": lineno,
            "where": where,
            "post_mortem": self._post_mortem,
        }

    # -- commands that would read the proc's own stdin
    def do_clear(self, arg: str) -> Any:
        if not arg.strip():  # pdb asks "Clear all breaks?" on the proc's stdin: here, just clear
            bplist = [bp for bp in bdb.Breakpoint.bpbynumber if bp]
            self.clear_all_breaks()
            for bp in bplist:
                self.message(f"Deleted {bp}")
            return None
        return super().do_clear(arg)

    do_cl = do_clear

    def do_interact(self, arg: str) -> Any:
        """interact
        Start an interactive interpreter (its lines come from the debugger
        too) whose global namespace contains all the (global and local)
        names found in the current scope.  Ctrl-D or exit() leaves it."""
        import code

        owner = self

        class Console(code.InteractiveConsole):
            def raw_input(self, prompt: str = "") -> str:
                owner._out.write(prompt)
                kind, line = owner.ask(prompt)
                if kind != "line" or line.strip() in ("exit()", "quit()"):
                    raise EOFError
                return line

            def write(self, data: str) -> None:
                owner._out.write(data)

        saved = sys.stdout
        sys.stdout = self._out  # type: ignore[assignment]  # (what the code prints)
        try:
            Console({**self.curframe.f_globals, **self.curframe_locals}).interact(  # type: ignore[union-attr]  # (stopped at a frame)
                "*interactive* (Ctrl-D or exit() returns to pdb)", exitmsg="")
        except SystemExit:
            pass
        finally:
            sys.stdout = saved


# ---------------------------------------------------------------- the link to the controller


class _Link:
    """One session's calls to the debug controller."""

    def __init__(self, ident: dict[str, Any]) -> None:
        self.ident = ident
        self.id = ident["id"]
        self.closed = False  # ended (or the controller is gone): nothing more to send

    def read(self, where: dict[str, Any], output: str) -> tuple[str, str]:
        """Show ``output``, wait for the next command: ``(kind, line)``,
        ``kind`` being ``line``, ``continue_all`` or ``release``."""
        if self.closed:
            return ("release", "the session was released")
        ctrl = _get_controller()
        if ctrl is None:
            return ("release", "no debug controller")
        try:
            fut = ctrl.pdb_read.call_one(self.id, {**self.ident, **where}, output)
        except Exception as e:  # noqa: BLE001 - the client is going away
            return self._lost(e)
        while True:
            try:
                kind, line = fut.get(timeout=POLL)
                return str(kind), str(line)
            except TimeoutError:
                why = _release_reason()
                if why is not None:
                    logger.info("%s rank %s released from its breakpoint: %s", self.ident["actor"],
                                self.ident["rank"], why)
                    self.end("", f"released: {why}")
                    return ("release", why)
            except Exception as e:  # noqa: BLE001 - controller gone (client exited or stopped it)
                return self._lost(e)

    def _lost(self, e: BaseException) -> tuple[str, str]:
        self.closed = True
        _warn_once("lost", "the debug controller in the client is gone (%s); breakpoints in this proc "
                   "are continued", _short(e))
        return ("release", "the client's debug controller is gone")

    def end(self, output: str, why: str) -> None:
        ctrl = _get_controller(start=False)
        if ctrl is None or self.closed:
            return
        self.closed = True
        try:
            ctrl.pdb_end.call_one(self.id, output, why).get(timeout=CONTROLLER_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - nothing waits for it any more
            logger.debug("could not tell the debug controller that %s ended: %r", self.id, e)

    def source(self, filename: str) -> list[str] | None:
        ctrl = _get_controller()
        if ctrl is None:
            return None
        try:
            lines = ctrl.source.call_one(filename).get(timeout=CONTROLLER_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - no source: pdb says so itself
            logger.debug("no source of %s from the client: %r", filename, e)
            return None
        return [str(x) for x in lines] if lines else None


def _get_controller(start: bool = True) -> Any:
    """The debug controller (an actor mesh of one on the root client), spawned
    there the first time; None (after one warning) if it cannot be had."""
    global _controller
    with _lock:
        if _controller is None and start:
            # lazy: the controller's module (its TCP server) is needed only where a breakpoint is first hit
            from monarch_debugger._controller import DebugController

            try:
                _controller = get_or_spawn_controller(CONTROLLER_NAME, DebugController).get(
                    timeout=CONTROLLER_TIMEOUT)
            except Exception as e:  # noqa: BLE001 - a breakpoint must not hang or fail the endpoint
                _warn_once("spawn", "breakpoint(): the debug controller could not be started in the client "
                           "(%s); continuing", _short(e))
                return None
        return _controller


def _release_reason() -> str | None:
    why = _state.STATE.stopping_why
    return None if why is None else f"the proc is stopping ({why})"


# ---------------------------------------------------------------- helpers


def _identity() -> dict[str, Any]:
    """Who stops: the actor (mesh name, rank, coordinates) and where it runs."""
    inst = context().actor_instance
    proc_id = str(inst.proc_id)
    point = inst.rank
    name = inst.name
    key = getattr(inst, "key", None)
    if key is not None:  # an actor
        sid = f"{proc_id}/{key}"
    else:  # outside any actor (a proc's bootstrap, a thread of the user's)
        key = f"{name}-proc"
        sid = f"{proc_id}/thread-{threading.get_ident()}"
    labels = list(point.extent.labels)
    return {
        "id": sid,
        "actor": name,
        "mesh": key,
        "rank": point.rank,
        "labels": labels,
        "sizes": list(point.extent.sizes),
        "coords": list(point.coords),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "proc": proc_id,
    }


def _is_runtime(frame: FrameType) -> bool:
    name = frame.f_globals.get("__name__") or ""
    return isinstance(name, str) and name.startswith(_RUNTIME)


def _endpoint_frame(frame: FrameType) -> FrameType:
    """The outermost frame of user code above ``frame``: the endpoint's
    (the frame below the first monarch or asyncio frame)."""
    last = frame
    f: FrameType | None = frame
    while f is not None and not _is_runtime(f):
        last = f
        f = f.f_back
    return last


def _suspended(frame: FrameType) -> bool:
    """A 'return' event of a coroutine or generator frame that only suspends (await/yield)."""
    if not frame.f_code.co_flags & (0x80 | 0x20 | 0x200):  # CO_COROUTINE, CO_GENERATOR, CO_ASYNC_GENERATOR
        return False
    code = frame.f_code.co_code
    i = frame.f_lasti
    return 0 <= i < len(code) and code[i] in _YIELDS


def _user_traceback(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its leading monarch frames (the actor host's)."""
    while tb is not None and _is_runtime(tb.tb_frame):
        tb = tb.tb_next
    return tb


def _ensure_source(frame: FrameType, link: _Link) -> None:
    """Make sure ``linecache`` has the source of ``frame``'s file: from this
    host, or else from the client (once per file)."""
    filename = frame.f_code.co_filename
    if filename in _sources_checked:
        return
    _sources_checked.add(filename)
    if linecache.getlines(filename, frame.f_globals):
        return
    lines = link.source(filename)
    if lines:
        linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _warn_once(key: str, msg: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg, *args)
