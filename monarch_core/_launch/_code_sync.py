"""``HostMesh.sync_workspace``: the core's part (checks, then the scheduler's
``Allocation.sync_workspace`` on a thread of its own).

Which hosts get what: the host mesh (or slice) names its hosts; hosts on this
machine (``this_host()``) need nothing; worker loops the client attached to
(``attach_to_workers``) have no scheduler that could copy files, which is an
error saying so; otherwise the allocation's scheduler copies, or says it
cannot (``NotImplementedError`` naming it).
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Sequence
from typing import Any

from monarch_core._proc._future import Cell
from monarch_core._workspace import Workspace
from monarch_core.errors import AllocationError, ConfigError, MonarchError

logger = logging.getLogger("monarch.launch")


def check_arguments(workspace: Any, conda: Any, auto_reload: Any) -> None:
    """``TypeError`` for anything but a :class:`Workspace` and two bools."""
    if not isinstance(workspace, Workspace):
        raise TypeError(
            f"sync_workspace(workspace) takes a Workspace, got {type(workspace).__name__}; e.g. "
            "from monarch_core.actor import Workspace; await hosts.sync_workspace(Workspace(dirs=['src/mypkg']))"
        )
    for name, value in (("conda", conda), ("auto_reload", auto_reload)):
        if not isinstance(value, bool):
            raise TypeError(f"sync_workspace({name}=...) must be True or False, got {value!r}")


def _missing(workspace: Workspace) -> list[str]:
    return [str(p) for p in workspace.dirs if not p.is_dir()]


def start(
    record: Any,
    hosts: Sequence[Any],
    workspace: Workspace,
    conda: bool,
    auto_reload: bool,
    *,
    attached: bool,
    mesh: str,
) -> Cell:
    """Check, then sync on a thread of its own; the returned cell resolves
    to ``None`` or fails with the error (the caller awaits it).

    ``record``: the host mesh's ``AllocationRecord`` (``None`` for
    ``this_host()`` and attached worker loops); ``hosts``: the
    ``HostHandle`` s of the mesh or slice; ``attached``: the mesh has no
    allocation but remote worker loops (``attach_to_workers``, or a
    reference received from another process)."""
    check_arguments(workspace, conda, auto_reload)
    missing = _missing(workspace)
    if missing:
        raise FileNotFoundError(
            f"sync_workspace: local workspace director{'ies' if len(missing) > 1 else 'y'} {missing} "
            "do not exist (paths are taken from the current working directory)"
        )
    cell = Cell()
    remote = [h for h in hosts if getattr(h, "address", None) is not None]
    if record is None:
        if remote and attached:
            raise NotImplementedError(
                f"sync_workspace on host mesh {mesh!r}: its worker loops were not started by a scheduler of this "
                "client (attach_to_workers, or a HostMesh received from another process), so there is no channel "
                "to copy files to their hosts. Copy the code yourself (rsync, a shared filesystem), or allocate the "
                "hosts with hosts_from_config through a scheduler that syncs (scheduler = \"ssh\"), in the process "
                "that allocated them"
            )
        cell.set_result(None)  # this machine: the procs see its files where they are
        return cell
    alloc = record.allocation
    from monarch_core.hookspecs import Allocation

    impl = getattr(type(alloc), "sync_workspace", None)
    if impl is None or impl is Allocation.sync_workspace:
        raise NotImplementedError(
            f"sync_workspace on host mesh {mesh!r}: {record.what} cannot copy a workspace to its hosts (its "
            "Allocation has no sync_workspace). Install the code on every host (or use a shared filesystem), or "
            "use a scheduler that syncs: ssh (SFTP), local (this machine: nothing to copy)"
        )
    names = [h.name for h in hosts if h.name not in record.lost]
    skipped = [h.name for h in hosts if h.name in record.lost]
    if skipped:
        logger.warning("sync_workspace: skipping lost host(s) %s of %s", skipped, record.what)

    def run() -> None:
        try:
            out = alloc.sync_workspace(workspace, names, conda=conda, auto_reload=auto_reload)
            if inspect.isawaitable(out):
                import trio

                async def wait() -> Any:
                    return await out

                trio.run(wait)
            cell.set_result(None)
        except NotImplementedError as e:
            cell.set_exception(NotImplementedError(
                f"sync_workspace on host mesh {mesh!r}: {record.what}: {e or 'not supported'}"))
        except (AllocationError, ConfigError) as e:
            cell.set_exception(e)
        except MonarchError as e:
            cell.set_exception(AllocationError(f"{record.what} could not sync the workspace: {e}"))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            cell.set_exception(AllocationError(
                f"{record.what} could not sync the workspace: {type(e).__name__}: {e}"))

    if names:
        threading.Thread(target=run, name=f"monarch-sync-{mesh}", daemon=True).start()
    else:
        cell.set_result(None)
    return cell
