"""Streams and borrows: several orders of execution on every proc.

Contract (the reference's rules):

* A :class:`Stream` is a named order of execution on every proc of a mesh;
  the procs run the commands of one stream in the order they were issued,
  and different streams at the same time.  ``main`` (the default) is active
  unless ``with stream.activate():`` says otherwise; ``get_active_stream()``
  is this thread's innermost one.
* Every distributed tensor belongs to the stream it was made on, and only
  that stream may use it.  To use it on another stream, borrow it:
  ``t2, borrow = stream.borrow(t, mutable=False)`` gives ``t2``, the same
  storage on ``stream``; the procs' ``stream`` waits until ``t``'s stream
  has produced ``t`` before it uses ``t2``.
* Until ``borrow.drop()``: with ``mutable=False`` both streams may read the
  tensor and neither may write it; with ``mutable=True`` the borrower may
  write it and the lender may neither read nor write it.  ``drop()`` frees
  ``t2`` and makes ``t``'s stream wait, at that point of its order, for
  every use of ``t2`` issued before it.  A use that breaks these rules is an
  error in the client, at once (never a race on the procs); so is using
  ``t2`` after the drop, and dropping twice.  Until it is dropped a borrow
  keeps its lender's rules in force (there is no implicit drop).
* Collectives on different streams use different process groups, so that
  each group sees its collectives in one order on every member.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

from monarch_tensor_engine._client._tensor import Tensor

__all__ = ["Stream", "Borrow", "get_active_stream", "MAIN"]

_borrow_ids = itertools.count(1)
_stream_ids = itertools.count(1)


class Stream:
    """A named order of execution on the procs (see the module docstring)."""

    def __init__(self, name: str, _default: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a stream needs a name (a non-empty str), got {name!r}")
        self.name = name
        self.default = bool(_default)
        #: what the procs call it: the default stream is the same everywhere; another is this object
        self.key = "main" if self.default else f"{name}#{next(_stream_ids)}"

    def activate(self) -> "_Activation":
        """A context manager inside which this thread's operations run on this stream."""
        return _Activation(self)

    def borrow(self, t: Any, mutable: bool = False) -> tuple[Any, "Borrow"]:
        """``(t2, borrow)``: ``t`` usable on this stream as ``t2`` until
        ``borrow.drop()`` (the rules are in the module docstring)."""
        if not isinstance(t, Tensor):
            raise TypeError(f"Stream.borrow() takes a distributed tensor, got {type(t).__name__}")
        if t._stream is self:
            raise ValueError(f"{t!r} already belongs to {self}: borrow it onto another stream")
        if t._guard is not None:
            t._guard.check(t, mutable, "borrow")
        return t._ctl.borrow(t, self, bool(mutable))

    def __repr__(self) -> str:
        return f"<Stream({self.name!r})>"

    def __str__(self) -> str:
        return f"stream {self.name!r}"


MAIN = Stream("main", _default=True)

_state = threading.local()


def get_active_stream() -> Stream:
    """This thread's active stream (``main`` unless a ``stream.activate()`` block is open)."""
    return getattr(_state, "stream", MAIN)


class _Activation:
    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.previous: Stream | None = None

    def __enter__(self) -> Stream:
        self.previous = get_active_stream()
        _state.stream = self.stream
        return self.stream

    def __exit__(self, *exc: Any) -> None:
        _state.stream = self.previous or MAIN


class Lent:
    """The guard of a lender: its outstanding borrows."""

    __slots__ = ("borrows",)

    def __init__(self) -> None:
        self.borrows: list[Borrow] = []

    def check(self, t: Any, write: bool, what: str) -> None:
        for b in self.borrows:
            if b.mutable:
                raise RuntimeError(
                    f"{what}: this tensor is mutably borrowed by {b.stream}: its own {t._stream} may neither read "
                    f"nor write it until the borrow is dropped (borrow.drop())")
            if write:
                raise RuntimeError(
                    f"{what}: this tensor is borrowed (read-only) by {b.stream}: neither stream may write it until "
                    f"the borrow is dropped (borrow.drop()), or borrow it with mutable=True")


class Borrow:
    """A borrow (from :meth:`Stream.borrow`); ``drop()`` ends it."""

    def __init__(self, ctl: Any, lender: Any, stream: Stream, mutable: bool) -> None:
        self.id = next(_borrow_ids)
        self.ctl = ctl
        self.lender = weakref.ref(lender)
        self.lender_stream: Stream = lender._stream
        self.stream = stream
        self.mutable = mutable
        self.borrowed_id = 0
        self.dropped = False

    # the borrowed handle's guard
    def check(self, t: Any, write: bool, what: str) -> None:
        if self.dropped:
            raise RuntimeError(f"{what}: this tensor was borrowed onto {self.stream} and the borrow has been dropped; "
                               f"use the lender (or borrow it again)")
        if write and not self.mutable:
            raise RuntimeError(f"{what}: a read-only borrow cannot be written: borrow it with mutable=True")

    def drop(self) -> None:
        """End the borrow: the borrowed tensor is freed on its stream, and the
        lender's stream waits for the uses of it issued so far."""
        if self.dropped:
            raise RuntimeError("this borrow was already dropped")
        self.ctl.end_borrow(self)

    def __repr__(self) -> str:
        state = "dropped" if self.dropped else ("mutable" if self.mutable else "read-only")
        return f"<Borrow {self.lender_stream.name} -> {self.stream.name} ({state})>"


def check_use(t: Any, write: bool, what: str) -> None:
    """Raise unless the active stream may use (``write``: write) ``t``."""
    active = get_active_stream()
    if t._stream is not active:
        raise RuntimeError(
            f"{what}: a tensor of {t._stream} used on {active}: borrow it first "
            f"(t2, borrow = {active.name}.borrow(t); use t2; borrow.drop()), or use it on its own stream")
    guard = t._guard
    if guard is not None:
        guard.check(t, write, what)
