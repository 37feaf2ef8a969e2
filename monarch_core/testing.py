"""Conformance checks for plugins, and test doubles for programs (a public, supported module).

Programs' tests replace an actor class, or an actor's tensor engine, for a
block: :class:`patch_actor` (``with patch_actor(Real, Fake):`` every
``spawn(..., Real)`` this process makes spawns ``Fake``) and
:class:`patch_tensor_engine` (the patched actors' ``activate()`` calls go to
another mesh), the reference's ``monarch._src.actor.mock`` names.

Every transport the project ships runs :func:`check_transport` in its own
tests; third-party transports should too::

    import trio
    from monarch_core.testing import check_transport
    from my_transport.plugin import MyTransport   # your Transport

    def test_conformance():
        trio.run(check_transport, MyTransport())

:func:`check_transport` listens on ``bind_spec`` (default: the transport's
``default_bind_spec()``), connects to the advertised address, and checks:
``normalize`` keeps the advertised address and rejects garbage with
``ValueError``; three concurrent connections (connect and accept overlap, so
a transport that handshakes in ``connect`` passes); ordered bytes both ways,
from ``bytes`` and ``memoryview``; that a small write is delivered without
more being written (a stream that buffers, e.g. zlib without
``Z_SYNC_FLUSH``, fails here); ``receive_some(max_bytes)`` never returning
more than ``max_bytes``; ``send_all`` beside a pending ``receive_some`` on
the same stream; a large payload received with ``receive_into``; a
cancelled ``send_all`` followed by ``aclose``; ``raw_socket()``, when it
returns a socket, carrying the stream's bytes as they are; end of stream
after the peer closes (``b""``, not an exception); ``ConnectionClosed`` (not
``OSError``/trio errors) when writing to a stream whose peer closed;
``aclose`` idempotent, for streams and listeners; ``child_bind_spec``
returning a spec the transport can listen on; no socket file left behind by
a closed listener; and ``connect`` to the closed listener's address (or to
``bad_address``) raising ``ConnectError`` that names it, with
``refused=True`` for the closed listener.

It raises ``AssertionError`` describing the first violation: a step that
does not finish within ``timeout`` seconds (4 times that for the steps
that move megabytes) fails with what the step waited
for and the likely cause (never a hang), and an exception from outside
:mod:`monarch_core.errors` (``OSError``, ``trio.BrokenResourceError`` ...)
fails naming the method it escaped from.  ``monarch_core.errors``
exceptions other than the ones a step expects propagate as they are (a
``tls`` listener without credentials raises its ``TransportError``).

Scheduler plugins run :func:`check_scheduler` (a blocking call, from a
client process whose enabled transport is the one the workers should use)::

    import os, signal
    from monarch_core.testing import check_scheduler
    from fixed_workers.plugin import FixedWorkers   # docs/plugin-authors.md's example

    def test_conformance():
        check_scheduler(FixedWorkers(), {"workers": ["tcp://127.0.0.1:29611", "tcp://127.0.0.1:29612"]},
                        bad_params={"workers": []},
                        lose_host=lambda host: os.kill(int(host.labels["pid"]), signal.SIGKILL))

It checks that the scheduler itself reports a lost host
(``WorkerLaunch.report_lost``: a ``MeshFailure`` the core found out by other
means does not count) and that ``Allocation.release()`` returns within
``MONARCH_RELEASE_TIMEOUT``.  With ``idle=SECONDS`` it also keeps the host
mesh idle, then busy, that long and calls it after each (the long-idle
check): give it several multiples of every timeout that silence could trip
-- the scheduler's own (an SSH channel's ``io_timeout``, keepalives) and the
core's (``MONARCH_HEARTBEAT_INTERVAL``/``_TIMEOUT``,
``MONARCH_DELIVERY_TIMEOUT``) -- shortened through the entry's parameters
and the settings, so that it stays quick::

    # in the client process, before anything starts (settings are read then):
    #   MONARCH_HEARTBEAT_INTERVAL=0.5 MONARCH_HEARTBEAT_TIMEOUT=2 MONARCH_DELIVERY_TIMEOUT=2
    check_scheduler(SSHScheduler(), {**params, "io_timeout": 1, "keepalive_interval": 0.5,
                                     "keepalive_count": 4}, idle=8)
"""

from __future__ import annotations

import contextlib
import os
import socket as _stdsocket
from collections.abc import Iterator
from typing import Any, Callable, Optional

import trio

from monarch_core._compat import BaseExceptionGroup
from monarch_core._actor import _patches
from monarch_core.actor import Actor, endpoint
from monarch_core.errors import ConnectError, ConnectionClosed, MonarchError, TransportError
from monarch_core.hookspecs import Stream, Transport

__all__ = ["check_scheduler", "check_stream_pair", "check_transport", "patch_actor", "patch_tensor_engine"]


class patch_actor(_patches.Patch[type]):
    """While entered, ``ProcMesh.spawn(name, original, ...)`` made by this process
    spawns ``mock`` instead (a test double: a smaller model, a canned reward).

    The reference's ``monarch._src.actor.mock.patch_actor``: a context manager
    (``with``/``async with``, returning ``mock``) and a decorator of sync and
    async functions; patches nest, and leaving one restores the previous.
    ``mock`` must be an ``Actor`` subclass taking the constructor arguments the
    program passes (checked at spawn, as for any class).  Spawns made by actors
    in their procs are not patched (enter the patch there)::

        with patch_actor(Trainer, FakeTrainer):
            run_training()          # every mesh.spawn(..., Trainer) spawns FakeTrainer
    """

    def __init__(self, original: type, mock: type) -> None:
        for what, cls in (("original", original), ("mock", mock)):
            if not (isinstance(cls, type) and issubclass(cls, Actor)):
                raise TypeError(f"patch_actor({what}=...): an Actor subclass is needed, got {cls!r}")
        super().__init__(_patches.actor_patches, original, mock)
        self.original, self.mock = original, mock


def _local_procs(mesh: Any) -> Any:
    """patch_tensor_engine's default factory: procs of ``mesh``'s shape on this host, spawned by the actor."""
    from monarch_core.actor import this_host

    return this_host().spawn_procs(per_host=dict(mesh.sizes) or None, name="patched_tensor_engine")


class patch_tensor_engine(_patches.Patch[Callable[[Any], Any]]):
    """While entered, actors of ``actor_class`` that this process spawns run
    their tensor engine on ``mock_factory(proc_mesh)`` instead: each of their
    ``mesh.activate()`` calls (in ``__init__`` too) activates that mesh, made
    once per actor, in its proc, on first use.

    The reference's ``monarch._src.actor.mock.patch_tensor_engine`` (same forms as
    :class:`patch_actor`).  The default factory spawns, from the actor, a proc
    mesh of the same shape on the actor's host: the engine's code runs on local
    CPU procs of the actor's own, not on the mesh the program names (the
    reference's default is its GPU simulator, which monarch-core does not have).
    ``mock_factory`` must be picklable by cloudpickle (it travels with the spawn)::

        with patch_tensor_engine(Trainer, lambda mesh: this_host().spawn_procs({"gpus": 1})):
            trainer = procs.spawn("trainer", Trainer)
    """

    def __init__(self, actor_class: type, mock_factory: Optional[Callable[[Any], Any]] = None) -> None:
        if not (isinstance(actor_class, type) and issubclass(actor_class, Actor)):
            raise TypeError(f"patch_tensor_engine(actor_class=...): an Actor subclass is needed, got {actor_class!r}")
        factory = mock_factory if mock_factory is not None else _local_procs
        if not callable(factory):
            raise TypeError(f"patch_tensor_engine(mock_factory=...): a callable proc mesh -> mesh is needed, "
                            f"got {factory!r}")
        super().__init__(_patches.engine_patches, actor_class, factory)
        self.actor_class, self.mock_factory = actor_class, factory

#: What a library exception escaping a plugin should have been.
#: What a record layer returned by ``Stream.raw_socket`` must offer (see there).
RECORD_LAYER_METHODS = ("fileno", "send", "sendmsg", "recv", "recv_into", "shutdown", "getsockopt", "setsockopt",
                        "pending", "pending_output")

_MAP_HINT = (
    "map library errors at the plugin boundary into monarch_core.errors: ConnectError (connect), "
    "ConnectionClosed (a broken or closed stream), TransportError (listen, accept)"
)


def _leaf(e: BaseException) -> BaseException:
    """The exception of a nursery's group to report: the first kit verdict
    (``AssertionError``), else the first other one."""
    if not isinstance(e, BaseExceptionGroup):
        return e
    leaves = [_leaf(x) for x in e.exceptions]
    leaves = [x for x in leaves if not isinstance(x, trio.Cancelled)] or leaves
    return next((x for x in leaves if isinstance(x, AssertionError)), leaves[0])


def _verdict(what: str, e: BaseException, timeout: float, slow: str, expect: tuple) -> BaseException:
    """What an exception ``e`` escaping step ``what`` becomes."""
    leaf = _leaf(e)
    if isinstance(leaf, trio.TooSlowError):
        return AssertionError(f"{what}: did not finish within {timeout:g}s" + (f": {slow}" if slow else ""))
    if isinstance(leaf, (AssertionError, MonarchError, *expect)):
        return leaf
    return AssertionError(f"{what}: {type(leaf).__name__} escaped ({leaf}); {_MAP_HINT}")


@contextlib.contextmanager
def _step(what: str, timeout: float, *, slow: str = "", expect: tuple = ()) -> Iterator[None]:
    """Run one step of a kit: ``AssertionError`` naming ``what`` when it takes
    longer than ``timeout`` s (``slow``: the likely cause) or when an exception
    from outside ``monarch_core.errors`` (and ``expect``) escapes it."""
    try:
        with trio.fail_after(timeout):
            yield
    except Exception as e:  # noqa: BLE001 - turned into the kit's verdict
        _reraise(e, _verdict(what, e, timeout, slow, expect))


@contextlib.contextmanager
def _guard(what: str) -> Iterator[None]:
    """Name the method a non-monarch exception escapes from."""
    try:
        yield
    except Exception as e:  # noqa: BLE001
        _reraise(e, _verdict(what, e, 0, "", ()))


def _reraise(e: BaseException, v: BaseException) -> None:
    leaf = _leaf(e)
    if v is e:
        raise e
    if v is leaf:  # unwrap a nursery's group
        raise leaf from None
    raise v from (None if isinstance(leaf, trio.TooSlowError) else leaf)


async def _read_exactly(stream: Stream, n: int, who: str = "stream", *, max_bytes: int | None = None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        ask = n - len(buf) if max_bytes is None else max_bytes
        chunk = await stream.receive_some(ask)
        assert chunk, f"{who}.receive_some() returned end of stream after {len(buf)} of {n} bytes"
        assert len(chunk) <= ask, f"{who}.receive_some({ask}) returned {len(chunk)} bytes, more than max_bytes"
        buf += chunk
    return bytes(buf)


def _undelivered(n: str) -> str:
    return (
        f"the stream did not deliver {n}: does send_all write everything before it returns, without waiting "
        "for more data (a compressor must flush, e.g. zlib's Z_SYNC_FLUSH; a buffered writer must drain)?"
    )


async def check_stream_pair(a: Stream, b: Stream, *, big: int = 8 << 20, timeout: float = 5.0) -> None:
    """Checks on one connected pair of streams (``a`` dialled ``b``); see
    :func:`check_transport`.  Closes both."""
    with _step("a.send_all(b'ping'), then b.receive_some()", timeout, slow=_undelivered("4 bytes")):
        await a.send_all(b"ping")
        assert await _read_exactly(b, 4, "b") == b"ping", "bytes a->b differ"
    with _step("b.send_all(memoryview), then a.receive_some()", timeout, slow=_undelivered("4 bytes")):
        await b.send_all(memoryview(b"pong!")[:4])
        assert await _read_exactly(a, 4, "a") == b"pong", "bytes b->a (from a memoryview) differ"
    kib = os.urandom(1024)
    with _step("a.send_all(1 KiB), then b.receive_some(100) until all arrived", timeout, slow=_undelivered("1 KiB")):
        await a.send_all(kib)
        assert await _read_exactly(b, 1024, "b", max_bytes=100) == kib, "1 KiB a->b corrupted"
    got: list[bytes] = []

    async def pending_receive() -> None:
        got.append(await _read_exactly(a, 5, "a"))

    with _step("a.send_all() while a.receive_some() waits on the same stream", timeout,
               slow="send_all must be able to run beside a pending receive_some (the kernel reads "
                    "acknowledgements while it writes): do they share a lock?"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pending_receive)
            await trio.sleep(0.01)
            await a.send_all(b"hello")
            assert await _read_exactly(b, 5, "b") == b"hello", "bytes a->b differ"
            await b.send_all(b"world")
        assert got == [b"world"], f"a.receive_some() beside a.send_all() got {got!r}"
    payload = os.urandom(big)
    with _step(f"a.send_all({big} bytes) beside b.receive_into()", 4 * timeout, slow=_undelivered(f"{big} bytes")):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.send_all, payload)
            out = bytearray(big)
            view = memoryview(out)
            have = 0
            while have < big:
                n = await b.receive_into(view[have:])
                assert n > 0, f"b.receive_into() returned {n} after {have} of {big} bytes"
                have += n
        assert bytes(out) == payload, "large payload corrupted"
    with _step("raw_socket()", timeout, slow=_undelivered("3 bytes written to the raw socket")):
        for me, peer, name in ((a, b, "a"), (b, a, "b")):
            raw = me.raw_socket() if hasattr(me, "raw_socket") else None
            if raw is None:
                continue
            if isinstance(raw, _stdsocket.socket):
                assert not raw.getblocking(), f"{name}.raw_socket() is a blocking socket; the kernel needs it non-blocking"
            else:  # a record layer (TLS): the socket's interface, and what it holds back
                missing = [m for m in RECORD_LAYER_METHODS if not callable(getattr(raw, m, None))]
                assert not missing, (
                    f"{name}.raw_socket() returned {raw!r}: neither a socket.socket nor a record layer (it lacks "
                    f"{missing}; see hookspecs.Stream.raw_socket)"
                )
            sent = raw.send(b"raw")  # the kernel writes small messages this way
            assert sent == 3, f"{name}.raw_socket().send(b'raw') took {sent} bytes of an idle connection's 3"
            flushed = getattr(raw, "pending_output", None)
            assert flushed is None or flushed() == 0, f"{name}.raw_socket() held back bytes of an idle connection"
            assert await _read_exactly(peer, 3, "peer") == b"raw", (
                f"bytes written to {name}.raw_socket() arrive changed: a stream with its own framing, compression "
                "or encryption must return None from raw_socket(), or a record layer that applies it"
            )
    with _step("a.aclose() (twice)", timeout):
        await a.aclose()
        await a.aclose()  # idempotent
    with _step("b.receive_some() after the peer's aclose()", timeout,
               slow="expected end of stream (b'') once the peer closed"):
        end = await b.receive_some(100)
        assert end == b"", f"b.receive_some() after the peer's aclose() returned {end!r}, not end of stream (b'')"
    try:
        with _step("b.send_all() to a closed peer", timeout,
                   slow="writing to a stream whose peer closed neither failed with ConnectionClosed nor finished"):
            for _ in range(100):  # the peer is gone: writes must fail with ConnectionClosed
                await b.send_all(b"x" * 65536)
    except ConnectionClosed:
        pass
    with _step("b.aclose()", timeout):
        await b.aclose()


async def _cancelled_send(a: Stream, b: Stream, timeout: float) -> None:
    """A send_all the peer does not read, cancelled; then both close.

    The sends are 1 MiB each (a compressing stream does its CPU work per
    call, and cancellation is seen between calls), up to 32 MiB, more than
    loopback buffers hold, so the last one blocks and is cancelled after
    0.1 s.  Only ``aclose`` is held to ``timeout``: the sends to 4 times it
    (they may compress or encrypt megabytes on a loaded machine)."""
    chunk = os.urandom(1 << 20)
    with _step("a.send_all() of 1 MiB blocks the peer does not read, cancelled after 0.1 s", 4 * timeout,
               slow="a send_all blocked on a full socket must be cancellable"):
        with trio.move_on_after(0.1):
            for _ in range(32):
                await a.send_all(chunk)
    with _step("a.aclose() after a cancelled send_all", timeout,
               slow="after a cancelled send_all, aclose must still return promptly"):
        await a.aclose()
    with _step("b.aclose()", timeout):
        await b.aclose()


def _socket_path(address: str) -> str | None:
    rest = address.split("://", 1)[-1]
    return rest if rest.startswith("/") else None


async def check_transport(
    transport: Transport,
    bind_spec: str | None = None,
    *,
    bad_address: str | None = None,
    timeout: float = 5.0,
    big: int = 8 << 20,
) -> None:
    """Run every conformance check against ``transport`` (call from
    ``trio.run``); see the module docstring.  ``timeout``: seconds each step
    may take (the large payload gets four times that)."""
    name = type(transport).__name__
    spec = bind_spec or transport.default_bind_spec()
    with _step(f"{name}.listen({spec!r})", timeout):
        listener = await transport.listen(spec)
    try:
        address = listener.address
        assert address, "Listener.address is empty"
        with _step(f"{name}.normalize({address!r})", timeout):
            norm = transport.normalize(address)
        assert norm == address, f"normalize() changes the advertised address {address!r} into {norm!r}"
        dialled: dict[int, Stream] = {}
        accepted: dict[int, Stream] = {}

        async def dial(i: int) -> None:
            with _guard(f"{name}.connect({address!r})"):
                s = await transport.connect(address)
            dialled[i] = s
            with _guard("Stream.send_all() of a dialled stream"):
                await s.send_all(bytes([i]))

        async def serve(s: Stream) -> None:
            with _guard("Stream.receive_some() of an accepted stream"):
                accepted[(await _read_exactly(s, 1, "accepted stream"))[0]] = s

        with _step(f"three concurrent {name}.connect({address!r}), listener.accept() and a 1-byte exchange each",
                   2 * timeout, slow="the listener accepted fewer than 3, or " + _undelivered("their first byte")):
            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(dial, i)
                for _ in range(3):
                    with _guard("Listener.accept()"):
                        nursery.start_soon(serve, await listener.accept())
        assert sorted(accepted) == [0, 1, 2], f"three connections delivered {sorted(accepted)}"
        await _cancelled_send(dialled[1], accepted[1], timeout)
        with _step("Stream.aclose()", timeout):
            await dialled[2].aclose()
            await accepted[2].aclose()
        await check_stream_pair(dialled[0], accepted[0], big=big, timeout=timeout)
    finally:
        with _step("Listener.aclose() (twice)", timeout):
            await listener.aclose()
            await listener.aclose()
    path = _socket_path(address)
    assert path is None or not os.path.lexists(path), (
        f"the closed listener of {address} left {path} behind: remove the socket file in Listener.aclose()"
    )
    with _step(f"{name}.child_bind_spec({address!r})", timeout):
        child = transport.child_bind_spec(address)
        assert isinstance(child, str) and child, f"child_bind_spec({address!r}) returned {child!r}, not a bind spec"
        transport.normalize(child)
        child_listener = await transport.listen(child)
        child_address = child_listener.address
        await child_listener.aclose()
    assert child_address and child_address != address, (
        f"a listener on child_bind_spec({address!r}) = {child!r} advertises {child_address!r}: procs need an "
        "address of their own"
    )
    path = _socket_path(child_address)
    assert path is None or not os.path.lexists(path), f"the closed listener of {child_address} left {path} behind"
    garbage = "\0 not an address \0"
    try:
        with _step(f"{name}.normalize({garbage!r})", timeout, expect=(ValueError,)):
            transport.normalize(garbage)
    except ValueError:
        pass
    else:
        raise AssertionError(f"normalize({garbage!r}) accepted garbage instead of raising ValueError")
    target = bad_address or address  # the closed listener's address: nothing listens there now
    try:
        with _step(f"{name}.connect({target!r}) where nothing listens", timeout,
                   slow="connecting where nothing listens must fail (ConnectError), not wait"):
            s = await transport.connect(target)
    except ConnectError as e:
        where = target.split("://", 1)[-1]
        assert target in str(e) or where in str(e), f"ConnectError does not name {target}: {e}"
        assert bad_address is not None or e.refused, (
            f"connect() to {target} (a closed listener) raised ConnectError without refused=True: pass "
            "refused=True when the peer's host answers that nothing listens there (ECONNREFUSED, no socket "
            "file); the kernel counts refusals to tell a dead proc"
        )
    except TransportError as e:
        raise AssertionError(f"connect() to a dead address raised {type(e).__name__}, not ConnectError: {e}") from None
    else:
        await s.aclose()
        raise AssertionError(f"connect() to {target} (nothing listening) succeeded")


# ---------------------------------------------------------------- schedulers


class _Probe(Actor):
    """What :func:`check_scheduler` spawns on every host."""

    @endpoint
    def where(self) -> tuple:
        import socket

        return (socket.gethostname(), os.getpid())

    @endpoint
    def busy(self, seconds: float) -> int:
        """Work for ``seconds`` (computing, and printing a line every half
        second) without a message in or out; the number of lines printed."""
        import time

        end = time.monotonic() + seconds
        lines, nxt, x = 0, 0.0, 0
        while (now := time.monotonic()) < end:
            x = (x * 31 + 7) % 1000003  # the GIL is taken and given back, as real work does
            if now >= nxt:
                print(f"check_scheduler busy: {end - now:.1f}s to go", flush=True)
                lines, nxt = lines + 1, now + 0.5
        return lines


class _WatchedScheduler:
    """``scheduler`` as the core sees it, with each ``launch.report_lost``
    call of its ``allocate`` recorded in ``reports`` (host name, reason)."""

    def __init__(self, scheduler, reports: list, reported) -> None:
        import dataclasses
        import inspect

        self._inner = scheduler
        inner = scheduler.allocate

        def watch(launch):
            def report_lost(host, reason):
                reports.append((getattr(host, "name", host), str(reason)))
                reported.set()
                launch.report_lost(host, reason)

            return dataclasses.replace(launch, report_lost=report_lost)

        from monarch_core._launch import _alloc

        if not _alloc._takes_launch(inner):  # the first contract, allocate(request): nothing to watch
            self.allocate = inner
        elif inspect.iscoroutinefunction(inner):
            async def allocate_async(request, launch):
                return await inner(request, watch(launch))

            self.allocate = allocate_async
        else:
            def allocate(request, launch):
                return inner(request, watch(launch))

            self.allocate = allocate

    def __getattr__(self, attr: str):
        return getattr(self._inner, attr)


def check_scheduler(
    scheduler,
    params,
    *,
    timeout: float = 120.0,
    bad_params=None,
    lose_host=None,
    name: str = "conformance",
    idle: float = 0.0,
) -> None:
    """Conformance checks for a scheduler plugin, through the core's own
    allocation path (the one ``hosts_from_config`` takes).

    Blocking; call it from a client (test) process.  ``params``: a valid
    configuration for a small allocation (two hosts or more for the lost-host
    check).  Checks, each bounded by ``timeout`` seconds (an
    ``AssertionError`` saying which step did not finish, never a hang):

    * ``validate(params)`` passes; ``validate(bad_params)`` (if given) raises
      ``ConfigError`` naming the request's source;
    * ``allocate`` returns, off the kernel loop, hosts with unique names, an
      extent matching them and addresses in the client's transport, whose
      worker loops all answer (the core's readiness step);
    * ``HostMesh.to_table()`` names every host; a proc spawned per host
      answers from that host;
    * ``HostMesh.stop()`` keeps the worker loops (they answer again, and
      procs spawn on them again);
    * with ``idle`` > 0 (seconds; the long-idle check): the host mesh kept
      idle -- no message at all -- for ``idle`` s, then every host answers;
      then one call per host that works (computes and prints) for ``idle``
      s, answered; and no host reported lost, no ``MeshFailure``, meanwhile.
      Make ``idle`` several times every timeout silence could trip (see the
      module docstring), shortened through parameters and settings;
    * with ``lose_host`` (a callable taking the ``HostHandle`` of the last
      host, ending it by the scheduler's own means: kill its worker
      process, close its channel): the scheduler calls
      ``WorkerLaunch.report_lost`` for that host (and no other) within the
      timeout, a ``MeshFailure`` arrives for the procs of that host only,
      and the other hosts keep answering;
    * ``HostMesh.shutdown()`` calls ``Allocation.release()`` exactly once,
      and it returns within ``MONARCH_RELEASE_TIMEOUT`` (the core moves on
      after that, leaving whatever the scheduler still held).
    """
    import threading
    import time

    import monarch_core.actor as api
    from monarch_core._actor import _mesh
    from monarch_core._launch import _start
    from monarch_core._proc import _state
    from monarch_core._launch import _alloc
    from monarch_core.errors import AllocationError, ConfigError
    from monarch_core.hookspecs import AllocationRequest

    source = f"<check_scheduler {name}>"
    request = AllocationRequest(name=name, params=dict(params), source=source)
    scheduler.validate(request)
    if bad_params is not None:
        try:
            scheduler.validate(AllocationRequest(name=name, params=dict(bad_params), source=source))
        except ConfigError as e:
            assert source in str(e), f"validate()'s ConfigError does not name the source {source!r}: {e}"
        else:
            raise AssertionError(f"validate({bad_params!r}) accepted bad parameters instead of raising ConfigError")
    _start.ensure_runtime()
    rt = _state.current()
    t0 = time.monotonic()
    reports: list = []
    reported = threading.Event()
    try:
        record = _alloc.allocate(_WatchedScheduler(scheduler, reports, reported), request, rt, timeout)
    except AllocationError as e:
        raise AssertionError(f"allocation through the core failed: {e}") from e
    alloc = record.allocation
    releases = []
    released = threading.Event()
    original_release = alloc.release

    def counting_release():
        releases.append(time.monotonic())
        try:
            return original_release()
        finally:
            released.set()

    # The wrapper keeps sync/async-ness: _call awaits what it returns.
    alloc.release = counting_release
    hm = _mesh.host_mesh_of(record, name)
    shut = False
    try:
        hosts = list(record.hosts)
        table = hm.to_table()
        for h in hosts:
            assert h.name in table, f"HostMesh.to_table() does not name host {h.name!r}:\n{table}"
        probe = _Probe

        def ask(pm, what):
            left = max(1.0, timeout - (time.monotonic() - t0))
            try:
                return pm.spawn("probe", probe).where.call().get(timeout=left)
            except TimeoutError:
                raise AssertionError(f"{what}: the procs did not answer within {left:.0f}s") from None

        pm = hm.spawn_procs(name="check")
        got = ask(pm, "first spawn_procs")
        assert len(got) == len(hosts), f"expected one answer per host ({len(hosts)}), got {len(got)}"
        try:
            hm.stop().get(timeout=timeout)
        except TimeoutError:
            raise AssertionError(f"HostMesh.stop() did not finish within {timeout:.0f}s") from None
        assert not releases, "HostMesh.stop() released the allocation; it must keep the worker loops"
        try:
            _alloc.wait_ready(rt, hosts, timeout, what="after HostMesh.stop()")
        except AllocationError as e:
            raise AssertionError(f"worker loops did not survive HostMesh.stop(): {e}") from e
        pm = hm.spawn_procs(name="again")
        ask(pm, "spawn_procs after HostMesh.stop()")
        if idle > 0:
            _long_idle(hm, idle, timeout, reports, probe)
        if lose_host is not None:
            assert len(hosts) >= 2, "the lost-host check needs an allocation of two hosts or more"
            failures = []
            seen = threading.Event()
            saved = api.unhandled_fault_hook

            def record_failure(failure):
                failures.append(failure)
                seen.set()

            api.unhandled_fault_hook = record_failure
            try:
                victim = hosts[-1]
                pm = hm.spawn_procs(name="lose")
                mesh = pm.spawn("probe", probe)
                mesh.where.call().get(timeout=timeout)
                before = len(reports)
                lose_host(victim)
                lost_at = time.monotonic()
                while not any(h == victim.name for h, _ in reports[before:]):
                    left = timeout - (time.monotonic() - lost_at)
                    if left <= 0:
                        got = ("; a MeshFailure did arrive, which only says the core saw the procs go: the "
                               "scheduler must say the host is gone" if seen.is_set() else "")
                        raise AssertionError(
                            f"the scheduler did not call WorkerLaunch.report_lost({victim.name!r}, reason) within "
                            f"{timeout:.0f}s after host {victim.name!r} was lost{got}. Watch each worker (its "
                            "process, channel or job step) and call launch.report_lost(host_name, reason) when it "
                            "ends before release()"
                        )
                    reported.wait(min(0.2, left))
                    reported.clear()
                if not seen.wait(max(1.0, timeout - (time.monotonic() - lost_at))):
                    raise AssertionError(
                        f"no MeshFailure within {timeout:.0f}s after host {victim.name!r} was lost (and reported "
                        "lost by the scheduler)"
                    )
                time.sleep(0.5)  # any wrong extra report would come now
                wrong = [(h, r) for h, r in reports[before:] if h != victim.name]
                assert not wrong, f"only host {victim.name!r} was lost, but the scheduler reported {wrong}"
                for f in failures:
                    proc = f.events[0]["proc"]
                    assert proc.endswith(f"on host {victim.name}"), (
                        f"a MeshFailure names {proc!r}, not a proc on the lost host {victim.name!r}:\n{f.report()}"
                    )
                rest = mesh.slice(**{record.labels[-1]: 0}) if len(record.labels) == 1 else None
                if rest is not None:
                    rest.where.call().get(timeout=timeout)
            finally:
                api.unhandled_fault_hook = saved
        shut = True
        limit = _alloc.RELEASE_TIMEOUT
        try:
            hm.shutdown().get(timeout=timeout + limit)
        except TimeoutError:
            raise AssertionError("HostMesh.shutdown() did not finish (Allocation.release() hangs?)") from None
        assert len(releases) == 1, f"Allocation.release() was called {len(releases)} times on shutdown, not once"
        if not released.wait(max(0.0, releases[0] + limit - time.monotonic())):
            raise AssertionError(
                f"Allocation.release() did not return within {limit:g}s (MONARCH_RELEASE_TIMEOUT): the core gave "
                "up on it, leaving whatever it still holds (jobs, connections, worker processes). Bound every "
                "wait in release() (kill what does not end in time) and return"
            )
    finally:
        if not shut:
            try:
                hm.shutdown().get(timeout=timeout)
            except Exception:  # noqa: BLE001 - the first failure is the one to report
                pass


def _long_idle(hm, idle: float, timeout: float, reports: list, probe) -> None:
    """The long-idle check of :func:`check_scheduler` (see its docstring)."""
    import threading

    import monarch_core.actor as api

    failures: list = []
    saved = api.unhandled_fault_hook
    api.unhandled_fault_hook = failures.append
    try:
        pm = hm.spawn_procs(name="idle")
        mesh = pm.spawn("probe", probe)
        n = len(mesh.where.call().get(timeout=timeout))

        def quiet(what: str) -> None:
            assert not reports, (
                f"{what}, the scheduler reported {reports} lost: a silence timeout (an SSH channel's read "
                "timeout taken for its end, keepalives, a heartbeat) tripped while nothing was wrong"
            )
            assert not failures, f"{what}, a MeshFailure arrived:\n{failures[0].report()}"

        threading.Event().wait(idle)  # not one message, in or out, on purpose
        quiet(f"with the host mesh idle for {idle:g}s")
        try:
            got = mesh.where.call().get(timeout=timeout)
        except Exception as e:  # noqa: BLE001 - the verdict names it
            raise AssertionError(f"after {idle:g}s idle, the hosts did not answer: {type(e).__name__}: {e}") from e
        assert len(got) == n, f"after {idle:g}s idle, {len(got)} of {n} procs answered"
        try:
            lines = mesh.busy.call(idle).get(timeout=idle + timeout)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"a call working for {idle:g}s on every host failed: {type(e).__name__}: {e}") from e
        assert all(v >= 1 for v in lines.values()), f"the busy call returned {lines}"
        quiet(f"with the host mesh busy for {idle:g}s")
        got = mesh.where.call().get(timeout=timeout)
        assert len(got) == n, f"after {idle:g}s busy, {len(got)} of {n} procs answered"
        pm.stop().get(timeout=timeout)
    finally:
        api.unhandled_fault_hook = saved
