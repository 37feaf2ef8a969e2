"""``SPMDActor`` and ``setup_torch_elastic_env``: torchrun's environment on a
proc mesh, and training scripts run by its procs, one fresh ``python``
process per rank."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, Sequence

from monarch_core import runtime
from monarch_core.actor import Actor, Port, ProcMesh, current_rank, current_size, endpoint
from monarch_core.runtime import AddrType, free_port, host_address
from monarch_spmd import _env, _store
from monarch_spmd._script import ScriptOptions, check_argv, run_main

logger = logging.getLogger("monarch.spmd")

#: the name the reference spawns its actor under
ACTOR_NAME = "_SPMDActor"
#: how long a rank whose collective broke (because another rank failed) waits before it reports: the
#: caller hears first of the rank that failed on its own
SECONDARY_DELAY_S = 1.0


class SPMDActor(Actor):
    """Gives its proc torchrun's environment and runs training scripts there.

    Its rank comes from its position in the mesh: the last dimension is the
    local one (``LOCAL_RANK``), the proc with every coordinate 0 is rank 0
    (see ``monarch_spmd._env`` for every variable).  Endpoints (the
    reference's): ``get_host_port(use_ipaddr)`` -> ``(address, port)``, an
    address the other ranks can reach this proc at and a port free on its
    host; ``setup_env(master_addr, master_port)``; ``main(master_addr,
    master_port, argv)`` -> ``True``, which runs ``argv``
    (``["train.py", ...]`` or ``["-m", "module", ...]``) as ``python argv``
    would, in a fresh child process of the proc with torchrun's environment
    (``monarch_spmd._script.run_main``), raising :class:`ScriptError` (rank,
    exit status) when it exits non-zero.  ``setup_env`` and ``main`` also
    take the keywords ``role``, ``run_id``, ``restart_count`` and
    ``max_restarts`` (torchrun's ``ROLE_NAME`` and ``TORCHELASTIC_*``);
    ``main`` also ``options`` (:class:`ScriptOptions`: ``--run-path``,
    ``--no-python``, log files)."""

    def __init__(self) -> None:
        super().__init__()
        point = current_rank()
        self.layout = _env.Layout(point.rank, dict(current_size()))
        self.rank = self.layout.rank
        self.local_rank = self.layout.local_rank
        self.world_size = self.layout.world_size
        self.local_world_size = self.nproc_per_node = self.layout.local_world_size
        self.group_rank = self.layout.group_rank
        self.group_world_size = self.layout.group_world_size
        self._store: Any = None  # rank 0: the rendezvous store of the last main (monarch_spmd._store)

    def _setup_env(self, master_addr: str, master_port: int, role: str, run_id: str, restart_count: int,
                   max_restarts: int) -> None:
        env = _env.torchrun_env(self.layout, master_addr, master_port, role=role, run_id=run_id,
                                restart_count=restart_count, max_restarts=max_restarts)
        _env.apply(env)

    @endpoint
    def get_host_port(self, use_ipaddr: AddrType | None = None) -> tuple[str, int]:
        """``(address, port)`` for a rendezvous hosted by this proc."""
        addr = host_address(use_ipaddr)
        return addr, free_port(addr)

    @endpoint
    def setup_env(self, master_addr: str, master_port: int, *, role: str = _env.DEFAULT_ROLE,
                  run_id: str = "none", restart_count: int = 0, max_restarts: int = 0) -> None:
        """Set torchrun's variables in this proc's ``os.environ``."""
        self._setup_env(master_addr, master_port, role, run_id, restart_count, max_restarts)

    @endpoint(explicit_response_port=True)
    def main(self, port: Port, master_addr: str, master_port: int, script_args: Sequence[str], *,
             role: str = _env.DEFAULT_ROLE, run_id: str = "none", restart_count: int = 0,
             max_restarts: int = 0, options: ScriptOptions | None = None) -> None:
        """Run ``script_args`` in a child process with torchrun's
        environment; ``True`` once it exited 0.  Rank 0 first hosts a fresh
        rendezvous store at ``master_port`` for the run, as torchrun's agent
        does (``monarch_spmd._store``; it lives until the next ``main`` or
        until this actor stops, so it outlives every rank's script).  A rank
        whose failure came out of a collective reports it
        :data:`SECONDARY_DELAY_S` later, so the caller hears first of the
        rank that failed on its own.  The child is SIGTERMed (then
        SIGKILLed) when this proc or actor stops."""
        try:
            argv = check_argv(script_args)
            if options is not None and not isinstance(options, ScriptOptions):
                raise TypeError(f"options must be a monarch_spmd ScriptOptions, got {type(options).__name__}")
            env = _env.torchrun_env(self.layout, master_addr, master_port, role=role, run_id=run_id,
                                    restart_count=restart_count, max_restarts=max_restarts)
            if _store.available():
                env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # rank 0's proc hosts it, as torchrun's agent
                if self.rank == 0:
                    self._store = None  # the last run's server (and its keys) goes first
                    self._store = _store.host(master_addr, master_port)
            me = runtime.current_actor()
            failure = run_main(argv, rank=self.rank, local_rank=self.local_rank, host=socket.gethostname(),
                               env=env, options=options, restart_count=restart_count,
                               key=me[0] if me is not None else "")
        except Exception as e:
            port.exception(e)
            return
        if failure is None:
            port.send(True)
            return
        if failure.collective:
            time.sleep(SECONDARY_DELAY_S)
        port.exception(failure)


def check_master(master_addr: str | None, master_port: int | None) -> None:
    if (master_addr is None) != (master_port is None):
        raise ValueError(
            f"give both master_addr and master_port, or neither (then the first proc of the mesh hosts the "
            f"rendezvous on a free port); got master_addr={master_addr!r}, master_port={master_port!r}")


def _first(proc_mesh: ProcMesh) -> dict[str, int]:
    if not isinstance(proc_mesh, ProcMesh):
        raise TypeError(f"proc_mesh must be a ProcMesh (from spawn_procs), got {type(proc_mesh).__name__}")
    labels = list(proc_mesh.extent.labels)
    if not labels:
        raise ValueError("an SPMD mesh needs at least one dimension (the last one holds the procs of one host, "
                         "e.g. spawn_procs(per_host={'gpus': 2})); this proc mesh has none")
    return dict.fromkeys(labels, 0)


def setup_torch_elastic_env(proc_mesh: ProcMesh, master_addr: str | None = None, master_port: int | None = None,
                            use_ipaddr: AddrType | None = None, *, timeout: float = 300.0) -> Any:
    """Give every proc of ``proc_mesh`` torchrun's environment (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ..., ``MASTER_ADDR``, ``MASTER_PORT``), so
    that ``torch.distributed.init_process_group()`` works in its actors.

    Without ``master_addr``/``master_port`` (give both or neither) the first
    proc (every coordinate 0) hosts the rendezvous: its address as the other
    ranks reach it (``use_ipaddr`` picks IPv4/IPv6) and a port free on its
    host.  Returns the ``SPMDActor`` mesh it spawned (the reference returns
    ``None``).  ``timeout`` bounds each step."""
    check_master(master_addr, master_port)
    first = _first(proc_mesh)
    am = proc_mesh.spawn(ACTOR_NAME, SPMDActor)
    if master_addr is None:
        master_addr, master_port = am.slice(**first).get_host_port.call_one(use_ipaddr).get(timeout=timeout)
        logger.info("torch elastic rendezvous at %s:%s (the first proc of %s)", master_addr, master_port,
                    proc_mesh.name if hasattr(proc_mesh, "name") else proc_mesh)
    am.setup_env.call(master_addr, master_port).get(timeout=timeout)
    return am


async def setup_torch_elastic_env_async(proc_mesh: ProcMesh, master_addr: str | None = None,
                                        master_port: int | None = None, use_ipaddr: AddrType | None = None) -> Any:
    """:func:`setup_torch_elastic_env` for async code (awaits instead of blocking)."""
    check_master(master_addr, master_port)
    first = _first(proc_mesh)
    am = proc_mesh.spawn(ACTOR_NAME, SPMDActor)
    if master_addr is None:
        master_addr, master_port = await am.slice(**first).get_host_port.call_one(use_ipaddr)
    await am.setup_env.call(master_addr, master_port)
    return am


__all__ = ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]
