"""``monarch_core.spmd``: ``torch.distributed`` programs on meshes (the
reference's ``monarch.spmd``).

``setup_torch_elastic_env(proc_mesh)`` gives every proc torchrun's
environment, so ``torch.distributed.init_process_group()`` works in its
actors; ``SPMDActor.main(master_addr, master_port, argv)`` runs an existing
training script on every proc, as ``torchrun`` would (``monarch torchrun``
is the command-line form, ``launch(host_mesh, argv, nproc_per_node=...)``
its Python form: stop every rank at the first failure, restarts).  See
``docs/spmd.md``.
"""

from __future__ import annotations

from monarch_core._spmd._actor import SPMDActor, setup_torch_elastic_env, setup_torch_elastic_env_async
from monarch_core._spmd._address import AddrType, master_address
from monarch_core._spmd._launch import JobFailed, RankFailure, launch
from monarch_core._spmd._script import ScriptError



def host_address(use_ipaddr: AddrType | None = None) -> str:
    """The address other procs of the mesh reach this process at (the host of
    the address its transport listens on; ``127.0.0.1`` for a transport local
    to the machine): what ``SPMDActor.get_host_port`` answers with, for code
    that hosts its own rendezvous (a ``TCPStore``) in a proc."""
    from monarch_core import runtime

    return master_address(runtime.local_ref()[1], use_ipaddr)


__all__ = ["AddrType", "JobFailed", "RankFailure", "SPMDActor", "ScriptError", "host_address", "launch", "setup_torch_elastic_env",
           "setup_torch_elastic_env_async"]
