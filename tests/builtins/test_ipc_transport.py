"""The built-in ``ipc`` transport over real Unix sockets."""

from __future__ import annotations

import os
import re
import shutil
import socket
import stat
import tempfile
import uuid

import pytest
import trio

from monarch_core.errors import ConnectError, ConnectionClosed, TransportError
from monarch_core._builtins._ipc import FORMS, IpcTransport

from _helpers import run_async as _run

pytestmark = pytest.mark.unit


@pytest.fixture
def short_dir():  # type: ignore[no-untyped-def]
    d = tempfile.mkdtemp(prefix="mc-ipc-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_default_bind_spec_is_a_fresh_abstract_name_per_call() -> None:
    t = IpcTransport()
    a, b = t.default_bind_spec(), t.default_bind_spec()
    assert re.fullmatch(rf"ipc://@monarch-{os.getpid()}-[0-9a-f]{{12}}", a)
    assert a != b
    assert t.normalize(a) == a


@pytest.mark.parametrize(
    "url, canonical",
    [("ipc:///tmp/x.sock", "ipc:///tmp/x.sock"), ("ipc://@name", "ipc://@name"), ("unix:///tmp/y", "ipc:///tmp/y")],
)
def test_normalize_accepts_paths_and_abstract_names(url: str, canonical: str) -> None:
    assert IpcTransport().normalize(url) == canonical


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("ipc://relative", "the path must be absolute"),
        ("ipc://@", "the abstract name is empty"),
        ("tcp://host:1", "malformed ipc address"),
        ("ipc:///" + "p" * 120, "is too long"),
    ],
)
def test_normalize_rejects_malformed_addresses_naming_the_forms(url: str, fragment: str) -> None:
    with pytest.raises(ValueError) as ei:
        IpcTransport().normalize(url)
    assert fragment in str(ei.value)
    if fragment != "is too long":
        assert FORMS in str(ei.value)


async def _echo_roundtrip(address: str) -> tuple[str, bytes]:
    t = IpcTransport()
    lst = await t.listen(address)
    try:
        async with trio.open_nursery() as nursery:

            async def server() -> None:
                s = await lst.accept()
                data = bytearray()
                while len(data) < 300_000:
                    data += await s.receive_some(65536)
                await s.send_all(bytes(reversed(data)))
                await s.aclose()

            nursery.start_soon(server)
            c = await t.connect(lst.address)
            payload = os.urandom(300_000)
            await c.send_all(payload)
            got = bytearray()
            while True:
                chunk = await c.receive_some(65536)
                if not chunk:
                    break
                got += chunk
            await c.aclose()
            assert bytes(got) == bytes(reversed(payload))
        return lst.address, bytes(got[:4])
    finally:
        await lst.aclose()


def test_listen_and_connect_on_an_abstract_name_move_bytes_both_ways() -> None:
    address = f"ipc://@mc-test-{uuid.uuid4().hex[:8]}"
    got_address, _ = _run(_echo_roundtrip, address)
    assert got_address == address


def test_listen_and_connect_on_a_path_move_bytes_both_ways(short_dir: str) -> None:
    address = f"ipc://{short_dir}/s.sock"
    got_address, _ = _run(_echo_roundtrip, address)
    assert got_address == address


def test_listen_replaces_a_stale_socket_file_left_by_a_dead_process(short_dir: str) -> None:
    path = os.path.join(short_dir, "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # the file stays, nobody listens
    assert os.path.exists(path)
    got_address, _ = _run(_echo_roundtrip, f"ipc://{path}")
    assert got_address == f"ipc://{path}"


def test_listen_refuses_a_path_where_another_process_listens(short_dir: str) -> None:
    path = os.path.join(short_dir, "live.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(1)
    try:
        with pytest.raises(TransportError, match="another process is listening there"):
            _run(IpcTransport().listen, f"ipc://{path}")
        assert os.path.exists(path)  # the live socket was not unlinked
    finally:
        s.close()


def test_listen_refuses_a_non_socket_file_in_the_way(short_dir: str) -> None:
    path = os.path.join(short_dir, "file")
    with open(path, "w") as f:
        f.write("precious")
    with pytest.raises(TransportError, match="a non-socket file is in the way"):
        _run(IpcTransport().listen, f"ipc://{path}")
    with open(path) as f:
        assert f.read() == "precious"


def test_listen_on_an_abstract_name_in_use_names_the_problem() -> None:
    address = f"ipc://@mc-test-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        t = IpcTransport()
        lst = await t.listen(address)
        try:
            with pytest.raises(TransportError) as ei:
                await t.listen(address)
            assert f"cannot listen on {address}" in str(ei.value)
            assert "another process listens there" in str(ei.value)
        finally:
            await lst.aclose()

    _run(go)


def test_connect_to_nothing_is_a_connect_error_naming_the_address(short_dir: str) -> None:
    for address in (f"ipc://{short_dir}/nobody.sock", f"ipc://@mc-nobody-{uuid.uuid4().hex[:8]}"):
        with pytest.raises(ConnectError) as ei:
            _run(IpcTransport().connect, address)
        assert f"cannot connect to {address}" in str(ei.value)


def test_accept_on_a_closed_listener_is_a_transport_error() -> None:
    async def go() -> None:
        lst = await IpcTransport().listen(f"ipc://@mc-test-{uuid.uuid4().hex[:8]}")
        await lst.aclose()
        await lst.aclose()  # idempotent
        with pytest.raises(TransportError):
            await lst.accept()

    _run(go)


def test_stream_errors_after_the_peer_closes_are_connection_closed() -> None:
    async def go() -> None:
        t = IpcTransport()
        lst = await t.listen(f"ipc://@mc-test-{uuid.uuid4().hex[:8]}")
        c = await t.connect(lst.address)
        s = await lst.accept()
        await s.aclose()
        assert await c.receive_some(10) == b""
        with pytest.raises(ConnectionClosed):
            for _ in range(100):  # the first sends may be buffered before EPIPE
                await c.send_all(b"x" * 65536)
        await c.aclose()
        with pytest.raises(ConnectionClosed):
            await c.send_all(b"after close")
        await lst.aclose()

    _run(go)


def test_a_path_socket_is_its_users_only_whatever_the_umask(short_dir) -> None:
    path = os.path.join(short_dir, "private.sock")

    async def listen_and_look() -> int:
        listener = await IpcTransport().listen(f"ipc://{path}")
        try:
            return stat.S_IMODE(os.stat(path).st_mode)
        finally:
            await listener.aclose()

    old = os.umask(0)  # a permissive umask would make the socket file connectable by everyone
    try:
        mode = _run(listen_and_look)
    finally:
        os.umask(old)
    assert mode == 0o600
