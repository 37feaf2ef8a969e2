"""Jobs over a scheduler plugin: the host meshes come from the same
allocation path as ``hosts_from_config`` (``_actor._mesh.allocate_entry``),
from an entry built from the job's arguments instead of ``monarch.toml``.

One allocation holds every host of the job; each named mesh is a slice of
it, in the order the meshes were given.  The allocation is *kept* when the
client ends (``Allocation.detach``: a Slurm job keeps running, a later
client reattaches to it); only ``kill()`` releases it.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Optional

from monarch_core.hookspecs import Allocation, AllocationRequest, Scheduler, WorkerLaunch

logger = logging.getLogger("monarch.job")


def require_scheduler(name: str, job: str, install: str) -> Any:
    """The installed scheduler ``name``, or ``ImportError`` naming ``install``."""
    from monarch_core._plugins import registry

    if name not in registry().scheduler_specs():
        raise ImportError(f"{job} needs the {name!r} scheduler, which no installed plugin provides here; install "
                          f"it in a monarch-core checkout with `{install}`")
    return registry().scheduler(name)


class _Kept(Allocation):
    """An allocation whose ``release`` keeps the hosts (``detach``) unless
    its job is being killed."""

    def __init__(self, inner: Any, owner: KeepFlag) -> None:
        self._inner = inner
        self._owner = owner
        self.hosts = inner.hosts
        self.extent = getattr(inner, "extent", None)
        self.dim = getattr(inner, "dim", "hosts")

    def __getattr__(self, name: str) -> Any:  # job_id, owned ... of the scheduler's own allocation
        return getattr(self._inner, name)

    def release(self) -> Any:
        if self._owner.killing:
            return self._inner.release()
        detach = getattr(self._inner, "detach", None)
        return detach() if detach is not None else self._inner.release()

    def detach(self) -> Any:
        detach = getattr(self._inner, "detach", None)
        return detach() if detach is not None else self._inner.release()

    def sync_workspace(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.sync_workspace(*args, **kwargs)


class KeepFlag:
    """Whether the job is being killed (then its allocation is released)."""

    killing: bool = False


def _keeping(flag: KeepFlag) -> Any:
    """The ``wrap`` of ``allocate_entry``: the scheduler, with ``_Kept`` allocations."""

    def wrap(inner: Any) -> Scheduler:
        if inspect.iscoroutinefunction(inner.allocate):
            class _AsyncKeeping(_Keeping):
                async def allocate(self, request: AllocationRequest, launch: WorkerLaunch) -> Allocation:
                    return _Kept(await inner.allocate(request, launch), flag)

            return _AsyncKeeping(inner)

        class _SyncKeeping(_Keeping):
            def allocate(self, request: AllocationRequest, launch: WorkerLaunch) -> Allocation:
                return _Kept(inner.allocate(request, launch), flag)

        return _SyncKeeping(inner)

    return wrap


class _Keeping(Scheduler):
    """A scheduler that is ``inner`` but for what ``allocate`` returns."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.transport = getattr(inner, "transport", None)
        self.params = getattr(inner, "params", None)

    def validate(self, request: AllocationRequest) -> None:
        self.inner.validate(request)

    def client_address(self, request: AllocationRequest) -> Optional[str]:
        pick = getattr(self.inner, "client_address", None)
        return pick(request) if pick is not None else None


def allocate(job: str, scheduler: str, params: dict[str, Any], flag: KeepFlag,
             timeout: Optional[float] = None) -> Any:
    """The owning ``HostMesh`` of an allocation of ``scheduler`` with
    ``params`` (the entry a job's arguments make), kept past the client."""
    from monarch_core._actor._mesh import allocate_entry
    from monarch_core._config import HostMeshConfig

    cfg = HostMeshConfig(name=job, scheduler=scheduler, params=dict(params), source=f"{job}(...)")
    return allocate_entry(cfg, timeout=timeout, wrap=_keeping(flag))


def split(root: Any, meshes: dict[str, int]) -> dict[str, Any]:
    """The named meshes: consecutive slices of ``root`` along ``hosts``."""
    out, at = {}, 0
    for name, n in meshes.items():
        out[name] = root.slice(hosts=slice(at, at + n))
        at += n
    return out


def check_meshes(job: str, meshes: Any) -> dict[str, int]:
    if not isinstance(meshes, dict) or not meshes:
        raise TypeError(f"{job}(meshes=...) takes a dict of host mesh name -> number of hosts, such as "
                        f"{{'trainers': 2}}, got {meshes!r}")
    for name, n in meshes.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{job}: mesh name {name!r} must be an identifier (it is an attribute of the "
                             "job's state)")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{job}: meshes[{name!r}] must be an int >= 1, got {n!r}")
    return dict(meshes)


def shutdown(root: Any, flag: KeepFlag, timeout: float) -> None:
    """Release the allocation under ``root`` (its job ends)."""
    flag.killing = True
    try:
        root.shutdown().get(timeout=timeout)
    finally:
        flag.killing = False
