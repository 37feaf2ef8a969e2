"""What ``monarch debug`` and a client's debug server share: the wire format,
the server's address, and the token file that protects it.

The wire: one JSON object per line (UTF-8), each way.  The CLI sends a
request ``{"op": ..., ...}``; the server answers every request with one object,
``{"ok": true, ...}`` or ``{"ok": false, "error": "<one line that says what to
do>"}``.  The first request must be ``hello`` with the token; a server that
already has a CLI refuses a second one.  Requests:

========  =======================================  ==========================================
op        fields                                   answer
========  =======================================  ==========================================
hello     ``token``, ``pid``                       ``server_pid``
list      (none)                                   ``sessions``: one row per stopped session
attach    ``id``                                   ``output``: what the session printed since
                                                   it was last shown (else where it stands)
send      ``id``, ``line``, ``wait``               ``output``, ``state``, ``why`` (below)
wait      ``id``, ``wait``                         the same, without sending a line
cast      ``ids``, ``line``, ``wait``              ``results``: ``id`` -> the same
continue  ``wait``                                 ``results``, and ``stopped``: the sessions
                                                   stopped again by then (post-mortem)
========  =======================================  ==========================================

``state`` is ``stopped`` (back at a prompt), ``running`` (not within
``wait`` seconds: ask again with ``wait``) or ``ended`` (the rank continued,
quit, or its endpoint returned; ``why`` says which).

The token: a random secret the server writes, readable by its user only
(mode 0600 in a 0700 directory), to ``MONARCH_DEBUG_TOKEN_FILE`` (default
``~/.monarch/debug/<port>.token``); the CLI reads it and sends it in its
``hello``.  Loopback-only binding keeps other hosts out, the token keeps other
users of this host out.  A token path in a directory that other users may
write (group- or world-writable without the sticky bit, or owned by another
user) is refused, on both sides.  The file names the server's process (pid
and start time): it is removed when the program ends, however it ends (a
watcher process, :func:`watch_token_file`, removes it once the program is
gone, SIGTERM and SIGKILL included), and a file whose process is gone counts
as absent.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from monarch_core.errors import ConfigError
from monarch_debugger import _settings
from monarch_debugger._errors import DebuggerError

__all__ = [
    "CONTROLLER_NAME",
    "CliError",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "MAX_LINE",
    "decode",
    "encode",
    "read_token",
    "remove_token_file",
    "server_host",
    "server_port",
    "token_path",
    "watch_token_file",
    "write_token_file",
]

#: The name of the debug controller (``get_or_spawn_controller``).
CONTROLLER_NAME = "monarch.debug"
DEFAULT_HOST = next(s.default for s in _settings.SETTINGS if s.name == "MONARCH_DEBUG_SERVER_HOST")
DEFAULT_PORT = next(s.default for s in _settings.SETTINGS if s.name == "MONARCH_DEBUG_SERVER_PORT")
#: Longest line either side accepts, in bytes.
MAX_LINE = 4 << 20


class CliError(DebuggerError):
    """A problem ``monarch debug`` reports in one line and exits on."""


def server_host() -> str:
    """``MONARCH_DEBUG_SERVER_HOST``."""
    return str(_settings.get("MONARCH_DEBUG_SERVER_HOST")).strip()


def server_port() -> int:
    """``MONARCH_DEBUG_SERVER_PORT``, checked to be a TCP port."""
    port = int(_settings.get("MONARCH_DEBUG_SERVER_PORT"))
    check_port(port, "MONARCH_DEBUG_SERVER_PORT")
    return port


def check_port(port: int, what: str) -> None:
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what} must be a TCP port (0-65535), got {port}")


def token_path(port: int) -> Path:
    """Where the token of the server on ``port`` is (``MONARCH_DEBUG_TOKEN_FILE``,
    default ``~/.monarch/debug/<port>.token``)."""
    explicit = _settings.get("MONARCH_DEBUG_TOKEN_FILE")
    if explicit:
        return Path(os.path.expanduser(explicit))
    return Path(os.path.expanduser("~")) / ".monarch" / "debug" / f"{port}.token"


def check_token_dir(path: Path) -> None:
    """Refuse a token path whose directory other users may write: there they
    could replace the file, or plant a link.  ``PermissionError`` that names
    the directory, what was found, and the fix."""
    d = path.parent
    st = os.stat(d)
    fix = "set MONARCH_DEBUG_TOKEN_FILE to a path in a directory only you can write (e.g. ~/.monarch/debug)"
    if st.st_uid not in (os.geteuid(), 0):
        raise PermissionError(f"the debug token directory {d} belongs to uid {st.st_uid}, not to you "
                              f"(uid {os.geteuid()}); {fix}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise PermissionError(f"the debug token directory {d} has mode {stat.S_IMODE(st.st_mode):04o}: other users "
                              f"can write it (and replace the token file); {fix}")


def _start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if it is gone:
    with the pid it names one process, even once the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def writer_alive(data: dict[str, Any]) -> bool:
    """Whether the process that wrote a token file's ``data`` still runs (a
    file from before start times were recorded: by its pid alone; one that
    names no pid cannot be judged, and counts as live)."""
    pid = data.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return True
    started = _start_time(pid)
    if started is None:
        return False
    return data.get("start") in (None, started)


def write_token_file(port: int) -> tuple[Path, str]:
    """Make a new token for the server on ``port`` and write it where
    :func:`token_path` says, readable by this user only; ``(path, token)``.
    Raises ``OSError`` (the caller says what to do): ``PermissionError``
    for a directory others may write (:func:`check_token_dir`)."""
    path = token_path(port)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_token_dir(path)
    token = secrets.token_hex(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask, or a file left by a crash
        record = {"token": token, "pid": os.getpid(), "start": _start_time(os.getpid()), "port": port}
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path, token


#: The watcher (standard library only, ``python -I -S``): waits until the
#: program (its parent) is gone, then removes the token file if it still
#: holds the program's token.
_WATCHER = """
import json, os, select, sys
pid, path, token = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if os.getppid() == pid:
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        fd = None
    if fd is not None and os.getppid() == pid:
        select.select([fd], [], [])  # readable once the program has exited
try:
    with open(path) as f:
        if json.load(f).get("token") == token:
            os.unlink(path)
except (OSError, ValueError, AttributeError):
    pass
"""


def watch_token_file(path: Path, token: str) -> subprocess.Popen | None:
    """Start the process that removes the token file ``path`` once this
    program is gone, however it ends (an exit, SIGTERM, SIGKILL): in its own
    session, holding none of this program's descriptors.  None if it could
    not be started (a file left behind then counts as absent: its process is
    gone, :func:`writer_alive`)."""
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", _WATCHER, str(os.getpid()), str(path), token],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                close_fds=True, start_new_session=True, cwd="/")
    except OSError:
        return None


def remove_token_file(path: Path, token: str) -> None:
    """Remove the token file if it still holds ``token`` (another program may
    have taken the port, and the file, since)."""
    try:
        if json.loads(path.read_text()).get("token") == token:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def read_token(port: int) -> str:
    """The token of the server on ``port``, for the CLI.  :class:`CliError`
    that says what to do when it cannot be read, when its directory is one
    other users may write, or when the program that wrote it is gone (the
    stale file is then removed)."""
    path = token_path(port)
    absent = (f"no token file {path}: the debug server writes it when an actor hits its first breakpoint. "
              "Run monarch debug as the user who runs the program, with the same MONARCH_DEBUG_TOKEN_FILE "
              "if the program sets one")
    unreadable = (f"cannot read the token file {path}: it belongs to the user who runs the program; "
                  "run monarch debug as that user")
    try:
        check_token_dir(path)
    except FileNotFoundError:
        raise CliError(absent) from None
    except PermissionError as e:
        raise CliError(str(e) if e.filename is None else unreadable) from None
    try:
        data = json.loads(path.read_text())
        token = data["token"]
        if not isinstance(token, str):
            raise TypeError("token is not a string")
    except FileNotFoundError:
        raise CliError(absent) from None
    except PermissionError:
        raise CliError(unreadable) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CliError(f"the token file {path} is unreadable ({e}); restart the program to write a new one") from None
    if not writer_alive(data):
        remove_token_file(path, token)
        raise CliError(f"{absent} (the token file there was left by process {data.get('pid')}, "
                       "which has ended: it is removed)")
    return token


def encode(obj: dict[str, Any]) -> bytes:
    """One message: its JSON and a newline."""
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """The message of one line; ``ValueError`` if it is not a JSON object."""
    obj = json.loads(line.decode("utf-8"))
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    return obj
