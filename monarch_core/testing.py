"""Conformance checks for transport plugins (a public, supported module).

Every transport the project ships runs these in its own tests; third-party
transports should too::

    import trio
    from monarch_core.testing import check_transport
    from my_transport.plugin import DirTransport

    def test_conformance():
        trio.run(check_transport, DirTransport(), "dir:///tmp/monarch-test-sock")

:func:`check_transport` listens on ``bind_spec`` (default: the transport's
``default_bind_spec()``), connects to the advertised address, and checks:
ordered bytes both ways; a large payload received with ``receive_into``;
end of stream after the peer closes (``b""``/0, not an exception);
``ConnectionClosed`` (not ``OSError``/trio errors) when writing to a closed
stream; ``aclose`` idempotent; several concurrent connections; a bad or dead
address raising ``ConnectError`` that names it; ``normalize`` rejecting
garbage with ``ValueError``.  It raises ``AssertionError`` describing the
first violation.

Scheduler plugins run :func:`check_scheduler` (a blocking call, from a
client process whose enabled transport is the one the workers should use)::

    from monarch_core.testing import check_scheduler
    from my_sched.plugin import FixedWorkers

    def test_conformance():
        check_scheduler(FixedWorkers(), {"hosts": 2}, bad_params={"hosts": "two"},
                        lose_host=lambda host: kill_worker_of(host))
"""

from __future__ import annotations

import os

import trio

from monarch_core.actor import Actor, endpoint
from monarch_core.errors import ConnectError, ConnectionClosed, TransportError
from monarch_core.hookspecs import Stream, Transport

__all__ = ["check_scheduler", "check_stream_pair", "check_transport"]


async def _read_exactly(stream: Stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        assert chunk, f"stream ended after {len(buf)} of {n} bytes"
        buf += chunk
    return bytes(buf)


async def check_stream_pair(a: Stream, b: Stream, *, big: int = 8 << 20) -> None:
    """Checks on one connected pair of streams (``a`` dialled ``b``)."""
    await a.send_all(b"ping")
    assert await _read_exactly(b, 4) == b"ping", "bytes a->b differ"
    await b.send_all(memoryview(b"pong!")[:4])
    assert await _read_exactly(a, 4) == b"pong", "bytes b->a (from a memoryview) differ"
    payload = os.urandom(big)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(a.send_all, payload)
        out = bytearray(big)
        view = memoryview(out)
        have = 0
        while have < big:
            n = await b.receive_into(view[have:])
            assert n > 0, f"receive_into returned {n} after {have} of {big} bytes"
            have += n
    assert bytes(out) == payload, "large payload corrupted"
    await a.aclose()
    await a.aclose()  # idempotent
    end = await b.receive_some(100)
    assert end == b"", f"expected end of stream (b''), got {end!r}"
    try:
        with trio.fail_after(5):
            for _ in range(100):  # the peer is gone: writes must fail with ConnectionClosed
                await b.send_all(b"x" * 65536)
    except ConnectionClosed:
        pass
    except trio.TooSlowError:
        raise AssertionError("writing to a stream whose peer closed neither failed nor finished") from None
    await b.aclose()


async def check_transport(transport: Transport, bind_spec: str | None = None, *, bad_address: str | None = None) -> None:
    """Run every conformance check against ``transport`` (call from ``trio.run``)."""
    spec = bind_spec or transport.default_bind_spec()
    listener = await transport.listen(spec)
    try:
        address = listener.address
        assert address, "Listener.address is empty"
        assert transport.normalize(address) == address, "normalize() changes the advertised address"
        dialled = [await transport.connect(address) for _ in range(3)]  # the backlog holds them
        with trio.fail_after(10):
            accepted = [await listener.accept() for _ in range(3)]
        for i, a in enumerate(dialled):
            await a.send_all(bytes([i]))
        got = []
        for b in accepted:
            got.append((await _read_exactly(b, 1))[0])
        assert sorted(got) == [0, 1, 2], f"three connections delivered {got}"
        pairs = {g: b for g, b in zip(got, accepted)}
        accepted = [pairs[i] for i in range(3)]
        for s in dialled[1:] + accepted[1:]:
            await s.aclose()
        await check_stream_pair(dialled[0], accepted[0])
    finally:
        await listener.aclose()
        await listener.aclose()
    try:
        transport.normalize("\0 not an address \0")
    except ValueError:
        pass
    else:
        raise AssertionError("normalize() accepted garbage instead of raising ValueError")
    target = bad_address or address  # the closed listener's address: nothing listens there now
    try:
        s = await transport.connect(target)
    except ConnectError as e:
        assert target in str(e) or target.split("://", 1)[-1] in str(e), f"ConnectError does not name {target}: {e}"
    except TransportError as e:
        raise AssertionError(f"connect() to a dead address raised {type(e).__name__}, not ConnectError") from None
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


def check_scheduler(
    scheduler,
    params,
    *,
    timeout: float = 120.0,
    bad_params=None,
    lose_host=None,
    name: str = "conformance",
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
    * with ``lose_host`` (a callable taking the ``HostHandle`` of the last
      host, ending it by the scheduler's own means: kill its worker
      process, close its channel): a ``MeshFailure`` arrives for the procs of
      that host only -- which needs the scheduler to call
      ``WorkerLaunch.report_lost`` -- and the other hosts keep answering;
    * ``HostMesh.shutdown()`` calls ``Allocation.release()`` exactly once,
      and it returns within the timeout.
    """
    import threading
    import time

    import monarch_core.actor as api
    from monarch_core._actor import _mesh, _state
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
    rt = _state.runtime()
    t0 = time.monotonic()
    try:
        record = _alloc.allocate(scheduler, request, rt, timeout)
    except AllocationError as e:
        raise AssertionError(f"allocation through the core failed: {e}") from e
    alloc = record.allocation
    releases = []
    original_release = alloc.release

    def counting_release():
        releases.append(time.monotonic())
        return original_release()

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
                lose_host(victim)
                if not seen.wait(timeout):
                    raise AssertionError(
                        f"no MeshFailure within {timeout:.0f}s after host {victim.name!r} was lost; the scheduler "
                        "must call WorkerLaunch.report_lost(host_name, reason) when a host goes away"
                    )
                time.sleep(0.5)  # any wrong extra report would come now
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
        try:
            hm.shutdown().get(timeout=timeout + _alloc.RELEASE_TIMEOUT)
        except TimeoutError:
            raise AssertionError("HostMesh.shutdown() did not finish (Allocation.release() hangs?)") from None
        assert len(releases) == 1, f"Allocation.release() was called {len(releases)} times on shutdown, not once"
    finally:
        if not shut:
            try:
                hm.shutdown().get(timeout=timeout)
            except Exception:  # noqa: BLE001 - the first failure is the one to report
                pass
