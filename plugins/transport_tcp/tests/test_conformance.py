"""Every transport of monarch-transport-tcp (and the built-in inproc) passes
the public conformance kit, monarch_core.testing.check_transport."""

from __future__ import annotations

import os
import tempfile

import pytest
import trio

from monarch_core._builtins import InprocTransport
from monarch_core.testing import check_transport
from monarch_core._builtins._ipc import IpcTransport
from monarch_transport_tcp._tcp import TcpTransport


def test_ipc_abstract_passes_the_conformance_kit() -> None:
    trio.run(check_transport, IpcTransport())


def test_ipc_path_passes_the_conformance_kit() -> None:
    with tempfile.TemporaryDirectory() as d:
        trio.run(check_transport, IpcTransport(), f"ipc://{os.path.join(d, 'sock')}")


def test_tcp_loopback_passes_the_conformance_kit() -> None:
    trio.run(check_transport, TcpTransport(), "tcp://127.0.0.1:0")


def test_inproc_passes_the_conformance_kit() -> None:
    trio.run(check_transport, InprocTransport())


def test_the_kit_catches_a_transport_that_leaks_oserror() -> None:
    class Leaky(IpcTransport):
        async def connect(self, address: str):  # type: ignore[override]
            raise OSError(111, "Connection refused")

    with pytest.raises(OSError):
        trio.run(check_transport, Leaky())
