"""``monarch torchrun``: torchrun's command line over a host mesh.

``monarch torchrun [--nnodes N] [--nproc-per-node N] [--role NAME]
[--hosts NAME] [--master-addr A --master-port P] [--max-restarts K]
[--rdzv-id ID] [--use-ipaddr ipv4|ipv6|default] [-m] SCRIPT|MODULE ARGS...``

The options mean what torchrun's mean (``--nproc_per_node`` spellings too).
Hosts come from ``hosts_from_config(NAME)`` (inside an ``sbatch`` script
with no configuration: the job's nodes); without ``--hosts``, this machine.
Every rank's output is printed with its rank and host; the command exits 0
when every rank succeeds, otherwise with the first failing rank's status
(``128 + N`` for a signal), after stopping every rank; Ctrl-C stops every
rank and exits 130.  Usage errors exit 2, a failed bring-up 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

HELP = "run a torch.distributed training script on every proc of a host mesh, as torchrun does"


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``torchrun`` subcommand to the ``monarch`` command line (this
    plugin's ``monarch.cli`` entry point)."""
    p = sub.add_parser("torchrun", help=HELP, description=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nnodes", default=None,
                   help="how many hosts (default: all of --hosts, or 1); MIN:MAX ranges need MIN == MAX")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", default="1",
                   help="procs per host: a number, or auto / cpu / gpu as torchrun (counted on this machine)")
    p.add_argument("--role", default="default", help="ROLE_NAME of every rank (default: default)")
    p.add_argument("--hosts", default=None, metavar="NAME",
                   help="the host mesh hosts_from_config(NAME) gives (monarch.toml; inside sbatch: the job)")
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", default=None)
    p.add_argument("--master-port", "--master_port", dest="master_port", type=int, default=None)
    p.add_argument("--max-restarts", "--max_restarts", dest="max_restarts", type=int, default=0,
                   help="start every rank again this many times after a failure (default 0)")
    p.add_argument("--rdzv-id", "--rdzv_id", "--run-id", dest="run_id", default=None,
                   help="TORCHELASTIC_RUN_ID (default: a new id)")
    p.add_argument("--use-ipaddr", choices=("ipv4", "ipv6", "default"), default=None,
                   help="give MASTER_ADDR as an IP address of this family (default: the transport's address)")
    p.add_argument("--standalone", action="store_true", help="accepted for torchrun compatibility (always static)")
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", type=int, default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv",
                   default=None, help=argparse.SUPPRESS)
    p.add_argument("-m", "--module", action="store_true", help="run a module (python -m) instead of a script")
    p.add_argument("--no-python", "--no_python", dest="no_python", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    p.set_defaults(func=run)


def _usage(message: str) -> int:
    print(f"monarch torchrun: {message}", file=sys.stderr)
    return 2


def _nnodes(value: str | None) -> int | None:
    if value is None:
        return None
    low, _, high = value.partition(":")
    if high and high != low:
        raise ValueError(f"--nnodes {value}: elastic ranges are not supported; monarch torchrun runs a fixed "
                         f"set of hosts (give one number, e.g. --nnodes {high})")
    n = int(low)
    if n < 1:
        raise ValueError(f"--nnodes must be at least 1, got {value}")
    return n


def _nproc(value: str) -> int:
    if value.isdigit() and int(value) > 0:
        return int(value)
    if value in ("cpu", "auto", "gpu"):
        cuda = 0
        if value != "cpu":
            try:
                import torch

                cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
            except ImportError:
                cuda = 0
            if value == "gpu" and not cuda:
                raise ValueError("--nproc-per-node gpu: this machine has no CUDA device; give a number")
        return cuda or (os.cpu_count() or 1)
    raise ValueError(f"--nproc-per-node must be a positive number, auto, cpu or gpu, got {value!r}")


def run(args: argparse.Namespace) -> int:
    """The command (see the module docstring); returns the exit status."""
    if args.no_python:
        return _usage("--no-python is not supported: ranks run Python scripts or modules inside their procs")
    if args.node_rank not in (None, 0):
        return _usage("--node-rank: monarch torchrun starts every node itself; run it once (not once per node) "
                      "and drop --node-rank")
    if args.rdzv:
        return _usage("--rdzv-backend/--rdzv-endpoint: the rendezvous is static, hosted by the first rank; use "
                      "--master-addr/--master-port to choose it")
    if (args.master_addr is None) != (args.master_port is None):
        return _usage("give both --master-addr and --master-port, or neither")
    try:
        nnodes, nproc = _nnodes(args.nnodes), _nproc(args.nproc_per_node)
    except ValueError as e:
        return _usage(str(e))
    if args.hosts is None and (nnodes or 1) > 1:
        return _usage(f"--nnodes {nnodes} needs --hosts NAME: the hosts_from_config entry to run on (inside an "
                      f"sbatch script any name gives the job's nodes)")
    argv = (["-m", args.script] if args.module else [args.script]) + list(args.args)
    if not args.module and args.hosts is None and not os.path.isfile(args.script):
        return _usage(f"the script {args.script!r} does not exist (working directory {os.getcwd()})")
    from monarch_core.actor import hosts_from_config, this_host
    from monarch_core.errors import MonarchError
    from monarch_core.runtime import AddrType
    from monarch_spmd._launch import JobFailed, launch

    use_ipaddr = None if args.use_ipaddr is None else {"ipv4": AddrType.IPv4, "ipv6": AddrType.IPv6,
                                                        "default": AddrType.Default}[args.use_ipaddr]
    hosts: Any = None
    owned: Any = None  # the host mesh this command allocated (shut down at the end)
    try:
        hosts = this_host() if args.hosts is None else hosts_from_config(args.hosts)
        if args.hosts is not None:
            owned = hosts
            have = len(hosts.hosts)
            if nnodes is not None and have < nnodes:
                raise MonarchError(f"--nnodes {nnodes}: the host mesh {args.hosts!r} has only {have} host(s)")
            if nnodes is not None and have > nnodes:
                hosts = hosts.slice(**{list(hosts.extent.labels)[0]: slice(0, nnodes)})
        launch(hosts, argv, nproc_per_node=nproc, role=args.role, run_id=args.run_id,
               max_restarts=args.max_restarts, master_addr=args.master_addr, master_port=args.master_port,
               use_ipaddr=use_ipaddr, name=args.role)
        return 0
    except JobFailed as e:
        print(f"monarch torchrun: {e}\n{e.first.error}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("monarch torchrun: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    except (MonarchError, ValueError, TypeError, TimeoutError) as e:
        print(f"monarch torchrun: {e}", file=sys.stderr)
        return 1
    finally:
        if owned is not None:
            try:
                owned.shutdown().get(timeout=120)
            except Exception as e:  # noqa: BLE001 - report, the exit status stands
                print(f"monarch torchrun: shutting the hosts down failed: {e}", file=sys.stderr)

