"""The debugger suite's helpers (``plugins/debugger/tests``): a monarch program that
stops at breakpoints, and the real ``monarch debug`` CLI driven through a
pseudo-terminal (pexpect), as a person would type at it.

Every program gets its own debug port (``MONARCH_DEBUG_SERVER_PORT=0``: a
free one, which the line it prints names) and its own token file under the
test's ``tmp_path``, so tests never meet each other's (or a developer's)
debug servers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from _helpers.clients import LineReader, child_env
from _helpers.procs import kill_tree

PROGRAMS = Path(__file__).resolve().parent / "programs"
PY = sys.executable
PROMPT = "monarch_dbg> "
PDB = "(Pdb) "
#: The line a client prints when a rank stops while no debugger is attached.
NOTICE = re.compile(r"^monarch: (?P<actor>\S+) rank (?P<rank>\d+) stopped at a breakpoint \((?P<where>[^)]*)\); "
                    r"to debug, run in another terminal: monarch debug(?: --host (?P<host>\S+))?"
                    r"(?: --port (?P<port>\d+))?(?P<rest>.*)$")
#: Seconds for anything a test waits for (a hang fails the test, it never waits forever).
WAIT = 120.0


def debug_env(token_file: Path, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """A child's environment: this checkout's code, no MONARCH_* of the outer
    run, a free debug port and ``token_file``."""
    env: dict[str, str | None] = {"MONARCH_DEBUG_SERVER_PORT": "0", "MONARCH_DEBUG_TOKEN_FILE": str(token_file),
                                  "PYTHONBREAKPOINT": None, "TERM": "dumb"}
    env.update(extra or {})
    return child_env(env, drop=("MONARCH_",))


class Program:
    """A monarch client program running in the background."""

    def __init__(self, argv: list[str], env: Mapping[str, str], cwd: Path) -> None:
        self.popen = subprocess.Popen([PY, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=dict(env), cwd=str(cwd))
        self.out = LineReader(self.popen.stdout, "program-out")
        self.err = LineReader(self.popen.stderr, "program-err")

    def describe(self) -> str:
        return (f"rc={self.popen.poll()}\nstdout:\n{self.out.text()[-3000:]}\n"
                f"stderr:\n{self.err.text()[-6000:]}")

    def notice(self, timeout: float = WAIT, start: int = 0) -> tuple[int, re.Match]:
        """The next "stopped at a breakpoint" line: (its index, the match)."""
        try:
            return self.err.wait_for(NOTICE.match, timeout, start)
        except (EOFError, TimeoutError) as e:
            raise AssertionError(f"the program printed no breakpoint notice ({e})\n{self.describe()}") from None

    def notices(self) -> list[str]:
        return [line for line in self.err.text().splitlines() if NOTICE.match(line)]

    def port(self, timeout: float = WAIT) -> int:
        m = self.notice(timeout)[1]
        assert m["port"], m.group(0)
        return int(m["port"])

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def result(self, key: str, timeout: float = WAIT) -> Any:
        """The value of ``key`` in the next JSON line holding it."""

        def match(line: str) -> Any:
            try:
                obj = json.loads(line)
            except ValueError:
                return None
            return obj if isinstance(obj, dict) and key in obj else None

        try:
            return self.out.wait_for(match, timeout)[1][key]
        except (EOFError, TimeoutError) as e:
            raise AssertionError(f"no {key!r} line from the program ({e})\n{self.describe()}") from None

    def wait(self, timeout: float = WAIT) -> int:
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the program did not end within {timeout}s\n{self.describe()}") from None
        self.out.join(5)
        self.err.join(5)
        return rc

    def kill(self) -> None:
        if self.popen.poll() is None:
            kill_tree(self.popen)


def run_program(name: str, *args: str, env: Mapping[str, str], cwd: Path) -> Program:
    return Program([str(PROGRAMS / name), *args], env, cwd)


class Cli:
    """``monarch debug`` in a pseudo-terminal."""

    def __init__(self, args: list[str], env: Mapping[str, str], expect_banner: bool = True) -> None:
        import pexpect

        self.pexpect = pexpect
        self.child = pexpect.spawn(PY, ["-m", "monarch_core.cli", "debug", *args], env=dict(env),
                                   encoding="utf-8", timeout=WAIT, dimensions=(60, 400))
        self.transcript: list[str] = []
        if expect_banner:
            self.banner = self._upto([PROMPT])[0]

    def _upto(self, prompts: list[str]) -> tuple[str, str]:
        try:
            i = self.child.expect_exact(prompts)
        except (self.pexpect.TIMEOUT, self.pexpect.EOF) as e:
            raise AssertionError(f"monarch debug: no {prompts} ({type(e).__name__})\n"
                                 f"transcript:\n{''.join(self.transcript)}{self.child.before}") from None
        text = self.child.before.replace("\r\n", "\n")
        self.transcript.append(text + prompts[i])
        return text, prompts[i]

    def run(self, line: str, prompts: tuple[str, ...] = (PROMPT, PDB)) -> tuple[str, str]:
        """Type ``line``; what was printed up to the next prompt (without the
        echo of the line), and which prompt it was."""
        self.child.sendline(line)
        text, prompt = self._upto(list(prompts))
        first, _, rest = text.partition("\n")
        assert first.rstrip() == line.rstrip(), f"expected the echo of {line!r}, got {first!r}"
        return rest, prompt

    def cmd(self, line: str) -> str:
        """A command at ``monarch_dbg>``; its output (it must come back there)."""
        out, prompt = self.run(line)
        assert prompt == PROMPT, f"{line!r} left the prompt at {prompt!r}:\n{out}"
        return out

    def pdb(self, line: str) -> str:
        """A pdb command while attached; its output (back at ``(Pdb)``)."""
        out, prompt = self.run(line)
        assert prompt == PDB, f"{line!r} left pdb ({prompt!r}):\n{out}"
        return out

    def finish(self, timeout: float = WAIT) -> tuple[str, int]:
        """Wait for the CLI to exit: (what it printed last, its exit status)."""
        try:
            self.child.expect(self.pexpect.EOF, timeout=timeout)
        except self.pexpect.TIMEOUT:
            raise AssertionError(f"monarch debug did not exit\n{''.join(self.transcript)}{self.child.before}") from None
        text = self.child.before.replace("\r\n", "\n")
        self.child.close()
        return text, int(self.child.exitstatus if self.child.exitstatus is not None else -1)

    def poll_list(self, want: int, timeout: float = WAIT, post_mortem: int | None = None) -> list[dict[str, str]]:
        """``list`` (twice a second) until it shows ``want`` rows, ``post_mortem``
        of them post-mortem if given; the rows."""
        deadline = time.monotonic() + timeout
        while True:
            rows = table_rows(self.cmd("list"))
            pm = sum(1 for r in rows if "[post-mortem]" in r["Function"])
            if len(rows) == want and (post_mortem is None or pm == post_mortem):
                return rows
            assert time.monotonic() < deadline, (
                f"list shows {len(rows)} rows ({pm} post-mortem), expected {want} ({post_mortem}):\n{rows}")
            time.sleep(0.5)

    def quit(self) -> int:
        self.child.sendline("quit")
        return self.finish()[1]

    def kill(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


def table_rows(text: str) -> list[dict[str, str]]:
    """The rows of ``list``'s table."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    if not lines:
        return []
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[1:]]


CAST_LINE = re.compile(r"^\[(?P<actor>\S+) (?P<rank>\d+)\] (?P<text>.*)$")


def cast_lines(text: str) -> dict[int, list[str]]:
    """``cast`` output: rank -> its lines."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = CAST_LINE.match(line)
        if m:
            out.setdefault(int(m["rank"]), []).append(m["text"])
    return out


def line_of(path: Path, text: str, after: str | None = None) -> int:
    """The line number of the first line of ``path`` that is ``text``
    (stripped), after the first line that is ``after``."""
    lines = path.read_text().splitlines()
    start = 0
    if after is not None:
        start = next(i for i, l in enumerate(lines) if l.strip() == after) + 1
    return next(i + 1 for i, l in enumerate(lines) if i >= start and l.strip() == text)
