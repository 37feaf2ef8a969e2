"""The client's debug server: what ``monarch debug`` connects to.

Started by the debug controller (on its asyncio loop) at the first
breakpoint.  It binds ``MONARCH_DEBUG_SERVER_HOST``:``MONARCH_DEBUG_SERVER_PORT``
(``localhost``:27000 by default: loopback only); when that port is taken (by
another program's debug server) it takes a free one, and the line it prints
names it.  It writes a fresh token to the token file (mode 0600, see
``_protocol``) and accepts a CLI only if its first request carries that
token; one CLI at a time, a second is refused with a message naming the
first.  The requests are those of ``_protocol``.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import ipaddress
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from monarch_debugger import _protocol as P

if TYPE_CHECKING:
    from monarch_debugger._registry import Registry, Session

__all__ = ["DebugServer"]

logger = logging.getLogger("monarch.debug")

#: Seconds a new connection has to send its ``hello``.
HELLO_TIMEOUT = 10.0
#: Longest ``wait`` a request may ask for, in seconds.
MAX_WAIT = 60.0


class DebugServer:
    """Binds at once (``error`` says why it could not); serves on the running loop."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.error: str | None = None
        self.host = P.server_host()
        self.port = 0
        self.token = ""
        self.token_file: Path | None = None
        self.cli: dict[str, Any] | None = None  # the attached CLI (its pid), if any
        self._noticed = False
        self._server: asyncio.AbstractServer | None = None
        self._task: asyncio.Task | None = None
        self._sock: socket.socket | None = None  # bound, not yet served
        self._watcher: subprocess.Popen | None = None  # removes the token file once this program is gone
        self._inflight = 0  # requests being answered (shutdown lets them finish)
        self.taken: int | None = None  # the configured port, when another program had it
        wanted: Any = "?"
        try:
            wanted = P.server_port()
            sock, self.taken = self._bind(self.host, wanted)
            self.port = sock.getsockname()[1]
            self.token_file, self.token = P.write_token_file(self.port)
            self._watcher = P.watch_token_file(self.token_file, self.token)  # removes it if we are killed
        except Exception as e:  # noqa: BLE001 - reported once; breakpoints then continue
            self.error = f"{type(e).__name__}: {e}"
            self._say(f"monarch: the debug server could not start at {self.host}:{wanted} "
                      f"({self.error}); "
                      "breakpoint() in actors continues without stopping. Set MONARCH_DEBUG_SERVER_HOST/PORT "
                      "(and MONARCH_DEBUG_TOKEN_FILE) to usable values.")
            return
        if not _is_loopback(sock):
            logger.warning("the debug server listens on %s:%d, beyond this host's loopback: anyone who can "
                           "reach it may try the token (see docs/debugging.md)", self.host, self.port)
        # Sync __init__ of an actor runs with no asyncio loop visible: serving
        # starts on the actor's loop, at the first stop (``ensure_serving``);
        # the socket listens already, so a CLI that connects early waits.
        self._sock = sock

    def ensure_serving(self) -> None:
        """Start serving the CLI on the running (the controller's) loop, once."""
        if self._task is None and self._sock is not None:
            sock, self._sock = self._sock, None
            self._task = asyncio.get_running_loop().create_task(self._serve(sock))

    # -- binding
    @staticmethod
    def _bind(host: str, port: int) -> tuple[socket.socket, int | None]:
        """A listening socket on ``host``:``port`` (IPv4 first), or on a free
        port of ``host`` if ``port`` is taken; ``(socket, the taken port or None)``."""
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        infos.sort(key=lambda i: i[0] != socket.AF_INET)
        last: OSError | None = None
        for family, type_, proto, _name, addr in infos:
            for attempt in (addr, addr[:1] + (0,) + addr[2:]):
                s = socket.socket(family, type_, proto)
                try:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(attempt)
                    s.listen(8)
                    s.setblocking(False)
                    return s, (port if attempt is not addr else None)
                except OSError as e:
                    s.close()
                    last = e
                    if e.errno != errno.EADDRINUSE or port == 0:
                        break
        raise last or OSError(f"no address for {host!r}")

    # -- notices
    @staticmethod
    def _say(line: str) -> None:
        try:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def command(self) -> str:
        """The ``monarch debug`` command line that reaches this server."""
        cmd = "monarch debug"
        if self.host != P.DEFAULT_HOST:
            cmd += f" --host {self.host}"
        if self.port != P.DEFAULT_PORT:
            cmd += f" --port {self.port}"
        return cmd

    def new_stop(self, s: Session) -> None:
        """A rank stopped anew: tell the user once per episode, if no debugger is attached."""
        if self.cli is not None or self.error is not None:
            return
        if len(self.registry.sessions) <= 1:
            self._noticed = False
        if self._noticed:
            return
        self._noticed = True
        i = s.info
        taken = (f" (port {self.taken} was taken: this program's server is on {self.port})"
                 if self.taken else "")
        self._say(f"monarch: {s.actor} rank {i.get('rank')} stopped at a breakpoint "
                  f"({os.path.basename(str(i.get('filename')))}:{i.get('lineno')}, in {i.get('function')}); "
                  f"to debug, run in another terminal: {self.command()}{taken}")

    # -- serving
    async def _serve(self, sock: socket.socket) -> None:
        try:
            self._server = await asyncio.start_server(self._connection, sock=sock, limit=P.MAX_LINE)
            await self._server.serve_forever()
        except asyncio.CancelledError:
            pass
        except Exception:  # pragma: no cover - a broken listener
            logger.exception("the debug server stopped")

    async def aclose(self, timeout: float = 2.0) -> None:
        """Let the answers being written go out (within ``timeout`` s), then :meth:`close`."""
        self.registry.closing.set()
        deadline = asyncio.get_running_loop().time() + timeout
        while self._inflight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        self.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._task is not None:
            self._task.cancel()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.token_file is not None:
            P.remove_token_file(self.token_file, self.token)
            self.token_file = None
        watcher, self._watcher = self._watcher, None
        if watcher is not None:  # nothing left for it to remove
            watcher.kill()
            try:
                watcher.wait(2.0)
            except subprocess.TimeoutExpired:  # pragma: no cover - reaped by init once we exit
                pass

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one CLI until it leaves or the program ends (both quietly)."""
        peer = writer.get_extra_info("peername")
        mine = False
        try:
            try:
                hello = P.decode(await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT))
            except (asyncio.TimeoutError, ValueError, asyncio.LimitOverrunError, UnicodeDecodeError):
                await _send(writer, {"ok": False, "error": "expected a hello with the token first"})
                return
            token = hello.get("token")
            if hello.get("op") != "hello" or not isinstance(token, str) or not hmac.compare_digest(
                    token.encode(), self.token.encode()):
                logger.warning("debug server: refused a connection from %s: wrong or missing token", peer)
                await _send(writer, {"ok": False, "error": (
                    f"wrong token: this is not the token in {self.token_file}; run monarch debug as the program's "
                    "user, with its MONARCH_DEBUG_TOKEN_FILE")})
                return
            if self.cli is not None:
                await _send(writer, {"ok": False, "error": (
                    f"another monarch debug (pid {self.cli.get('pid')}) is attached to this program; "
                    "only one debugger at a time: quit that one first")})
                return
            mine = True
            self.cli = {"pid": hello.get("pid"), "peer": peer}
            await _send(writer, {"ok": True, "server_pid": os.getpid()})
            while True:
                try:
                    line = await reader.readline()
                except (asyncio.LimitOverrunError, ValueError):
                    await _send(writer, {"ok": False, "error": f"request longer than {P.MAX_LINE} bytes"})
                    return
                if not line:
                    return
                try:
                    req = P.decode(line)
                except (ValueError, UnicodeDecodeError) as e:
                    await _send(writer, {"ok": False, "error": f"malformed request: {e}"})
                    continue
                self._inflight += 1
                try:
                    await _send(writer, await self._answer(req))
                finally:
                    self._inflight -= 1
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            # The program ends (its loop cancels what is left) with the CLI attached: the
            # connection just closes.  Ending cancelled, the task would make asyncio's stream
            # callback (``task.exception()``, Python 3.11) print a CancelledError traceback.
            pass
        finally:
            if mine:
                self.cli = None
            writer.close()

    async def _answer(self, req: dict[str, Any]) -> dict[str, Any]:
        op = req.get("op")
        reg = self.registry
        try:
            wait = min(MAX_WAIT, max(0.0, float(req.get("wait", 1.0))))
            if op == "list":
                return {"ok": True, "sessions": [s.row() for s in reg.stopped_sessions()]}
            if op == "attach":
                return {"ok": True, **reg.attach(str(req["id"]))}
            if op == "send":
                return {"ok": True, **await reg.send(str(req["id"]), str(req["line"]), wait)}
            if op == "wait":
                return {"ok": True, **await reg.wait(str(req["id"]), wait)}
            if op == "cast":
                return {"ok": True, "results": await reg.cast([str(i) for i in req["ids"]], str(req["line"]), wait)}
            if op == "continue":
                return {"ok": True, **await reg.continue_all(wait)}
        except LookupError as e:
            return {"ok": False, "error": str(e.args[0]) if e.args else str(e)}
        except (KeyError, TypeError, ValueError) as e:
            return {"ok": False, "error": f"malformed {op!r} request: {e!r}"}
        return {"ok": False, "error": f"unknown request {op!r}; known: list, attach, send, wait, cast, continue"}


async def _send(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    writer.write(P.encode(obj))
    await writer.drain()


def _is_loopback(sock: socket.socket) -> bool:
    try:
        return ipaddress.ip_address(sock.getsockname()[0]).is_loopback
    except ValueError:
        return False
