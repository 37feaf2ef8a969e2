"""The host worker loop: ``python -m monarch_core.worker --address URL``.

A worker loop runs on each host of a multi-host job (schedulers such as SSH
and Slurm start it; you can start it by hand).  It listens on ``address``,
accepts clients -- with ``tls://`` only clients whose certificate chains to
its CA -- and starts procs for them on request
(``attach_to_workers([...]).spawn_procs(...)``).  When a client goes away,
the worker kills every proc it started for that client and keeps serving
the next one.  ``HostMesh.shutdown()`` ends it.

Once it listens it prints one line on standard output,
``monarch worker loop listening on URL`` (``hookspecs.WORKER_READY_PREFIX``):
the readiness handshake a scheduler reads to learn the address (with the
real port when started on port 0).

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
import logging
import sys

from typing import TYPE_CHECKING, Any

from monarch_core import settings
from monarch_core._launch._worker import READY_PREFIX

if TYPE_CHECKING:
    from monarch_core._actor._attach import attach_to_workers, run_worker_loop_forever

def __getattr__(name: str) -> Any:
    """``attach_to_workers`` and ``run_worker_loop_forever`` (the mesh API's),
    imported on first use: ``python -m monarch_core.worker`` answers its
    client without loading the mesh API."""
    if name in ("attach_to_workers", "run_worker_loop_forever"):
        from monarch_core._actor import _attach

        return getattr(_attach, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["attach_to_workers", "main", "run_worker_loop_forever"]

logger = logging.getLogger("monarch.worker")


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
    parser.add_argument(
        "--exit-with-parent", action="store_true",
        help="exit (killing this worker's procs) when the process that started it goes away (an ssh session, "
             "the client of a local host)",
    )
    parser.add_argument("--log-level", default=settings.get("MONARCH_LOG_LEVEL") or "WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="[%(levelname)s worker loop] %(name)s: %(message)s")
    from monarch_core._actor import FORK_SERVER_WARM  # (the package alone: the worker loads no mesh API)
    from monarch_core._launch import _fork_server, _worker

    _fork_server.warm(FORK_SERVER_WARM)
    try:
        _worker.run_worker_loop_forever(args.address, ca=args.ca, private_key=args.private_key, cert=args.cert,
                                        insecure_tcp=args.insecure_tcp, exit_with_parent=args.exit_with_parent)
    except Exception as e:  # noqa: BLE001 - report bad arguments and monarch errors cleanly
        from monarch_core.errors import MonarchError

        if not isinstance(e, (ValueError, OSError, MonarchError)):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
