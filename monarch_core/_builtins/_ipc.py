"""The ``ipc`` transport (built in): Unix-domain stream sockets.

Addresses: ``ipc:///absolute/path`` (a socket file, mode 0600) or
``ipc://@name`` (Linux abstract namespace: no file, gone with the process).
The default for a new proc is a fresh abstract name.

Neither form has a permission check worth the name (an abstract socket none
at all), so the kernel refuses a peer of another uid once per connection
(``SO_PEERCRED``, ``Kernel._serve_inbound``), before it reads a byte.
"""

from __future__ import annotations

import errno
import logging
import os
import socket as _stdsocket
import stat
import uuid
from typing import Any

import trio

from monarch_core.errors import ConnectError, TransportError
from monarch_core.hookspecs import Listener, Stream, Transport
from monarch_core.streams import SocketListener, SocketStream

logger = logging.getLogger("monarch.transport.ipc")

FORMS = "ipc:///absolute/path/to/socket or ipc://@abstract-name"
_MAX_PATH = 107


def _sockaddr(address: str) -> str:
    rest = address[len("ipc://") :]
    if rest.startswith("@"):
        return "\0" + rest[1:]
    return rest


class IpcTransport(Transport):
    name = "ipc"

    def default_bind_spec(self) -> str:
        return f"ipc://@monarch-{os.getpid()}-{uuid.uuid4().hex[:12]}"

    def normalize(self, url: str) -> str:
        if url.startswith("unix://"):
            url = "ipc://" + url[len("unix://") :]
        if not url.startswith("ipc://"):
            raise ValueError(f"malformed ipc address {url!r}; expected {FORMS}")
        rest = url[len("ipc://") :]
        if rest.startswith("@"):
            if len(rest) < 2 or "\0" in rest:
                raise ValueError(f"malformed ipc address {url!r}: the abstract name is empty; expected {FORMS}")
        elif not rest.startswith("/"):
            raise ValueError(f"malformed ipc address {url!r}: the path must be absolute; expected {FORMS}")
        if len(rest.encode()) > _MAX_PATH:
            raise ValueError(f"ipc address {url!r} is too long ({len(rest.encode())} bytes; Unix allows {_MAX_PATH})")
        return url

    async def listen(self, bind_spec: str) -> Listener:
        address = self.normalize(bind_spec)
        target = _sockaddr(address)
        sock = trio.socket.socket(_stdsocket.AF_UNIX, _stdsocket.SOCK_STREAM)
        try:
            if not target.startswith("\0"):
                _remove_stale_socket(target)
            await sock.bind(target)
            if not target.startswith("\0"):
                os.chmod(target, 0o600)  # before listen(): only this user (and root) may connect, whatever the umask
            sock.listen(1024)
        except OSError as e:
            sock.close()
            hint = ""
            if e.errno == errno.EADDRINUSE:
                hint = " (another process listens there; choose another address)"
            raise TransportError(f"cannot listen on {address}: {e.strerror or e}{hint}") from None
        return _IpcListener(sock, address, None if target.startswith("\0") else target)

    async def connect(self, address: str) -> Stream:
        target = _sockaddr(address)
        sock = trio.socket.socket(_stdsocket.AF_UNIX, _stdsocket.SOCK_STREAM)
        try:
            await sock.connect(target)
        except OSError as e:
            sock.close()
            refused = e.errno in (errno.ECONNREFUSED, errno.ENOENT)
            raise ConnectError(f"cannot connect to {address}: {e.strerror or e}", refused=refused) from None
        return SocketStream(sock, peer=address)


class _IpcListener(SocketListener):
    """Removes its socket file when closed (if it is still the one it bound)."""

    def __init__(self, sock: Any, address: str, path: str | None) -> None:
        super().__init__(sock, address)
        self._path = path
        self._inode = os.stat(path).st_ino if path is not None else None

    async def aclose(self) -> None:
        path, self._path = self._path, None
        if path is not None:
            try:
                if os.stat(path).st_ino == self._inode:
                    os.unlink(path)
            except OSError:
                pass
        await super().aclose()


def _remove_stale_socket(path: str) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise TransportError(f"cannot listen on ipc://{path}: a non-socket file is in the way")
    probe = _stdsocket.socket(_stdsocket.AF_UNIX, _stdsocket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: a leftover of a dead process
    else:
        raise TransportError(f"cannot listen on ipc://{path}: another process is listening there")
    finally:
        probe.close()
