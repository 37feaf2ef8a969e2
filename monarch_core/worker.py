"""The host worker loop: ``python -m monarch_core.worker --address URL``.

A worker loop runs on each host of a multi-host job (schedulers such as SSH
and Slurm start it; you can start it by hand).  It listens on ``address``,
accepts clients -- with ``tls://`` only clients whose certificate chains to
its CA -- and starts procs for them on request
(``attach_to_workers([...]).spawn_procs(...)``).  When a client goes away,
the worker kills every proc it started for that client and keeps serving
the next one.  ``HostMesh.shutdown()`` ends it.

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
import logging
import os
import sys
from typing import Sequence

from monarch_core._actor._tls import apply_credentials

__all__ = ["attach_to_workers", "main", "run_worker_loop_forever"]

logger = logging.getLogger("monarch.worker")


def run_worker_loop_forever(
    address: str,
    ca: str | None = None,
    private_key: str | None = None,
    *,
    cert: str | None = None,
) -> None:
    """Serve as the worker loop of this host at ``address`` until shut down.

    ``ca``, ``private_key`` (and optionally ``cert``, when the key file does
    not also hold the certificate) configure TLS for ``tls://`` addresses:
    each is a file path or inline PEM (they override ``MONARCH_TLS_*``).
    ``ca="trust_all_connections"`` is accepted for plain ``tcp://`` only,
    where nothing is authenticated.  Blocks; returns after
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
    apply_credentials(scheme, ca=ca, private_key=private_key, cert=cert)
    transport = registry().transport(scheme)
    transport.normalize(address)
    _transport.set_from_parent(transport.name)
    kernel = Kernel(proc_id=f"worker-loop-{os.getpid()}", name=f"worker loop {address}", transport=transport, bind_spec=address)
    agent = ProcAgent(kernel)
    agent.is_host = True
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
    parser.add_argument("--address", required=True, help="URL to listen on, e.g. tls://h1:29500 or tcp://*:29500")
    parser.add_argument("--ca", help="CA certificate (file or inline PEM) that clients must chain to")
    parser.add_argument("--key", dest="private_key", help="this worker's private key (file or inline PEM)")
    parser.add_argument("--cert", help="this worker's certificate, if not in the key file")
    parser.add_argument("--log-level", default=os.environ.get("MONARCH_LOG_LEVEL", "WARNING"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[%(levelname)s worker loop] %(name)s: %(message)s")
    try:
        run_worker_loop_forever(args.address, ca=args.ca, private_key=args.private_key, cert=args.cert)
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
