"""``monarch debug [--host H] [--port P]``: the debugger's command loop.

Connects to the debug server of a running program (``_server``; the host and
port default to ``MONARCH_DEBUG_SERVER_HOST``/``MONARCH_DEBUG_SERVER_PORT``),
authenticates with the token file, prints the banner, and reads commands at
the ``monarch_dbg>`` prompt (``cmd.Cmd``): ``list``, ``attach``, ``cast``,
``continue``/``c``, ``help``, ``quit``.  A bad command or argument gets one
line saying what is wrong, and the prompt again.  Every request has a
timeout; losing the server (the program ended) ends the CLI.
"""

from __future__ import annotations

import argparse
import cmd
import os
import socket
import sys
from typing import Any

from monarch_debugger import _protocol as P
from monarch_debugger._errors import DebuggerError
from monarch_debugger._ranks import RankSpecError, compact, parse_attach, parse_cast

__all__ = ["BANNER", "DebugCli", "main"]

BANNER = (
    "************************ MONARCH DEBUGGER ************************\n"
    "Enter 'help' for a list of commands.\n"
    "Enter 'list' to show all active breakpoints.\n"
)
PROMPT = "monarch_dbg> "
#: Seconds to connect, and for the server to answer beyond what a request waits.
CONNECT_TIMEOUT = 5.0
ANSWER_TIMEOUT = 30.0
#: Seconds one ``send`` waits for the rank to come back to its prompt before
#: the CLI asks again (Ctrl-C stops asking).
STEP_WAIT = 1.0
#: Seconds ``cast`` and ``continue`` wait for the ranks.
CAST_WAIT = 10.0

HELP = """\
Commands:
  list                                   every actor stopped at a breakpoint: actor, rank, coordinates,
                                         host, function, line
  attach <actor> <rank>                  debug that rank with pdb; 'detach' comes back here (so does
                                         the end of its endpoint)
  cast <actor> ranks(<ranks>) <command>  send one pdb command to several ranks, without attaching:
                                           ranks(3)  ranks(1,2,3)  ranks(2:7:2)  ranks(host=2:4, gpu=1:3)
  continue | c                           clear the breakpoints set from the debugger and continue every
                                         stopped rank
  help [command]                         this list, or one command's
  quit                                   leave the debugger (stopped ranks stay stopped)"""


class CommandError(DebuggerError):
    """What the server refused, in one line."""


class Disconnected(DebuggerError):
    """The server went away."""


class Connection:
    """One connection to a debug server: requests, each answered once."""

    def __init__(self, host: str, port: int) -> None:
        self.where = f"{host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
        except ConnectionRefusedError:
            raise P.CliError(
                f"nothing listens at {self.where}: a program's debug server starts when one of its actors first "
                "hits breakpoint(); is the program running and stopped at one? (--host/--port must match its "
                "MONARCH_DEBUG_SERVER_HOST/MONARCH_DEBUG_SERVER_PORT; the line it printed names them)"
            ) from None
        except TimeoutError:
            raise P.CliError(f"no answer from {self.where} within {CONNECT_TIMEOUT:g}s") from None
        except OSError as e:
            raise P.CliError(f"cannot connect to {self.where}: {e.strerror or e}") from None
        self.file = self.sock.makefile("rb")

    def request(self, op: str, wait: float = 0.0, **fields: Any) -> dict[str, Any]:
        """Send one request; its answer (``CommandError`` if refused)."""
        try:
            self.sock.settimeout(wait + ANSWER_TIMEOUT)
            self.sock.sendall(P.encode({"op": op, "wait": wait, **fields}))
            line = self.file.readline(P.MAX_LINE + 1)
        except TimeoutError:
            raise Disconnected(f"the debug server at {self.where} did not answer within "
                               f"{wait + ANSWER_TIMEOUT:g}s") from None
        except OSError as e:
            raise Disconnected(f"the connection to the debug server at {self.where} broke ({e})") from None
        if not line:
            raise Disconnected(f"the debug server at {self.where} closed the connection (the program ended, "
                               "or stopped debugging)")
        try:
            ans = P.decode(line)
        except ValueError as e:
            raise Disconnected(f"the debug server at {self.where} sent garbage ({e})") from None
        if not ans.get("ok"):
            raise CommandError(str(ans.get("error") or "refused"))
        return ans

    def close(self) -> None:
        try:
            self.file.close()
            self.sock.close()
        except OSError:
            pass


class DebugCli(cmd.Cmd):
    """The ``monarch_dbg>`` command loop over one :class:`Connection`."""

    prompt = PROMPT
    intro = BANNER

    def __init__(self, conn: Connection, stdin: Any = None, stdout: Any = None) -> None:
        super().__init__(stdin=stdin, stdout=stdout)
        self.conn = conn
        self.lost: str | None = None

    # -- plumbing
    def say(self, text: str = "") -> None:
        self.stdout.write(text if text.endswith("\n") else text + "\n")
        self.stdout.flush()

    def show(self, output: str) -> None:
        if output:
            self.say(output)

    def onecmd(self, line: str) -> bool:
        try:
            return bool(super().onecmd(line))
        except (CommandError, RankSpecError) as e:
            self.say(f"*** {e}")
        except Disconnected as e:
            self.lost = str(e)
            self.say(f"*** {e}")
            return True
        return False

    def emptyline(self) -> bool:  # cmd would repeat the last command
        return False

    def default(self, line: str) -> bool:  # type: ignore[override]  # (onecmd returns it: False goes on)
        word = line.split()[0] if line.split() else line
        self.say(f"*** unknown command {word!r}; commands: attach, cast, continue (c), help, list, quit")
        return False

    def sessions(self) -> list[dict[str, Any]]:
        return list(self.conn.request("list")["sessions"])

    def find(self, actor: str, rank: int | None = None) -> list[dict[str, Any]]:
        rows = self.sessions()
        mine = [r for r in rows if r["actor"] == actor]
        if not mine:
            names = sorted({r["actor"] for r in rows})
            known = f"stopped actors: {', '.join(names)}" if names else "no actor is stopped at a breakpoint now"
            raise CommandError(f"no actor {actor!r} is stopped at a breakpoint; {known}")
        if rank is None:
            return mine
        hit = [r for r in mine if r["rank"] == rank]
        if not hit:
            raise CommandError(f"{actor} rank {rank} is not stopped at a breakpoint; stopped ranks of {actor}: "
                               f"{compact([r['rank'] for r in mine])}")
        return hit

    # -- commands
    def do_help(self, arg: str) -> bool:
        """help [command]: the commands, or one command's."""
        name = arg.strip()
        if name:
            fn = getattr(self, f"do_{name}", None)
            if fn is None or name in ("EOF",):
                self.say(f"*** no command {name!r}; commands: attach, cast, continue (c), help, list, quit")
            else:
                self.say(fn.__doc__ or name)
            return False
        self.say(HELP)
        return False

    def do_list(self, arg: str) -> bool:
        """list: a table of every actor stopped at a breakpoint (actor, rank, coordinates, hostname, function, line)."""
        if arg.strip():
            raise CommandError("list takes no arguments")
        rows = self.sessions()
        if not rows:
            self.say("No actor is stopped at a breakpoint.")
            return False
        self.say(format_table(rows))
        return False

    def do_attach(self, arg: str) -> bool:
        """attach <actor> <rank>: debug that rank with pdb until 'detach' (or until its endpoint returns)."""
        actor, rank = parse_attach(arg)
        row = self.find(actor, rank)[0]
        sid = row["id"]
        ans = self.conn.request("attach", id=sid)
        self.say(f"Attached to debug session for rank {rank} ({row['hostname']})")
        self.show(ans["output"])
        prompt = ans.get("prompt") or "(Pdb) "
        while True:
            try:
                line = self._input(prompt)
            except (EOFError, KeyboardInterrupt):
                self.say("")
                line = "detach"
            if line.strip() == "detach":
                self.say(f"Detached from debug session for rank {rank}")
                return False
            try:
                ans = self.conn.request("send", wait=STEP_WAIT, id=sid, line=line)
                ans = self._follow(sid, ans)
            except KeyboardInterrupt:
                self.say(f"\n{actor} rank {rank} is still running; detached (it shows in 'list' when it stops)")
                return False
            self.show(ans["output"])
            if ans["state"] == "ended":
                self.say(f"Detached from debug session for rank {rank} ({ans.get('why') or 'it ended'})")
                return False
            prompt = ans.get("prompt") or prompt

    def _follow(self, sid: str, ans: dict[str, Any]) -> dict[str, Any]:
        """Ask again while the rank runs (a long ``n``); Ctrl-C stops asking."""
        shown = False
        while ans["state"] == "running":
            self.show(ans["output"])
            if not shown:
                self.say("(running... Ctrl-C returns to monarch_dbg>)")
                shown = True
            ans = self.conn.request("wait", wait=STEP_WAIT, id=sid)
        return ans

    def _input(self, prompt: str) -> str:
        if self.use_rawinput and self.stdin is sys.stdin:
            return input(prompt)
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\r\n")

    def do_cast(self, arg: str) -> bool:
        """cast <actor> ranks(<ranks>) <pdb command>: send the command to those ranks, without attaching.
        <ranks>: 3 | 1,2,3 | 2:7:2 (start:stop:step) | host=2:4, gpu=1:3 (by dimension)."""
        actor, selection, command = parse_cast(arg)
        rows = self.find(actor)
        first = rows[0]
        wanted = selection.ranks(actor, first["labels"], first["sizes"])
        by_rank = {r["rank"]: r for r in rows}
        chosen = [by_rank[r] for r in wanted if r in by_rank]
        missing = [r for r in wanted if r not in by_rank]
        if not chosen:
            raise CommandError(f"{selection.text} selects {actor} ranks {compact(wanted) or '(none)'}, and none of "
                               f"them is stopped at a breakpoint; stopped: {compact(list(by_rank))}")
        results = self.conn.request("cast", wait=CAST_WAIT, ids=[r["id"] for r in chosen], line=command)["results"]
        for row in sorted(chosen, key=lambda r: r["rank"]):
            res = results.get(row["id"], {})
            tag = f"[{actor} {row['rank']}]"
            for text in (res.get("output") or "").rstrip("\n").splitlines():
                self.say(f"{tag} {text}")
            if res.get("state") == "ended":
                self.say(f"{tag} ({res.get('why') or 'ended'})")
            elif res.get("state") == "running":
                self.say(f"{tag} (still running; 'list' shows it when it stops)")
        if missing:
            self.say(f"(not stopped at a breakpoint, skipped: {actor} ranks {compact(missing)})")
        return False

    def do_continue(self, arg: str) -> bool:
        """continue (or c): clear the breakpoints set from the debugger and continue every stopped rank."""
        if arg.strip():
            raise CommandError("continue takes no arguments (to continue some ranks: cast <actor> ranks(...) c)")
        ans = self.conn.request("continue", wait=CAST_WAIT)
        results = ans["results"]
        if not results:
            self.say("No actor is stopped at a breakpoint.")
            return False
        still = [sid for sid, r in results.items() if r.get("state") == "running"]
        self.say(f"Continued {len(results)} rank{'s' if len(results) != 1 else ''}"
                 f"{f' ({len(still)} still running)' if still else ''}.")
        stopped = ans.get("stopped") or []
        if stopped:
            pm = sum(1 for r in stopped if r.get("post_mortem"))
            self.say(f"{len(stopped)} stopped again ({pm} post-mortem, after an error): 'list' shows them.")
        return False

    do_c = do_continue

    def do_quit(self, arg: str) -> bool:
        """quit: leave the debugger; ranks stopped at a breakpoint stay stopped."""
        return True

    do_exit = do_quit

    def do_EOF(self, arg: str) -> bool:  # cmd's name for end of input
        self.say("")
        return True


def format_table(rows: list[dict[str, Any]]) -> str:
    """The ``list`` table."""
    head = ["Actor", "Rank", "Coords", "Hostname", "Function", "Line"]
    body = []
    for r in rows:
        coords = ", ".join(f"{k}={v}" for k, v in zip(r.get("labels", []), r.get("coords", []))) or "-"
        fn = str(r.get("function"))
        if r.get("post_mortem"):
            fn += " [post-mortem]"
        body.append([str(r["actor"]), str(r["rank"]), coords, str(r.get("hostname")), fn, str(r.get("lineno"))])
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: list[str]) -> str:
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, widths)) + "|"

    return "\n".join([rule, line(head), rule, *(line(b) for b in body), rule])


def register(sub: argparse._SubParsersAction) -> None:
    """The ``monarch.cli`` entry point: add ``monarch debug`` to the CLI."""
    p = sub.add_parser("debug", help="debug the actors of a running program that stopped at breakpoint()")
    add_arguments(p)
    p.set_defaults(func=main)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``monarch debug`` options."""
    p.add_argument("--host", default=None,
                   help=f"the program's MONARCH_DEBUG_SERVER_HOST (default: that variable here, else {P.DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=None,
                   help=f"the program's MONARCH_DEBUG_SERVER_PORT (default: that variable here, else {P.DEFAULT_PORT})")


def main(args: argparse.Namespace) -> int:
    """Run ``monarch debug``; the exit status."""
    try:
        host = args.host if args.host is not None else P.server_host()
        if args.port is not None:
            P.check_port(args.port, "--port")
            port = args.port
        else:
            port = P.server_port()
        conn = Connection(host, port)
        try:
            token = P.read_token(port)
            try:
                conn.request("hello", token=token, pid=os.getpid())
            except CommandError as e:
                raise P.CliError(str(e)) from None
            except Disconnected as e:
                raise P.CliError(str(e)) from None
            shell = DebugCli(conn)
            intro = None
            while True:
                try:
                    shell.cmdloop(intro)
                    break
                except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh prompt, as pdb does
                    shell.say("")
                    intro = ""
        finally:
            conn.close()
    except (P.CliError, ValueError) as e:
        sys.stderr.write(f"monarch debug: {e}\n")
        return 1
    return 0
