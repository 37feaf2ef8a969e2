"""The ``monarch`` command line.

``monarch --version``  monarch-core's version.
``monarch status``   this user's running monarch programs on this machine (pid, command,
                     dashboard URL, meshes, procs and their state), read from the records
                     each client keeps in a private runtime directory (``_status``; no
                     network); ``--json`` for the records themselves (docs/debugging.md).
``monarch plugins``  list installed plugins: name==version and what each provides;
                     a plugin that failed to load or is broken (a hook raised) is
                     listed as such, and the command still exits 0.
``monarch debug``    attach to the actors of a running program stopped at ``breakpoint()``
                     (docs/debugging.md; comes with the monarch-debugger plugin).
``monarch settings`` every ``MONARCH_*`` variable of the core and the installed plugins;
                     ``settings NAME...``: each one's current value and where it comes from
                     (the environment, or the default); ``--all``: every one's, one a line.
``monarch torchrun [torchrun's options] SCRIPT ARGS...``  run a torch.distributed
                     script on every proc of a host mesh (docs/spmd.md; comes with the
                     monarch-spmd plugin).
``monarch apply [MODULE.ATTR]`` / ``monarch kill``  apply the job object of this folder
                     (saving ``.monarch/job_state.pkl``), or kill the saved job (docs/job.md).
``monarch summary FILE``  top endpoints by total time (calls, errors, p50/p99) of a
recorded trace (``record_trace``, ``MONARCH_TRACE_FILE``) or JSON-lines telemetry file
(``record_events``, ``MONARCH_TELEMETRY_JSONL``).

Plugins add commands through the ``monarch.cli`` entry point group; a known
plugin command that is not installed (``monarch debug`` without the debugger,
``monarch torchrun`` without monarch-spmd) says which plugin to install and
exits 2; so does the command of a plugin that ``MONARCH_DISABLED_PLUGINS`` turns
off, naming it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _cmd_plugins(args: argparse.Namespace) -> int:
    from monarch_core._plugins import DISABLE_ENV, registry

    reg = registry()
    infos = reg.describe()
    for info in infos:
        other = [h for h in info.hooks if h not in ("monarch_transports", "monarch_schedulers", "monarch_rdma_backends", "monarch_settings")]
        provides = [f"{what}: " + ", ".join(names) for what, names in (
            ("transports", info.transports), ("schedulers", info.schedulers),
            ("rdma backends", info.rdma_backends), ("hooks", other)) if names]
        if info.problems:
            provides.append("BROKEN: " + "; ".join(info.problems))
        print(f"{info.name} ({info.distribution}=={info.version})  " + ("; ".join(provides) or "(no hooks)"))
    for name, err in sorted(reg.failed.items()):
        dist, version = reg.failed_from.get(name, ("?", "?"))
        print(f"{name} ({dist}=={version})  FAILED TO LOAD: {err}")
    for name in sorted(reg.blocked):
        print(f"{name}  disabled by {DISABLE_ENV}")
    return 0


def _count(text: str) -> int:
    """``--top``'s value: a whole number >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of rows, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(
            f"{n} rows: give how many of the endpoints with the most total time to show (0: all); there is no "
            f"negative count (the table is sorted by total time, most first)")
    return n


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


def _setting_value(s: Any) -> tuple[str, str]:
    """(the value of setting ``s`` in this environment, as text; where it comes from).
    :class:`~monarch_core.errors.ConfigError` for a malformed value."""
    import os

    raw = os.environ.get(s.name)
    if raw is None or not raw.strip():
        return s.shown_default, "default"
    s.parse(raw)  # a malformed value is an error here too
    return raw, "environment"


def _cmd_settings(args: argparse.Namespace) -> int:
    from monarch_core import settings
    from monarch_core._plugins import registry
    from monarch_core.errors import ConfigError

    registry()  # the installed plugins declare theirs
    if not args.all and not args.names:
        settings.print_tables()
        return 0
    known = {s.name: s for s in settings.all_settings()}
    if args.all:
        rows = []
        for each in known.values():
            try:
                value, source = _setting_value(each)
            except ConfigError:
                value, source = _env_text(each.name), "environment: MALFORMED"
            rows.append((each.name, value, source, each.owner))
        width = [max(len(r[i]) for r in rows) for i in range(3)]
        print("  ".join(h.ljust(w) for h, w in zip(("variable", "value", "from"), width)) + "  declared by")
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, width)) + "  " + r[3])
        return 0
    status = 0
    for i, given in enumerate(args.names):
        name = given if given.startswith("MONARCH_") else "MONARCH_" + given.upper()
        s = known.get(name)
        if s is None:
            import difflib

            close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            print(f"monarch settings: {given} is not a setting of monarch-core or of an installed plugin{hint} "
                  f"(`monarch settings --all` lists them)", file=sys.stderr)
            status = 2
            continue
        if i:
            print()
        kind = settings._KINDS[s.kind] + (f" >= {s.minimum:g}" if s.minimum is not None else "")
        try:
            value, source = _setting_value(s)
        except ConfigError as e:
            print(f"{s.name} = {_env_text(s.name)!r}  (from the environment: MALFORMED)\n  {e}")
            status = max(status, 1)
            continue
        if source == "default":
            print(f"{s.name} = {value}  (the default: not set in the environment)")
        else:
            print(f"{s.name} = {value}  (from the environment; the default is {s.shown_default})")
        print(f"  {kind}; {'a user setting' if s.public else 'an internal tuning knob'}, declared by {s.owner}")
        print(f"  {s.meaning}")
    return status


def _env_text(name: str) -> str:
    """The raw text of environment variable ``name`` ('' when unset)."""
    import os

    return os.environ.get(name, "")


def _cmd_status(args: argparse.Namespace) -> int:
    import json

    from monarch_core import _status

    try:
        records = _status.read_all()
    except _status.StatusDirError as e:
        print(f"monarch status: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    if not records:
        print(f"no monarch client runs for this user on this machine (their records would be in "
              f"{_status.directory()})")
        return 0
    print(_status.format_records(records))
    return 0


def _plugin_commands(sub: argparse._SubParsersAction) -> dict[str, str]:
    """Subcommands of installed plugins: entry points of group ``monarch.cli``, each a
    ``register(subparsers)`` that adds its parser (``monarch dashboard``).  A command
    whose distribution's plugin is turned off (``MONARCH_DISABLED_PLUGINS``) is not
    added: the commands left out, each with that plugin's name."""
    from importlib.metadata import entry_points

    from monarch_core import settings
    from monarch_core._plugins import DISABLE_ENV, ENTRY_POINT_GROUP

    blocked = set(settings.get(DISABLE_ENV))
    off: dict[str, str] = {}
    for ep in sorted(entry_points(group="monarch.cli"), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        plugins = {e.name for e in dist.entry_points if e.group == ENTRY_POINT_GROUP} if dist is not None else set()
        if plugins & blocked:
            off[ep.name] = min(plugins & blocked)
            continue
        try:
            ep.load()(sub)
        except Exception as e:  # noqa: BLE001 - a broken plugin must not take the CLI down
            print(f"monarch: the {ep.name!r} command of a plugin failed to load: {e}", file=sys.stderr)
    return off


#: Commands that the project's plugins add: command -> (plugin, install line).
PLUGIN_COMMANDS = {
    "debug": ("monarch-debugger", "pip install ./plugins/debugger"),
    "dashboard": ("monarch-dashboard", "pip install ./plugins/dashboard"),
    "torchrun": ("monarch-spmd", "pip install ./plugins/spmd"),
}


def _missing_plugin_command(argv: list[str], sub: argparse._SubParsersAction,
                            off: dict[str, str] | None = None) -> str | None:
    """What to say when ``argv`` names a plugin's command that is not installed, or
    whose plugin ``off`` says is turned off."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if off and command in off:
        return (f"monarch: the {command!r} command comes with the plugin {off[command]!r}, which "
                f"MONARCH_DISABLED_PLUGINS turns off here; take {off[command]!r} out of it to use the command")
    if command is None or command in sub.choices or command not in PLUGIN_COMMANDS:
        return None
    dist, install = PLUGIN_COMMANDS[command]
    return (f"monarch: the {command!r} command comes with the {dist} plugin, which is not installed here; "
            f"install it in a monarch-core checkout with `{install}`")


def main(argv: list[str] | None = None) -> int:
    from monarch_core._version import __version__

    parser = argparse.ArgumentParser(prog="monarch", description="monarch-core command line")
    parser.add_argument("--version", action="version", version=f"monarch-core {__version__}",
                        help="print monarch-core's version and exit (`monarch plugins`: the plugins' versions)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("plugins", help="list installed plugins and what they provide")
    p.set_defaults(func=_cmd_plugins)
    p = sub.add_parser("status", help="this user's running monarch programs on this machine: meshes, procs, state, "
                       "dashboard URL")
    p.add_argument("--json", action="store_true", help="the records as JSON (a list, oldest program first)")
    p.set_defaults(func=_cmd_status)
    p = sub.add_parser("settings", help="every MONARCH_* variable of the core and the installed plugins; "
                       "with NAMEs, their current values")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="show this setting's current value and where it comes from (MONARCH_DELIVERY_TIMEOUT, "
                   "or delivery_timeout)")
    p.add_argument("--all", action="store_true", help="every setting's current value and where it comes from")
    p.set_defaults(func=_cmd_settings)
    p = sub.add_parser("summary", help="top endpoints of a recorded trace or telemetry file (p50/p99, errors)")
    p.add_argument("file", help="a Chrome trace (record_trace, MONARCH_TRACE_FILE) or JSON-lines file "
                   "(record_events, MONARCH_TELEMETRY_JSONL)")
    p.add_argument("--top", type=_count, default=20, metavar="N", help="rows to show, the most total time first "
                   "(0: all; default 20)")
    p.add_argument("--side", choices=("client", "server"), help="only this side of the calls")
    p.add_argument("--per-rank", action="store_true", help="one row per rank")
    p.set_defaults(func=_cmd_summary)
    from monarch_core.job import _cli as _job_cli

    _job_cli.register(sub)  # monarch apply / monarch kill (docs/job.md)
    off = _plugin_commands(sub)
    argv = sys.argv[1:] if argv is None else argv
    missing = _missing_plugin_command(argv, sub, off)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
