"""Nothing hangs on a server that stops answering: an in-process SSH server
(paramiko's own server side, on loopback) accepts the connection and the
key, then never answers an exec or subsystem request; the plugin gives up
after its timeout instead of waiting forever (paramiko itself would)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from monarch_core.errors import AllocationError

from monarch_scheduler_ssh import _connect


class _Stuck(paramiko.ServerInterface):
    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.release.wait(30)  # never answers in time
        return False

    def check_channel_subsystem_request(self, channel: paramiko.Channel, name: str) -> bool:
        self.release.wait(30)
        return False


@pytest.fixture
def stuck_server(tmp_path: Path) -> Iterator[tuple[int, Path, Path]]:
    host_key = paramiko.RSAKey.generate(2048)
    client_key = paramiko.RSAKey.generate(2048)
    key_file = tmp_path / "id_rsa"
    client_key.write_private_key_file(str(key_file))
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    port = lsock.getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    release = threading.Event()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                sock, _ = lsock.accept()
            except OSError:
                return
            t = paramiko.Transport(sock)
            t.add_server_key(host_key)
            transports.append(t)
            try:
                t.start_server(server=_Stuck(release))
            except (paramiko.SSHException, OSError, EOFError):  # the client went away first (teardown)
                t.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield port, key_file, known
    finally:
        release.set()
        lsock.close()
        for t in transports:
            t.close()


def _target(port: int, key: Path, known: Path) -> _connect.Target:
    return _connect.Target(name="stuck", hostname="127.0.0.1", port=port, user="me", identity_files=(str(key),),
                           known_hosts=(str(known),), allow_agent=False)


def test_an_exec_the_server_never_answers_times_out(stuck_server: tuple[int, Path, Path]) -> None:
    port, key, known = stuck_server
    t0 = time.monotonic()
    for start, message in ((lambda c: c.exec("python -c pass", 1.0), "did not start the command within 1s"),
                           (lambda c: c.sftp(1.0), "did not start SFTP within 1s")):
        conn = _connect.connect(_target(port, key, known), timeout=5)  # its own: the server is stuck after
        try:
            with pytest.raises(TimeoutError, match=message):
                start(conn)
        finally:
            conn.close()
    assert time.monotonic() - t0 < 20  # a hang check: each gives up after 1 s


def test_a_host_key_missing_from_known_hosts_is_refused_with_its_fingerprint(
    stuck_server: tuple[int, Path, Path], tmp_path: Path
) -> None:
    port, key, _ = stuck_server
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(AllocationError) as ei:
        _connect.connect(_target(port, key, empty), timeout=5)
    msg = str(ei.value)
    assert "host 'stuck'" in msg and "not in known_hosts" in msg and "SHA256:" in msg, msg
    assert f"ssh-keyscan -p {port} 127.0.0.1 >> {empty}" in msg, msg
