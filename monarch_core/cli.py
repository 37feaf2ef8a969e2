"""The ``monarch`` command line.

``monarch plugins``  list installed plugins: name==version and what each provides.
``monarch debug``    attach to the actors of a running program stopped at ``breakpoint()`` (docs/debugging.md).
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
        print(f"{info.name} ({info.distribution}=={info.version})  " + ("; ".join(provides) or "(no hooks)"))
    for name, err in sorted(reg.failed.items()):
        print(f"{name}  FAILED TO LOAD: {err}")
    for name in sorted(reg.blocked):
        print(f"{name}  disabled by {DISABLE_ENV}")
    return 0


def _debug_cli():  # type: ignore[no-untyped-def]
    from monarch_core._debug import _cli

    return _cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="monarch", description="monarch-core command line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("plugins", help="list installed plugins and what they provide")
    p.set_defaults(func=_cmd_plugins)
    p = sub.add_parser("debug", help="debug the actors of a running program that stopped at breakpoint()")
    _debug_cli().add_arguments(p)
    p.set_defaults(func=lambda args: _debug_cli().main(args))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
