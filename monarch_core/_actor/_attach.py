"""``attach``: a ``HostMesh`` over worker loops that are already running (``worker.attach_to_workers``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from monarch_core._kernel._runtime import Kernel

from monarch_core import _telemetry, settings
from monarch_core._actor import _state
from monarch_core._actor._host_mesh import HostMesh, _HostMeshOwnership
from monarch_core._actor._port import OneReply
from monarch_core._kernel import _control as C
from monarch_core._kernel import _wire as W
from monarch_core._launch._spawn import host_proc_id
from monarch_core._mesh._shape import Extent

ATTACH_TIMEOUT: float = settings.get("MONARCH_ATTACH_TIMEOUT")


def _live_session(kernel: Kernel, proc_id: str) -> Any:
    """The kernel's outbound session to ``proc_id`` if one runs (loop thread)."""
    out = kernel._outbound.get(proc_id)
    return out if out is not None and out.failed is None else None


def _close_sessions(kernel: Kernel, proc_ids: set[str], why: str) -> None:
    """End the outbound sessions to ``proc_ids``: no more connection attempts,
    and whatever they still carry fails with ``ConnectError(why)``."""
    from monarch_core.errors import ConnectError

    async def close() -> None:
        for pid in proc_ids:
            out = _live_session(kernel, pid)
            if out is not None:
                out.fail(ConnectError(why))

    if proc_ids:
        try:
            kernel.run(close)
        except RuntimeError:  # the kernel is gone, and its sessions with it
            pass


def attach(
    workers: Any, *, ca: str | None, private_key: str | None, cert: str | None, timeout: float | None
) -> HostMesh:
    """See :func:`monarch_core.worker.attach_to_workers`."""
    from monarch_core._actor import _transport
    from monarch_core.errors import ConnectError

    if isinstance(workers, str) or not workers:
        raise TypeError(
            "attach_to_workers(workers=[...]) takes a non-empty list of worker addresses such as "
            "['tls://h1:29500', 'tls://h2:29500']"
        )
    addrs = list(workers)
    schemes = set()
    for a in addrs:
        if not isinstance(a, str) or "://" not in a:
            raise ValueError(f"attach_to_workers: {a!r} is not a worker address such as 'tls://h1:29500'")
        schemes.add(a.split("://", 1)[0])
    if len(schemes) != 1:
        raise ValueError(f"attach_to_workers: all workers must use one transport, got {sorted(schemes)}")
    scheme = schemes.pop()
    from monarch_core._plugins import registry

    transport = registry().transport(scheme)
    if (ca, private_key, cert) != (None, None, None):
        transport.set_credentials(ca=ca, cert=cert, key=private_key)
    for a in addrs:
        transport.normalize(a)
    if _state.current_runtime_or_none() is None and _transport.enabled_choice() is None:
        _transport.enable_transport(scheme)
    rt = _state.runtime()
    if rt.transport != transport.name:
        raise RuntimeError(
            f"attach_to_workers: the workers speak {transport.name!r} but this process enabled {rt.transport!r}; "
            f"call enable_transport('{transport.name}://<this host's address>:0') first"
        )
    kernel = rt.kernel
    limit = ATTACH_TIMEOUT if timeout is None else float(timeout)
    waits = []
    for a in addrs:
        h = OneReply(kernel, "")
        h.proc_id = host_proc_id(a)
        waits.append((a, h.proc_id, h))

    async def say_hello() -> set[str]:
        # on the loop, so that the sessions the hellos open are known exactly
        opened = {hid for _a, hid, _h in waits if _live_session(kernel, hid) is None}
        for a, hid, h in waits:
            kernel.send(hid, a, W.K_CONTROL, 0,
                        C.encode(C.HostHello((rt.proc_id, kernel.address, h.port_id))), b"", [], h.port_id)
        return opened

    opened = kernel.run(say_hello)
    deadline = time.monotonic() + limit
    hosts = []
    try:
        for a, hid, h in waits:
            if not h.cell.wait(max(0.0, deadline - time.monotonic())):
                last = kernel.last_error(hid)
                raise ConnectError(
                    f"worker {a} did not answer within {limit:.0f}s"
                    + (f" (last error: {last})" if last is not None else "")
                    + ". Is `python -m monarch_core.worker --address "
                    + a
                    + "` running there, and reachable from this host? (MONARCH_ATTACH_TIMEOUT sets the wait)"
                )
            try:
                info = h.cell.result()
            except Exception as e:
                raise ConnectError(f"worker {a} could not be reached: {e}") from None
            from monarch_core.hookspecs import HostHandle

            hosts.append(HostHandle(name=str(info.get("hostname", a)), address=a))
    except BaseException as e:
        # Nothing of a failed attach may live on: a session to a worker that
        # rejects this client (or is not there) would keep reconnecting.
        _close_sessions(kernel, opened, f"attach_to_workers gave up: {e}")
        raise
    region = Extent(["hosts"], [len(hosts)]).region
    hm = HostMesh(hosts, region, owner=True, name="workers")
    _telemetry.lifecycle("host_mesh.spawned", mesh="workers", hosts=[h.name for h in hosts], scheduler="attach")
    rt.agent.register_owned(_HostMeshOwnership(hm))
    return hm
