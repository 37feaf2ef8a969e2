"""``Workspace`` and ``HostMesh.sync_workspace``, the core's side: the type's
checks, where it is importable, and who copies -- nothing for this machine's
hosts (``this_host()``, ``local``), a clear ``NotImplementedError`` naming
the scheduler for one that cannot (the documented third-party scheduler),
and for worker loops this client did not start.  Real worker loops on this
machine; copying over SSH is tested in tests/schedulers/ssh."""

from __future__ import annotations

import asyncio
import pickle
import re
import types
import uuid
from pathlib import Path

import pytest

import monarch_core
import monarch_core.actor as mactor
import monarch_core.hookspecs as hs
from monarch_core._actor import _mesh
from monarch_core._proc import _start, _state
from monarch_core._launch import _alloc
from monarch_core._workspace import Workspace
from monarch_core.actor import this_host
from monarch_core.hookspecs import AllocationRequest

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugin-authors.md"


def test_workspace_dirs_keep_their_names_or_take_the_given_ones(tmp_path: Path) -> None:
    a, b = tmp_path / "proj", tmp_path / "lib"
    w = Workspace(dirs=[a, str(b)])
    assert w.dirs == {a: "proj", b: "lib"}
    assert w.remote_dirs("/work") == ["/work/proj", "/work/lib"]
    w = Workspace(dirs={a: "github/proj", b: ""})
    assert w.dirs == {a: "github/proj", b: ""}
    assert w.remote_dirs("/work") == ["/work/github/proj", "/work"]
    assert Workspace(dirs={a: "./x/"}).dirs == {a: "x"}
    assert len(Workspace()) == 0 and Workspace() == Workspace(dirs=[])
    assert Workspace(dirs=[a]) == Workspace(dirs={a: "proj"})
    assert "proj" in repr(Workspace(dirs=[a]))


@pytest.mark.parametrize(
    ("dirs", "error", "needle"),
    [
        ("src/pkg", TypeError, "Workspace(dirs=['src/pkg'])"),
        (42, TypeError, "a list of directories or a dict"),
        ([1], TypeError, "must be a str or a path"),
        ([""], ValueError, "write '.'"),
        ({"a": "/abs"}, ValueError, "must be a relative path"),
        ({"a": "../up"}, ValueError, "no '..'"),
        ({"a": 3}, TypeError, "must be a str"),
        (["x/same", "y/same"], ValueError, "would both go to the remote directory 'same'"),
    ],
)
def test_workspace_rejects_what_it_cannot_mean(dirs: object, error: type, needle: str) -> None:
    with pytest.raises(error) as ei:
        Workspace(dirs=dirs)  # type: ignore[arg-type]
    assert needle in str(ei.value)


def test_workspace_is_importable_where_the_reference_names_it_and_for_plugins() -> None:
    assert mactor.Workspace is Workspace and monarch_core.Workspace is Workspace and hs.Workspace is Workspace
    assert "Workspace" not in mactor.__all__  # a type named in a signature, like BootstrapCommand
    assert "Workspace" in hs.__all__


def test_this_host_has_nothing_to_copy(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    assert asyncio.run(this_host().sync_workspace(Workspace(dirs=[tmp_path / "code"]))) is None


def test_checks_before_anything_is_copied(tmp_path: Path) -> None:
    hm = this_host()
    with pytest.raises(TypeError, match=r"takes a Workspace, got str; e\.g\. from monarch_core\.actor import Workspace"):
        asyncio.run(hm.sync_workspace(str(tmp_path)))
    with pytest.raises(TypeError, match=r"conda=\.\.\.\) must be True or False"):
        asyncio.run(hm.sync_workspace(Workspace(), conda="yes"))  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="nope"):
        asyncio.run(hm.sync_workspace(Workspace(dirs=[tmp_path / "nope"])))


def test_local_hosts_share_this_machine_so_nothing_is_copied(configured_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "code").mkdir()
    hm = configured_hosts("dev", hosts=2)
    assert asyncio.run(hm.sync_workspace(Workspace(dirs=[tmp_path / "code"]), conda=True, auto_reload=True)) is None
    # a reference to the same hosts, received elsewhere, has no scheduler to ask
    ref = pickle.loads(pickle.dumps(hm))
    with pytest.raises(NotImplementedError, match=r"not started by a scheduler of this client \(attach_to_workers"):
        asyncio.run(ref.sync_workspace(Workspace(dirs=[tmp_path / "code"])))
    hm.shutdown().get(timeout=60)
    with pytest.raises(RuntimeError, match="has been shut down"):
        asyncio.run(hm.sync_workspace(Workspace()))


def _doc_scheduler() -> types.ModuleType:
    text = DOC.read_text()
    section = text[text.index("A complete scheduler"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    mod = types.ModuleType("fixed_workers_from_docs")
    exec(compile(code, str(DOC), "exec"), mod.__dict__)
    return mod


def test_a_scheduler_that_cannot_copy_says_so_by_name(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    sched = _doc_scheduler().FixedWorkers()
    tag = uuid.uuid4().hex[:8]
    request = AllocationRequest("fixed", {"workers": [f"ipc://@ws-{tag}-0"]}, "<test fixed>")
    record = _alloc.allocate(sched, request, _start.runtime(), 60)
    hm = _mesh.host_mesh_of(record, "fixed")
    try:
        with pytest.raises(NotImplementedError) as ei:
            asyncio.run(hm.sync_workspace(Workspace(dirs=[tmp_path / "code"])))
        msg = str(ei.value)
        assert "host mesh 'fixed'" in msg and "scheduler 'fixed' (<test fixed>) cannot copy a workspace" in msg, msg
        assert "Install the code on every host" in msg and "ssh" in msg, msg
    finally:
        hm.shutdown().get(timeout=60)
