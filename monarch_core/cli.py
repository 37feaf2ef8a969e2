"""The ``monarch`` command line.

``monarch plugins``  list installed plugins: name==version and what each provides;
                     a plugin that failed to load or is broken (a hook raised) is
                     listed as such, and the command still exits 0.
``monarch debug``    attach to the actors of a running program stopped at ``breakpoint()`` (docs/debugging.md).
``monarch summary FILE``  top endpoints by total time (calls, errors, p50/p99) of a
recorded trace (``record_trace``, ``MONARCH_TRACE_FILE``) or JSON-lines telemetry file
(``record_events``, ``MONARCH_TELEMETRY_JSONL``).
"""

from __future__ import annotations

import argparse
import sys


def _cmd_plugins(args: argparse.Namespace) -> int:
    from monarch_core._plugins import DISABLE_ENV, registry

    reg = registry()
    infos = reg.describe()
    for info in infos:
        provides = []
        if info.transports:
            provides.append("transports: " + ", ".join(info.transports))
        if info.schedulers:
            provides.append("schedulers: " + ", ".join(info.schedulers))
        if info.rdma_backends:
            provides.append("rdma backends: " + ", ".join(info.rdma_backends))
        other = [h for h in info.hooks if h not in ("monarch_transports", "monarch_schedulers", "monarch_rdma_backends")]
        if other:
            provides.append("hooks: " + ", ".join(other))
        if info.problems:
            provides.append("BROKEN: " + "; ".join(info.problems))
        print(f"{info.name} ({info.distribution}=={info.version})  " + ("; ".join(provides) or "(no hooks)"))
    for name, err in sorted(reg.failed.items()):
        dist, version = reg.failed_from.get(name, ("?", "?"))
        print(f"{name} ({dist}=={version})  FAILED TO LOAD: {err}")
    for name in sorted(reg.blocked):
        print(f"{name}  disabled by {DISABLE_ENV}")
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from monarch_core._telemetry import _summary

    try:
        rows = _summary.read(args.file)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"monarch summary: cannot read {args.file}: {e}", file=sys.stderr)
        return 1
    if args.side:
        rows = [r for r in rows if r.side == args.side]
    print(_summary.table(rows, args.top, args.per_rank))
    return 0


def _debug_cli():  # type: ignore[no-untyped-def]
    from monarch_core._debug import _cli

    return _cli


def _plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands of installed plugins: entry points of group ``monarch.cli``, each a
    ``register(subparsers)`` that adds its parser (``monarch dashboard``)."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group="monarch.cli"), key=lambda e: e.name):
        try:
            ep.load()(sub)
        except Exception as e:  # noqa: BLE001 - a broken plugin must not take the CLI down
            print(f"monarch: the {ep.name!r} command of a plugin failed to load: {e}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monarch", description="monarch-core command line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("plugins", help="list installed plugins and what they provide")
    p.set_defaults(func=_cmd_plugins)
    p = sub.add_parser("debug", help="debug the actors of a running program that stopped at breakpoint()")
    _debug_cli().add_arguments(p)
    p.set_defaults(func=lambda args: _debug_cli().main(args))
    p = sub.add_parser("summary", help="top endpoints of a recorded trace or telemetry file (p50/p99, errors)")
    p.add_argument("file", help="a Chrome trace (record_trace, MONARCH_TRACE_FILE) or JSON-lines file "
                   "(record_events, MONARCH_TELEMETRY_JSONL)")
    p.add_argument("--top", type=int, default=20, help="rows to show (0: all; default 20)")
    p.add_argument("--side", choices=("client", "server"), help="only this side of the calls")
    p.add_argument("--per-rank", action="store_true", help="one row per rank")
    p.set_defaults(func=_cmd_summary)
    _plugin_commands(sub)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
