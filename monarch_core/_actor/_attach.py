"""``attach``: a ``HostMesh`` over worker loops that are already running (``worker.attach_to_workers``)."""

from __future__ import annotations

from typing import Any, Sequence

from monarch_core import settings
from monarch_core._launch import _start
from monarch_core._proc import _state
from monarch_core._actor import FORK_SERVER_WARM
from monarch_core._actor._host_mesh import HostMesh
from monarch_core._launch import _alloc
from monarch_core._mesh._shape import Extent
from monarch_core.errors import ConnectError

ATTACH_TIMEOUT: float = settings.get("MONARCH_ATTACH_TIMEOUT")



def attach_to_workers(
    workers: Sequence[str],
    ca: str | None = None,
    private_key: str | None = None,
    *,
    cert: str | None = None,
    timeout: float | None = None,
) -> HostMesh:
    """A ``HostMesh`` over running worker loops (one host per address).

    The transport of the addresses (``tcp``/``tls``) must be the enabled one;
    if none is enabled yet it is enabled now.  With TLS the client presents
    ``private_key`` (and ``cert``) signed by the worker's CA and verifies the
    worker against ``ca``.  An unreachable worker raises ``ConnectError``
    naming its address within ``timeout`` seconds (default
    ``MONARCH_ATTACH_TIMEOUT`` or 10).
    """
    return attach(workers, ca=ca, private_key=private_key, cert=cert, timeout=timeout)


def run_worker_loop_forever(
    address: str,
    ca: str | None = None,
    private_key: str | None = None,
    *,
    cert: str | None = None,
    insecure_tcp: bool = False,
    exit_with_parent: bool = False,
) -> None:
    """Serve as the worker loop of this host at ``address`` until shut down
    (``HostMesh.shutdown()``); its procs start from a fork server that has
    imported the actor API.  The contract is
    :func:`monarch_core._launch._worker.run_worker_loop_forever`'s: TLS from
    ``ca``/``private_key``/``cert``, a plain ``tcp://`` address only on
    loopback unless ``insecure_tcp=True``, ``exit_with_parent``."""
    from monarch_core._launch import _fork_server, _worker  # (lazily: importing the API loads no trio)

    _fork_server.warm(FORK_SERVER_WARM)
    _worker.run_worker_loop_forever(address, ca, private_key, cert=cert, insecure_tcp=insecure_tcp,
                                    exit_with_parent=exit_with_parent)


def run_worker_loop_until_shutdown(
    address: str,
    ca: str | None = None,
    private_key: str | None = None,
    *,
    cert: str | None = None,
    insecure_tcp: bool = False,
) -> None:
    """The reference's name for a worker loop that returns once its owning
    ``HostMesh`` shuts it down: :func:`run_worker_loop_forever` does (it
    never ends the process), so this is the same loop, with the same
    arguments (``address`` may carry a service id: ``ID@tcp://...``)."""
    run_worker_loop_forever(address, ca, private_key, cert=cert, insecure_tcp=insecure_tcp)


def attach(
    workers: Any, *, ca: str | None, private_key: str | None, cert: str | None, timeout: float | None
) -> HostMesh:
    """See :func:`attach_to_workers`."""
    from monarch_core._proc import _transport

    if isinstance(workers, str) or not workers:
        raise TypeError(
            "attach_to_workers(workers=[...]) takes a non-empty list of worker addresses such as "
            "['tls://h1:29500', 'tls://h2:29500']"
        )
    from monarch_core._launch._worker import split_service_id

    expected: dict[str, str] = {}  # address -> the service id the caller named for it (``ID@address``)
    addrs = []
    for w in workers:
        sid, a = split_service_id(w) if isinstance(w, str) else (None, w)
        if sid is not None:
            expected[a] = sid
        addrs.append(a)
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
    _start.ensure_runtime()
    rt = _state.current()
    if rt.transport != transport.name:
        raise RuntimeError(
            f"attach_to_workers: the workers speak {transport.name!r} but this process enabled {rt.transport!r}; "
            f"call enable_transport('{transport.name}://<this host's address>:0') first"
        )
    limit = ATTACH_TIMEOUT if timeout is None else float(timeout)
    answers, missing = _alloc.hello_workers(rt, addrs, limit)
    for a in addrs:  # the first that failed, in the caller's order
        if a not in missing:
            continue
        kind, detail = missing[a]
        if kind == "failed":
            raise ConnectError(f"worker {a} could not be reached: {detail}")
        raise ConnectError(
            f"worker {a} did not answer within {limit:.0f}s"
            + (f" (last error: {detail})" if detail is not None else "")
            + ". Is `python -m monarch_core.worker --address "
            + a
            + "` running there, and reachable from this host? (MONARCH_ATTACH_TIMEOUT sets the wait)"
        )
    for a, sid in expected.items():
        told = answers[a].get("service")
        if told != sid:
            raise ConnectError(
                f"worker {sid}@{a}: the worker loop at {a} is "
                + (f"service {told}" if told else "one started without a service id")
                + f", not {sid}: attach to the address it was started with (python -m monarch_core.worker "
                "--address ID@ADDRESS, or run_worker_loop_forever('ID@ADDRESS'))")
    from monarch_core.hookspecs import HostHandle

    hosts = [HostHandle(name=str(answers[a].get("hostname", a)), address=a) for a in addrs]
    region = Extent(["hosts"], [len(hosts)]).region
    hm = HostMesh(hosts, region, owner=True, name="workers")
    rt.events.emit("host_mesh_spawned", mesh="workers", hosts=[h.name for h in hosts], scheduler="attach")
    rt.agent.register_owned(hm)
    return hm
