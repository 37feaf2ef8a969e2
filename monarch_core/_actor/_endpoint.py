"""Endpoints: the ``@endpoint`` decorators and the messaging adverbs."""

from __future__ import annotations

import functools
import inspect
import random
from typing import TYPE_CHECKING, Any, Callable, Generic, Literal, Protocol, TypeVar, overload

from monarch_core._actor import _engine
from monarch_core._proc._future import Cell, Future
from monarch_core._proc._port import Port, StreamIterator

if TYPE_CHECKING:
    from monarch_core._mesh._shape import Extent, Region
    from monarch_core._mesh._value_mesh import ValueMesh


class ActorMesh(Protocol):
    """An ``_actor_mesh.ActorMesh`` as its endpoints see it: what they read
    and call (that module imports this one, so it is not named here;
    ``ActorMesh`` satisfies this)."""

    @property
    def name(self) -> str: ...

    @property
    def extent(self) -> Extent: ...

    @property
    def _region(self) -> Region: ...

    def _describe_call(self, endpoint: str, adverb: str, ranks: list[int] | None, proc_id: str | None,
                       exc: BaseException) -> str | None: ...

    def _call_one(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict, index: int,
                  adverb: str = "call_one") -> Cell: ...

    def _call_all(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict) -> Cell: ...

    def _call_stream(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict) -> StreamIterator[Any]: ...

    def _cast(self, ep: Endpoint[Any, Any], args: tuple, kwargs: dict, port: Any, only: int | None,
              adverb: str = "broadcast") -> None: ...

try:  # Python >= 3.10
    from typing import ParamSpec
except ImportError:  # pragma: no cover
    from typing_extensions import ParamSpec  # type: ignore

P = ParamSpec("P")
R = TypeVar("R")
A = TypeVar("A")

Propagator = Any


class EndpointProperty(Generic[P, R]):
    """What ``@endpoint`` puts on an Actor class.

    On a spawned actor mesh, the attribute becomes an :class:`Endpoint` with the
    messaging adverbs.  Inside the actor itself (``self.method``) it is the
    plain bound method.  ``__monarch_endpoint__`` is how the proc runtime
    (which does not import this layer) tells an endpoint from a plain method.
    """

    __monarch_endpoint__ = True

    def __init__(
        self,
        method: Callable[..., Any],
        propagate: Propagator = None,
        explicit_response_port: bool = False,
        instrument: bool = True,
        concurrent: bool = False,
    ) -> None:
        if not callable(method):
            raise TypeError(f"@endpoint must decorate a function, got {type(method).__name__}")
        self._method = method
        self._propagate = propagate
        self._explicit_response_port = explicit_response_port
        self._instrument = instrument
        self._concurrent = concurrent
        self._name = getattr(method, "__name__", "endpoint")
        self._owner_name = ""
        self._signature: inspect.Signature | None = None
        # (fewest, most) positional arguments when the signature has only plain
        # positional parameters: a call that passes such arguments alone needs
        # no ``Signature.bind`` (the common case, checked on every call)
        self._positional: tuple[int, int] | None = None
        functools.update_wrapper(self, method)  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name
        self._owner_name = owner.__qualname__

    def __getstate__(self) -> dict[str, Any]:
        """What a pickle of the endpoint holds: not the signature the caller's
        checks cached (rebuilt where needed), so that a class pickled by value
        pickles the same before and after its first call -- a proc unpickles
        it once (``_serial.loads_spawn``)."""
        state = dict(self.__dict__)
        state["_signature"] = state["_positional"] = None
        return state

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return self._method.__get__(instance, owner)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"endpoint {self._qualname()} cannot be called directly on the class; spawn the actor and "
            f"use an adverb: mesh.{self._name}.call(...), .call_one(...), .broadcast(...)"
        )

    def _qualname(self) -> str:
        return f"{self._owner_name}.{self._name}" if self._owner_name else self._name

    def _check_args(self, args: tuple, kwargs: dict) -> None:
        """Raise ``TypeError`` at the call site if the arguments do not fit."""
        pos = self._positional
        if pos is not None and not kwargs and pos[0] <= len(args) <= pos[1]:
            return
        sig = self._signature
        if sig is None:
            try:
                sig = self._signature = inspect.signature(self._method)
            except (TypeError, ValueError):  # builtins without signatures: accept anything
                return
            self._positional = _positional_range(sig, 2 if self._explicit_response_port else 1)
        try:
            if self._explicit_response_port:
                sig.bind(None, None, *args, **kwargs)
            else:
                sig.bind(None, *args, **kwargs)
        except TypeError as e:
            params = list(sig.parameters.values())[2 if self._explicit_response_port else 1 :]
            shown = "(" + ", ".join(str(p) for p in params) + ")"
            why = _diagnose(params, kwargs, e).rstrip(".")
            raise TypeError(
                f"bad arguments for endpoint {self._qualname()}{shown}: {why}{'' if why.endswith('?') else '.'} "
                "Nothing was sent."
            ) from None


def _diagnose(params: list[inspect.Parameter], kwargs: dict, error: TypeError) -> str:
    """What is wrong with a call's arguments, for people (only on failure).

    ``Signature.bind`` reports the first *missing* argument before an
    *unexpected* keyword, so ``train(bach=1)`` would read "missing 'batch'";
    a misspelt keyword is named first, with the closest parameter names."""
    import difflib

    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        names = [p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                       inspect.Parameter.KEYWORD_ONLY)]
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            parts, guessed = [], 0
            for k in unknown:
                close = difflib.get_close_matches(k, names, n=1, cutoff=0.6)
                guessed += bool(close)
                parts.append(f"unexpected keyword argument {k!r}" + (f", did you mean {close[0]!r}?" if close else ""))
            if guessed < len(unknown):
                parts.append(f"its keyword arguments are {', '.join(repr(n) for n in names) or 'none'}")
            return "; ".join(parts)
    return str(error)


def _positional_range(sig: inspect.Signature, skip: int) -> tuple[int, int] | None:
    params = list(sig.parameters.values())
    if len(params) < skip:
        return None
    params = params[skip:]
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind not in plain for p in params):
        return None
    required = sum(1 for p in params if p.default is inspect.Parameter.empty)
    return required, len(params)


@overload
def endpoint(method: Callable[..., R], /) -> EndpointProperty[..., R]: ...


@overload
def endpoint(
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Callable[[Callable[..., R]], EndpointProperty[..., R]]: ...


def endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Mark an Actor method as an endpoint callable from other actors.

    Apply it bare (``@endpoint``) or with options
    (``@endpoint(explicit_response_port=True)``).  Endpoints may be sync or
    async; each actor handles one message at a time, in arrival order.  With
    ``explicit_response_port=True`` the method receives a :class:`Port` as its
    first argument (after ``self``) and sends its result(s) through it.
    ``propagate`` tells the tensor engine the shapes of the endpoint's tensor
    results under ``rref`` (a callable run on fake tensors).  ``instrument=False`` turns this endpoint's telemetry off
    on both sides: no endpoint metrics (``monarch_core.telemetry``), no
    client or server span; ``MONARCH_TELEMETRY=0`` turns it off for all.
    """
    return _decorate(method, propagate, explicit_response_port, instrument, False)


def concurrent_endpoint(
    method: Callable[..., Any] | None = None,
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> Any:
    """Run one *async* actor endpoint as an asyncio background task.

    The actor returns to its mailbox as soon as the body starts (first
    ``await``), so it can handle further messages meanwhile.  Bodies of
    messages from the same sender start in order.  An exception the body does
    not forward through its port (``port.exception(e)``) fails the actor, as
    for ``explicit_response_port`` endpoints.  Outstanding tasks are cancelled
    before ``__cleanup__`` runs.
    """
    return _decorate(method, propagate, explicit_response_port, instrument, True)


def _decorate(method: Callable[..., Any] | None, propagate: Propagator, explicit_response_port: bool,
              instrument: bool, concurrent: bool) -> Any:
    """``@endpoint``/``@concurrent_endpoint``, applied bare (``method`` given) or with options."""

    def wrap(m: Callable[..., Any]) -> EndpointProperty[Any, Any]:
        if concurrent and isinstance(m, EndpointProperty):
            from monarch_core.errors import EndpointDefinitionError

            raise EndpointDefinitionError(
                f"@concurrent_endpoint does not wrap @endpoint: {getattr(m._method, '__qualname__', m)!r} is "
                "already an endpoint. Put @concurrent_endpoint alone on the `async def` (it makes the endpoint)."
            )
        if concurrent and not inspect.iscoroutinefunction(m):
            from monarch_core.errors import EndpointDefinitionError

            raise EndpointDefinitionError(
                f"@concurrent_endpoint can only wrap async endpoints (it needs an async method); "
                f"{getattr(m, '__qualname__', m)!r} is synchronous. Make it `async def`, or use @endpoint."
            )
        return EndpointProperty(m, propagate, explicit_response_port, instrument, concurrent)

    return wrap if method is None else wrap(method)


class Endpoint(Generic[P, R]):
    """A callable endpoint on a spawned actor or actor mesh.

    Its methods are the messaging adverbs: :meth:`call`, :meth:`call_one`,
    :meth:`choose`, :meth:`stream`, :meth:`broadcast` (and ``rref``, which
    needs the tensor engine).

    Flow control: every adverb sends its message(s) before it returns, and
    returns at once, unless this process already holds a full *send window*
    for a destination proc (``MONARCH_SEND_WINDOW_MB`` MiB or
    ``MONARCH_SEND_WINDOW_MSGS`` messages it has not acknowledged yet, by
    default 64 MiB / 16384).  Then the calling thread waits, inside the
    adverb, until that proc acknowledges enough of them; an actor's asyncio
    loop waits the same way (its other tasks do not run meanwhile).  The wait
    ends early, and the message fails the usual way, if the proc dies; it
    never lasts longer than ``MONARCH_DELIVERY_TIMEOUT`` without progress.
    Futures are returned once their messages are handed to the kernel.  See
    docs/architecture.md, *Flow control*.
    """

    def __init__(self, mesh: ActorMesh, name: str, prop: EndpointProperty[P, R]) -> None:
        self._mesh = mesh
        self._name = name
        self._prop = prop
        self._tm: Any = None  # its instrumentation in this process (the runtime instrumentation's ``client_side``), made on first use

    @property
    def name(self) -> str:
        """The endpoint's (method's) name."""
        return self._name

    @property
    def mesh(self) -> ActorMesh:
        """The actor mesh this endpoint sends to."""
        return self._mesh

    @property
    def propagate(self) -> Propagator:
        """What ``@endpoint(propagate=...)`` said: how the tensor engine learns
        the shapes of ``rref``'s results (``None`` if nothing was said)."""
        return self._prop._propagate

    @property
    def explicit_response_port(self) -> bool:
        """What ``@endpoint(explicit_response_port=...)`` said: the method
        takes the call's response port as its first argument."""
        return self._prop._explicit_response_port

    def _describe(self) -> str:
        return f"{self._mesh.name}.{self._name}"

    def _failure_context(self, adverb: str, ranks: list[int] | None, proc_id: str | None,
                         exc: BaseException) -> str | None:
        """The call's side of a failure text (``_port.CallSite``; only on failure)."""
        return self._mesh._describe_call(self._name, adverb, ranks, proc_id, exc)

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the endpoint on the single actor of this mesh.

        Raises ``ValueError`` (before sending) if the mesh has more than one
        actor: slice it first, or use ``call``/``choose``.  Returns the future
        at once, unless the send window to the actor's proc is full (then it
        waits for room first: see :class:`Endpoint`)."""
        n = self._mesh._region.nelements
        if n != 1:
            raise ValueError(
                f"call_one() needs a mesh of exactly one actor, but {self._describe()} has {n} "
                f"({self._mesh.extent}); slice it (mesh.slice(...)) or use call()/choose()"
            )
        self._prop._check_args(args, kwargs)
        f: Future[R] = Future._of(self._mesh._call_one(self, args, kwargs, 0))
        f._site = (self, "call_one")  # named in a get(timeout=) that runs out
        return f

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the endpoint on one actor of the mesh (load-balanced).  Returns
        at once, unless the send window to that actor's proc is full (see
        :class:`Endpoint`)."""
        self._prop._check_args(args, kwargs)
        n = self._mesh._region.nelements
        f: Future[R] = Future._of(self._mesh._call_one(self, args, kwargs, random.randrange(n), "choose"))
        f._site = (self, "choose")
        return f

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Call the endpoint on every actor; the future resolves to a
        ``ValueMesh`` of their results (raises the first ``ActorError``).
        Returns at once, unless the send window to one of the procs is full
        (it waits for room for each message in turn: see :class:`Endpoint`)."""
        self._prop._check_args(args, kwargs)
        f: Future[ValueMesh[R]] = Future._of(self._mesh._call_all(self, args, kwargs))
        f._site = (self, "call")
        return f

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> StreamIterator[R]:
        """Call every actor and yield a future per response, in arrival order
        (``async for value in ...`` also works).  Sends like :meth:`call`."""
        self._prop._check_args(args, kwargs)
        return self._mesh._call_stream(self, args, kwargs)

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Fire-and-forget to every actor.  Return does not mean delivery; an
        exception in the endpoint fails that actor (supervision).  Returns at
        once, unless this process holds a full send window for a destination
        proc: then it waits until that proc acknowledges enough (see
        :class:`Endpoint`), which bounds what a fast sender can pile up for a
        slow receiver."""
        self._prop._check_args(args, kwargs)
        self._mesh._cast(self, args, kwargs, None, None, "broadcast")

    def rref(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Call the endpoint on every actor inside an active mesh; its tensor
        results stay on the procs as distributed tensors (the tensor engine
        plugin; ``@endpoint(propagate=...)`` tells the client their shapes)."""
        return _engine.engine("Endpoint.rref()").rref(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"{self._describe()} is an endpoint of a remote actor mesh; call it with an adverb: "
            f".call(...), .call_one(...), .choose(...), .stream(...) or .broadcast(...)"
        )

    def __repr__(self) -> str:
        return f"<Endpoint {self._describe()}>"


class NotAnEndpoint:
    """What a plain (undecorated) actor method looks like on a mesh."""

    def __init__(self, mesh: ActorMesh, name: str, method: Callable[..., Any], owner: str) -> None:
        self._mesh = mesh
        self._name = name
        self._method = method
        self._owner = owner  # the actor class's qualified name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AttributeError(
            f"{self._owner}.{self._name} is not an endpoint, so it cannot be called on "
            f"the actor mesh {self._mesh.name!r}. Decorate it with @endpoint, or call it through "
            f"as_endpoint: as_endpoint(mesh.{self._name}).call(...)"
        )

    def __getattr__(self, adverb: str) -> Any:
        if adverb in ("call", "call_one", "choose", "stream", "broadcast", "rref"):
            return self.__call__
        raise AttributeError(adverb)


def as_endpoint(
    not_an_endpoint: Any,
    *,
    propagate: Propagator = None,
    explicit_response_port: bool = False,
) -> Endpoint[Any, Any]:
    """Treat an actor method that is not an ``@endpoint`` as one, e.g.
    ``as_endpoint(mesh.reset).call()``.  Raises ``ValueError`` if the
    argument is not a method of a spawned actor mesh.  An ``async`` method
    of a synchronous actor (one with no ``async`` endpoint) is refused when
    called, as the reference refuses it: the call raises ``ActorError``
    and the actor goes on."""
    if isinstance(not_an_endpoint, Endpoint):
        return not_an_endpoint
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise ValueError(
            f"as_endpoint() takes a method of a spawned actor mesh (as_endpoint(mesh.method)), "
            f"got {not_an_endpoint!r}"
        )
    prop: EndpointProperty[Any, Any] = EndpointProperty(
        not_an_endpoint._method, propagate, explicit_response_port, True
    )
    prop._name = not_an_endpoint._name
    prop._owner_name = not_an_endpoint._owner
    return Endpoint(not_an_endpoint._mesh, not_an_endpoint._name, prop)


def send(
    endpoint: Endpoint[P, R],
    args: tuple,
    kwargs: dict,
    port: Port[Any] | None = None,
    selection: Literal["all", "choose"] = "all",
) -> None:
    """Fire-and-forget invocation of ``endpoint`` on ``selection`` of its mesh;
    responses (if any) go to ``port``.  Waits like :meth:`Endpoint.broadcast`
    when a send window is full."""
    if not isinstance(endpoint, Endpoint):
        other = getattr(endpoint, "_send", None)  # a remote function (the tensor engine's remote(fn))
        if callable(other):
            other(args, kwargs, port, selection)
            return
        raise TypeError(f"send() needs an endpoint of an actor mesh (mesh.method) or a remote function "
                        f"(remote(fn)), got {endpoint!r}")
    args, kwargs = tuple(args), dict(kwargs)
    endpoint._prop._check_args(args, kwargs)
    mesh = endpoint._mesh
    if selection == "all":
        mesh._cast(endpoint, args, kwargs, port, None, "send")
    elif selection == "choose":
        mesh._cast(endpoint, args, kwargs, port, random.randrange(mesh._region.nelements), "send")
    else:
        raise ValueError(f"send(selection={selection!r}): selection must be 'all' or 'choose'")


def _map_future(fut: Future[Any], fn: Callable[[Any], Any]) -> Future[Any]:
    src = fut._ensure()
    out = Cell()

    def done() -> None:
        def compute() -> Any:
            return fn(src.result())

        out.set_lazy(compute)

    if not src.add_callback(done):
        done()
    return Future._of(out)


class Accumulator(Generic[P, R, A]):
    """Accumulate the results of calling an endpoint on every actor of a mesh.

    ``Accumulator(mesh.value, 0, lambda acc, x: acc + x).accumulate()`` is a
    future of the sum, folded in rank order.
    """

    def __init__(self, endpoint: Endpoint[P, R], identity: A, combine: Callable[[A, R], A]) -> None:
        if not isinstance(endpoint, Endpoint):
            raise TypeError(
                "Accumulator needs an endpoint of a spawned actor mesh (e.g. Accumulator(mesh.value, 0, add)), "
                f"got {endpoint!r}"
            )
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: P.args, **kwargs: P.kwargs) -> Future[A]:
        """Call the endpoint everywhere; resolve to the folded value."""
        def fold(vm: Any) -> A:
            return functools.reduce(self._combine, vm.values(), self._identity)

        return _map_future(self._endpoint.call(*args, **kwargs), fold)

