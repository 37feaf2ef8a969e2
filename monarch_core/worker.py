"""The host worker loop: ``python -m monarch_core.worker --address URL``.

A worker loop runs on each host of a multi-host job (schedulers such as SSH
and Slurm start it; you can start it by hand).  It listens on ``address``,
accepts clients -- with ``tls://`` only clients whose certificate chains to
its CA -- and starts procs for them on request
(``attach_to_workers([...]).spawn_procs(...)``).  When a client goes away,
the worker kills every proc it started for that client and keeps serving
the next one.  ``HostMesh.shutdown()`` ends it.

Use ``tls://`` between hosts.  Plain ``tcp://`` authenticates nobody: anyone
who can reach a plain ``tcp`` worker port (or the port of a proc it started)
can run arbitrary code as the worker's user.  So a ``tcp`` worker loop binds
loopback only (``tcp://127.0.0.1:PORT``, ``tcp://[::1]:PORT``,
``tcp://localhost:PORT``), and so do its procs, unless it is started with
``--insecure-tcp`` (``insecure_tcp=True``) on a network you trust.

Example::

    # on each host
    python -m monarch_core.worker --address tls://h1:29500 \\
        --ca ca.pem --cert h1.pem --key h1.key

    # in the client
    from monarch_core.actor import enable_transport
    from monarch_core.worker import attach_to_workers
    enable_transport("tls://client-host:0")
    hosts = attach_to_workers(["tls://h1:29500", "tls://h2:29500"], ca="ca.pem", private_key="client.pem")
    procs = hosts.spawn_procs(per_host={"gpus": 4})
"""

from __future__ import annotations

import argparse
import functools
import getpass
import ipaddress
import logging
import os
import re
import sys
from typing import Sequence

from monarch_core._actor._tls import apply_credentials

__all__ = ["attach_to_workers", "main", "run_worker_loop_forever"]

logger = logging.getLogger("monarch.worker")

_HOSTPORT = re.compile(r"^(?:\[(?P<v6>[^\]]*)\]|(?P<host>[^\[\]:/@]*)):\d+$")


def _tcp_host(url: str) -> str | None:
    """The host of ``tcp://HOST:PORT``; ``None`` when it is not of that form."""
    if not url.startswith("tcp://"):
        return None
    m = _HOSTPORT.match(url[len("tcp://"):])
    if m is None:
        return None
    return m.group("v6") if m.group("v6") is not None else m.group("host")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _is_loopback(host: str) -> bool:
    """Only loopback literals and ``localhost`` (no name is looked up)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no name for this uid
        return f"uid {os.getuid()}"


def _check_tcp_bind(address: str, insecure_tcp: bool) -> str | None:
    """Refuse a plain ``tcp://`` worker loop that would listen beyond
    loopback unless ``insecure_tcp`` (then warn).  Returns the bind spec of
    the procs it starts when they must stay on loopback too, else ``None``
    (the transport's default for children)."""
    if address.split("://", 1)[0] != "tcp":
        return None
    public, _, bind = address.rpartition("@")  # the alias form binds its right-hand side
    host = _tcp_host(bind)
    if host is None or (public and _tcp_host(public) is None):
        return None  # malformed: the transport's own error says how
    if _is_loopback(host):
        if public:  # advertise what the worker loop advertises (a tunnel's end, say)
            return f"tcp://{_url_host(_tcp_host(public) or host)}:0@tcp://{_url_host(host)}:0"
        return f"tcp://{_url_host(host)}:0"
    where = "every interface" if host in ("*", "0.0.0.0", "::") else repr(host)
    if not insecure_tcp:
        raise ValueError(
            f"refusing to start a worker loop on plain tcp at {address}: it would listen on {where}, not only "
            "on loopback, and tcp authenticates nobody: anyone who can reach a plain tcp worker port can run "
            f"arbitrary code on this host as {_user()}. Use tls:// with --ca/--key (ca=/private_key=), or pass "
            "--insecure-tcp (insecure_tcp=True) on a network you trust"
        )
    logger.warning(
        "INSECURE: worker loop on plain tcp at %s (listening on %s, --insecure-tcp/insecure_tcp=True): nothing is "
        "authenticated; anyone who can reach this port or its procs' ports can run arbitrary code on this host "
        "as %s. Use tls:// unless every host that can reach it is trusted.",
        address, where, _user(),
    )
    return None


def run_worker_loop_forever(
    address: str,
    ca: str | None = None,
    private_key: str | None = None,
    *,
    cert: str | None = None,
    insecure_tcp: bool = False,
) -> None:
    """Serve as the worker loop of this host at ``address`` until shut down.

    ``ca``, ``private_key`` (and optionally ``cert``, when the key file does
    not also hold the certificate) configure TLS for ``tls://`` addresses:
    each is a file path or inline PEM (they override ``MONARCH_TLS_*``).
    ``ca="trust_all_connections"`` is accepted for plain ``tcp://`` only,
    where nothing is authenticated.

    Anyone who can reach a plain ``tcp://`` worker loop can run arbitrary
    code as this process's user, so a ``tcp`` address must bind loopback
    (``127.0.0.1``, ``::1``, ``localhost``; its procs then bind it too)
    unless ``insecure_tcp=True`` (a warning is logged); otherwise
    ``ValueError``.  ``tls://`` binds anywhere.  Blocks; returns after
    ``HostMesh.shutdown()``.
    """
    import trio

    from monarch_core._actor import _state, _transport
    from monarch_core._actor._agent import ProcAgent
    from monarch_core._kernel._runtime import Kernel
    from monarch_core._mesh._shape import Extent, Point
    from monarch_core._plugins import registry

    if not isinstance(address, str) or "://" not in address:
        raise ValueError(f"run_worker_loop_forever(address=...): expected a URL such as 'tls://host:29500', got {address!r}")
    scheme = address.split("://", 1)[0]
    child_bind = _check_tcp_bind(address, insecure_tcp)
    apply_credentials(scheme, ca=ca, private_key=private_key, cert=cert)
    transport = registry().transport(scheme)
    transport.normalize(address)
    _transport.set_from_parent(transport.name)
    kernel = Kernel(proc_id=f"worker-loop-{os.getpid()}", name=f"worker loop {address}", transport=transport, bind_spec=address)
    agent = ProcAgent(kernel)
    agent.is_host = True
    agent.child_bind_spec = child_bind
    kernel.agent = agent
    rt = _state.ProcRuntime(
        kernel=kernel,
        agent=agent,
        proc_id=kernel.proc_id,
        name=f"worker loop {address}",
        is_client=False,
        transport=transport.name,
        root=(kernel.proc_id, address),
        parent=None,
        point=Point(0, Extent([], [])),
        python_executable=sys.executable,
        proc_mesh_name="worker-loop",
    )
    agent.runtime = rt
    agent.proc_ready.set()
    _state.set_runtime(rt)

    async def announce() -> None:
        logger.info("monarch worker loop listening on %s (pid %d)", kernel.address, os.getpid())
        print(f"monarch worker loop listening on {kernel.address}", flush=True)

    trio.run(functools.partial(kernel.serve, after_start=announce))
    agent.kill_all_children()


def attach_to_workers(
    workers: Sequence[str],
    ca: str | None = None,
    private_key: str | None = None,
    *,
    cert: str | None = None,
    timeout: float | None = None,
):  # -> HostMesh
    """A ``HostMesh`` over running worker loops (one host per address).

    The transport of the addresses (``tcp``/``tls``) must be the enabled one;
    if none is enabled yet it is enabled now.  With TLS the client presents
    ``private_key`` (and ``cert``) signed by the worker's CA and verifies the
    worker against ``ca``.  An unreachable worker raises ``ConnectError``
    naming its address within ``timeout`` seconds (default
    ``MONARCH_ATTACH_TIMEOUT`` or 10).
    """
    from monarch_core._actor._mesh import attach

    return attach(workers, ca=ca, private_key=private_key, cert=cert, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monarch_core.worker", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--address", required=True,
        help="URL to listen on, e.g. tls://h1:29500 (between hosts), or tcp://127.0.0.1:29500 (plain tcp binds "
             "loopback only, unless --insecure-tcp)",
    )
    parser.add_argument("--ca", help="CA certificate (file or inline PEM) that clients must chain to")
    parser.add_argument("--key", dest="private_key", help="this worker's private key (file or inline PEM)")
    parser.add_argument("--cert", help="this worker's certificate, if not in the key file")
    parser.add_argument(
        "--insecure-tcp", action="store_true",
        help="let a plain tcp:// worker loop listen beyond loopback (e.g. tcp://*:29500). INSECURE: anyone who "
             "can reach the port can run arbitrary code here as this user; only on a network you trust",
    )
    parser.add_argument("--log-level", default=os.environ.get("MONARCH_LOG_LEVEL", "WARNING"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[%(levelname)s worker loop] %(name)s: %(message)s")
    try:
        run_worker_loop_forever(args.address, ca=args.ca, private_key=args.private_key, cert=args.cert,
                                insecure_tcp=args.insecure_tcp)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - report monarch errors cleanly
        from monarch_core.errors import MonarchError

        if isinstance(e, MonarchError):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
