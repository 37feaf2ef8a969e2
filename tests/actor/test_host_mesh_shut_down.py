"""A host mesh that has been shut down says so in the reference's (torchmonarch 0.7.0) words, to
``spawn_procs`` and to a second ``shutdown()`` alike (``RuntimeError: HostMesh has already been
shut down``), and ``async with`` shuts it down once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest


def test_spawn_procs_and_a_second_shutdown_say_the_host_mesh_has_already_been_shut_down(configured_hosts: Any) -> None:
    async def main() -> None:
        hm = configured_hosts("shut", hosts=1)
        async with hm:
            procs = hm.spawn_procs(per_host={"gpus": 1})
            await procs.initialized
        with pytest.raises(RuntimeError, match=r"HostMesh has already been shut down \(host mesh 'shut'.*allocate"):
            hm.spawn_procs(per_host={"gpus": 1})
        with pytest.raises(RuntimeError, match=r"HostMesh has already been shut down"):
            await hm.shutdown()

    asyncio.run(main())
