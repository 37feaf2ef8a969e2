"""``monarch torchrun``: torchrun's command line over a host mesh.

``monarch torchrun [--nnodes N] [--nproc-per-node N] [--role NAME]
[--hosts NAME] [--master-addr A --master-port P | --local-addr A]
[--max-restarts K] [--rdzv-id ID] [--use-ipaddr ipv4|ipv6|default]
[--log-dir DIR] [-r|--redirects S] [-t|--tee S] [--local-ranks-filter R,..]
[--monitor-interval SEC] [--start-method M] [-m | --run-path | --no-python]
SCRIPT|MODULE ARGS...``

The options mean what torchrun's mean (``--nproc_per_node`` spellings too).
Hosts come from ``hosts_from_config(NAME)`` (inside an ``sbatch`` script
with no configuration: the job's nodes); without ``--hosts``, this machine.
Every rank runs its script as a fresh ``python -u SCRIPT ARGS`` process, and
its output is printed with its rank and host (``--redirects``/``--tee``:
into ``DIR/RUN_ID/attempt_K/RANK/std{out,err}.log`` instead or too).  The
command exits 0 when every rank succeeds, otherwise with the first failing
rank's status (``128 + N`` for a signal N), after stopping every rank
(SIGTERM to each rank's process, SIGKILL later); Ctrl-C stops every rank
the same way and exits 130, SIGTERM to the command exits 143.  Usage errors
exit 2, a failed bring-up 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import uuid
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
    p.add_argument("--local-addr", "--local_addr", dest="local_addr", default=None, metavar="A",
                   help="the address of rank 0's host, which hosts the rendezvous (MASTER_ADDR; the port is "
                        "chosen free there); instead of --master-addr/--master-port")
    p.add_argument("--log-dir", "--log_dir", dest="log_dir", default=None, metavar="DIR",
                   help="folder of the ranks' log files: DIR/RUN_ID/attempt_K/RANK/stdout.log and stderr.log "
                        "(with --redirects or --tee; default with them: a new torchelastic_* temporary folder)")
    p.add_argument("-r", "--redirects", default="0", metavar="S",
                   help="streams that go to the log files only: 0 none, 1 stdout, 2 stderr, 3 both, for every "
                        "local rank, or per local rank as 0:3,1:2 (default 0)")
    p.add_argument("-t", "--tee", default="0", metavar="S",
                   help="streams that go to the log files and to the console (the format of --redirects)")
    p.add_argument("--local-ranks-filter", "--local_ranks_filter", dest="local_ranks_filter", default="",
                   metavar="R,..", help="only these local ranks' output reaches the console (files get all)")
    p.add_argument("--monitor-interval", "--monitor_interval", dest="monitor_interval", type=float, default=0.1,
                   metavar="SEC", help="accepted for torchrun compatibility: each rank's end is reported the "
                                       "moment it happens, nothing is polled")
    p.add_argument("--start-method", "--start_method", dest="start_method", default="spawn",
                   choices=("spawn", "fork", "forkserver"),
                   help="accepted for torchrun compatibility: every rank is a fresh python process (as spawn)")
    p.add_argument("-m", "--module", action="store_true", help="run a module (python -m) instead of a script")
    p.add_argument("--run-path", "--run_path", dest="run_path", action="store_true",
                   help="run the script with runpy.run_path in a fresh interpreter (torchrun's --run-path)")
    p.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                   help="run SCRIPT ARGS as a command, not a Python script")
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


#: set when the command got SIGTERM (a Slurm preemption, ``scancel``, ``kill``)
_terminated = threading.Event()


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM is turned into a Ctrl-C (``SIGINT``), which the client's waits
    deliver as ``KeyboardInterrupt`` between messages, never in the middle of
    one (an exception raised from this handler could land anywhere, and left
    the shutdown waiting once in a while): every rank is then stopped (each
    rank's process gets SIGTERM in turn), and the command exits
    ``128 + SIGTERM`` (:data:`_terminated` tells the two signals apart)."""
    _terminated.set()
    if not callable(signal.getsignal(signal.SIGINT)):  # SIGINT ignored (a background job): raised here
        raise KeyboardInterrupt
    signal.raise_signal(signal.SIGINT)


def _ranks_filter(value: str) -> frozenset[int] | None:
    if not value.strip():
        return None
    try:
        ranks = frozenset(int(r) for r in value.split(","))
    except ValueError:
        raise ValueError(f"--local-ranks-filter {value!r}: give local ranks separated by commas, e.g. 0,1") from None
    if any(r < 0 for r in ranks):
        raise ValueError(f"--local-ranks-filter {value!r}: local ranks are >= 0")
    return ranks


def _options(args: argparse.Namespace, run_id: str, make: bool = True) -> tuple[Any, str | None]:
    """(``ScriptOptions``, the job's log folder or None) for ``args``; ``ValueError`` on bad values.
    ``make=False``: only check them (no temporary folder is created)."""
    from monarch_spmd._script import ScriptOptions, parse_std

    redirects, tee = parse_std(args.redirects, "--redirects"), parse_std(args.tee, "--tee")
    selected = any(redirects.values()) if isinstance(redirects, dict) else bool(redirects)
    selected = selected or (any(tee.values()) if isinstance(tee, dict) else bool(tee))
    log_dir = None
    if selected:  # as torchrun: a folder of the run under --log-dir, or under a new temporary one
        base = args.log_dir or (tempfile.mkdtemp(prefix="torchelastic_") if make else tempfile.gettempdir())
        log_dir = os.path.join(os.path.abspath(base), run_id)
    return ScriptOptions(run_path=args.run_path, no_python=args.no_python, log_dir=log_dir, redirects=redirects,
                         tee=tee, local_ranks_filter=_ranks_filter(args.local_ranks_filter)), log_dir


def _unknown_hosts(name: str) -> str | None:
    """Why ``--hosts name`` names no host mesh (None: it names one).  The name
    must be one the configuration file defines; without a file, only inside an
    ``sbatch`` script does a name mean something (the job's nodes): elsewhere
    ``hosts_from_config``'s stand-in (two hosts on this machine) would run the
    script somewhere the user did not ask for."""
    from monarch_core.config import host_mesh_names
    from monarch_core.errors import ConfigError

    try:
        path, names = host_mesh_names()
    except ConfigError as e:
        return f"--hosts {name}: {e}"
    if path is None:
        if os.environ.get("SLURM_JOB_ID", "").strip():
            return None
        return (f"--hosts {name}: no host mesh is known here: no monarch.toml (or pyproject.toml with "
                f"[tool.monarch]) in {os.getcwd()} or above, and MONARCH_CONFIG is not set; define "
                f"[hosts.{name}] in a monarch.toml (docs/configuration.md; scheduler = \"local\" with hosts = 2 "
                f"gives two hosts on this machine), or leave --hosts out to run on this machine")
    if name not in names:
        return (f"--hosts {name}: {path} defines no host mesh {name!r}; the known ones: "
                f"{', '.join(names) if names else 'none'} (a [hosts.NAME] table each)")
    return None


def run(args: argparse.Namespace) -> int:
    """The command (see the module docstring); returns the exit status."""
    if args.module and (args.no_python or args.run_path):
        return _usage("-m runs a module with python -m; --no-python and --run-path take a script (drop one)")
    if args.node_rank not in (None, 0):
        return _usage("--node-rank: monarch torchrun starts every node itself; run it once (not once per node) "
                      "and drop --node-rank")
    if args.rdzv:
        return _usage("--rdzv-backend/--rdzv-endpoint: the rendezvous is static, hosted by the first rank; use "
                      "--master-addr/--master-port to choose it")
    if (args.master_addr is None) != (args.master_port is None):
        return _usage("give both --master-addr and --master-port, or neither")
    if args.local_addr is not None and args.master_addr is not None:
        return _usage("--local-addr is the address of rank 0's host, which hosts the rendezvous; --master-addr "
                      "names the rendezvous itself: give one of them")
    if not args.monitor_interval > 0:
        return _usage(f"--monitor-interval must be more than 0 seconds, got {args.monitor_interval}")
    if args.start_method != "spawn":
        print(f"monarch torchrun: --start-method {args.start_method}: every rank runs as a fresh python process "
              f"started by its proc, as with spawn; fork and forkserver do not apply here", file=sys.stderr)
    if args.log_dir is not None and os.path.isfile(args.log_dir):
        return _usage(f"--log-dir {args.log_dir} is a file; give a folder (it is created if missing)")
    try:
        nnodes, nproc = _nnodes(args.nnodes), _nproc(args.nproc_per_node)
        _options(args, "", make=False)  # only checks the values: nothing is created before the last usage error
    except ValueError as e:
        return _usage(str(e))
    if args.hosts is None and (nnodes or 1) > 1:
        return _usage(f"--nnodes {nnodes} needs --hosts NAME: the hosts_from_config entry to run on (inside an "
                      f"sbatch script any name gives the job's nodes)")
    unknown = None if args.hosts is None else _unknown_hosts(args.hosts)
    if unknown:
        return _usage(unknown)
    argv = (["-m", args.script] if args.module else [args.script]) + list(args.args)
    if args.hosts is None and args.no_python and not args.run_path and shutil.which(args.script) is None:
        return _usage(f"--no-python: the command {args.script!r} is not found (PATH, working directory "
                      f"{os.getcwd()})")
    script_file = not args.module and (args.run_path or not args.no_python)  # --run-path takes precedence
    if args.hosts is None and script_file and not os.path.isfile(args.script):
        return _usage(f"the script {args.script!r} does not exist (working directory {os.getcwd()})")
    run_id = args.run_id or uuid.uuid4().hex
    options, log_dir = _options(args, run_id)
    from monarch_core.actor import hosts_from_config, this_host
    from monarch_core.errors import MonarchError
    from monarch_core.runtime import AddrType
    from monarch_spmd._launch import JobFailed, launch

    use_ipaddr = None if args.use_ipaddr is None else {"ipv4": AddrType.IPv4, "ipv6": AddrType.IPv6,
                                                        "default": AddrType.Default}[args.use_ipaddr]
    if log_dir is not None:
        print(f"monarch torchrun: the ranks' log files go to {log_dir}/attempt_K/RANK/", file=sys.stderr)
    hosts: Any = None
    owned: Any = None  # the host mesh this command allocated (shut down at the end)
    main_thread = threading.current_thread() is threading.main_thread()  # (signal handlers live there)
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        hosts = this_host() if args.hosts is None else hosts_from_config(args.hosts)
        if args.hosts is not None:
            owned = hosts
            have = len(hosts.hosts)
            if nnodes is not None and have < nnodes:
                raise MonarchError(f"--nnodes {nnodes}: the host mesh {args.hosts!r} has only {have} host(s)")
            if nnodes is not None and have > nnodes:
                hosts = hosts.slice(**{list(hosts.extent.labels)[0]: slice(0, nnodes)})
        launch(hosts, argv, nproc_per_node=nproc, role=args.role, run_id=run_id,
               max_restarts=args.max_restarts, master_addr=args.master_addr, master_port=args.master_port,
               use_ipaddr=use_ipaddr, name=args.role, local_addr=args.local_addr, options=options)
        return 0
    except JobFailed as e:
        print(f"monarch torchrun: {e}\n{e.first.error}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        if _terminated.is_set():
            print("monarch torchrun: terminated (SIGTERM); every rank was stopped", file=sys.stderr)
            return 128 + signal.SIGTERM
        print("monarch torchrun: interrupted; every rank was stopped", file=sys.stderr)
        return 130
    except (MonarchError, ValueError, TypeError, TimeoutError) as e:
        print(f"monarch torchrun: {e}", file=sys.stderr)
        return 1
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the shutdown short
        try:
            if owned is not None:
                try:
                    owned.shutdown().get(timeout=120)
                except Exception as e:  # noqa: BLE001 - report, the exit status stands
                    print(f"monarch torchrun: shutting the hosts down failed: {e}", file=sys.stderr)
        finally:
            if main_thread:
                signal.signal(signal.SIGTERM, previous)
