"""The ``local`` scheduler: hosts on this machine, procs as child processes."""

from __future__ import annotations

from monarch_core.errors import ConfigError
from monarch_core.hookspecs import Allocation, AllocationRequest, HostHandle, Scheduler


class _LocalAllocation(Allocation):
    def __init__(self, n: int) -> None:
        self.hosts = [HostHandle(name=f"local{i}") for i in range(n)]

    async def release(self) -> None:
        return None


class LocalScheduler(Scheduler):
    """``scheduler = "local"``: ``hosts`` (default 1) hosts on this machine.
    Each host's procs are child processes of the calling process."""

    name = "local"
    _PARAMS = {"hosts"}

    def validate(self, request: AllocationRequest) -> None:
        unknown = sorted(set(request.params) - self._PARAMS)
        if unknown:
            raise ConfigError(
                f"{request.source}: unknown parameter(s) {unknown} for scheduler 'local'; "
                f"it accepts {sorted(self._PARAMS)} (e.g. hosts = 2)"
            )
        n = request.params.get("hosts", 1)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{request.source}: 'hosts' must be an integer >= 1, got {n!r}")

    async def allocate(self, request: AllocationRequest) -> Allocation:
        return _LocalAllocation(int(request.params.get("hosts", 1)))
