"""``Workspace`` and ``HostMesh.sync_workspace``, the core's side: the type's
checks, where it is importable, and who copies -- nothing for this machine's
hosts (``this_host()``, ``local``), a clear ``NotImplementedError`` naming
the scheduler for one that cannot (the documented third-party scheduler),
and for worker loops this client did not start.  Real worker loops on this
machine; copying over SSH is tested in plugins/scheduler_ssh/tests."""

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
from monarch_core._launch import _alloc
from monarch_core._workspace import Workspace
from monarch_core.actor import this_host
from monarch_core.hookspecs import AllocationRequest

from _helpers import client_runtime

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
    record = _alloc.allocate(sched, request, client_runtime(), 60)
    hm = _mesh.host_mesh_of(record, "fixed")
    try:
        with pytest.raises(NotImplementedError) as ei:
            asyncio.run(hm.sync_workspace(Workspace(dirs=[tmp_path / "code"])))
        msg = str(ei.value)
        assert "host mesh 'fixed'" in msg and "scheduler 'fixed' (<test fixed>) cannot copy a workspace" in msg, msg
        assert "Install the code on every host" in msg and "ssh" in msg, msg
    finally:
        hm.shutdown().get(timeout=60)


# ---------------------------------------------------------------- conda=True, auto_reload=True: the core's parts


class Reader(mactor.Actor):
    """Reads a module of a synced workspace: its VALUE, its value() and an
    object made before any reload (whose method body a reload replaces)."""

    def __init__(self) -> None:
        self.obj = None

    @mactor.endpoint
    def read(self, name: str) -> list:
        import importlib

        mod = importlib.import_module(name)
        if self.obj is None:
            self.obj = mod.Thing()
        return [mod.VALUE, mod.value(), self.obj.get(), mod.__file__]


def _module(d: Path, name: str, n: int) -> None:
    (d / f"{name}.py").write_text(
        f"VALUE = {n}\n\ndef value():\n    return {n}\n\n\nclass Thing:\n    def get(self):\n        return {n}\n"
    )


def _wait_for(fn, want, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout
    got = fn()
    while got != want and time.monotonic() < deadline:
        time.sleep(0.1)
        got = fn()
    return got


def test_auto_reload_reloads_changed_modules_in_running_procs(configured_hosts, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_AUTO_RELOAD_INTERVAL", "0.1")
    code = tmp_path / "code"
    code.mkdir()
    name = f"wsmod_{uuid.uuid4().hex[:8]}"
    _module(code, name, 1)
    hm = configured_hosts("dev", hosts=2)
    asyncio.run(hm.sync_workspace(Workspace(dirs=[code]), auto_reload=True))
    pm = hm.spawn_procs(per_host={"gpus": 1})
    readers = pm.spawn("readers", Reader)

    def read() -> list:
        return [v[:3] for v in readers.read.call(name).get(timeout=60).values()]

    first = readers.read.call(name).get(timeout=60).values()
    assert [v[:3] for v in first] == [[1, 1, 1]] * 2
    assert all(Path(v[3]).parent == code for v in first), first  # the workspace is first on their sys.path
    _module(code, name, 22)  # another size: the watcher's stat sees it at once
    assert _wait_for(read, [[22, 22, 22]] * 2) == [[22, 22, 22]] * 2
    pm.stop().get(timeout=60)


def test_the_watcher_is_replaced_by_the_next_sync_and_ends_with_the_mesh(configured_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import threading

    (tmp_path / "code").mkdir()
    hm = configured_hosts("dev", hosts=1)

    def watchers() -> list:
        return [t for t in threading.enumerate() if t.name.startswith("monarch-auto-reload-") and t.is_alive()]

    before = len(watchers())
    asyncio.run(hm.sync_workspace(Workspace(dirs=[tmp_path / "code"]), auto_reload=True))
    first = hm._shared["watcher"]
    assert first is not None and first.alive and len(watchers()) == before + 1
    asyncio.run(hm.sync_workspace(Workspace(dirs=[tmp_path / "code"]), auto_reload=True))
    assert not first.alive and hm._shared["watcher"].alive and len(watchers()) == before + 1
    asyncio.run(hm.sync_workspace(Workspace(dirs=[tmp_path / "code"])))  # auto_reload=False: no watcher
    assert hm._shared["watcher"] is None and len(watchers()) == before
    asyncio.run(hm.sync_workspace(Workspace(dirs=[tmp_path / "code"]), auto_reload=True))
    w = hm._shared["watcher"]
    hm.stop().get(timeout=60)
    assert not w.alive and len(watchers()) == before
    asyncio.run(hm.sync_workspace(Workspace(dirs=[tmp_path / "code"]), auto_reload=True))
    w = hm._shared["watcher"]
    hm.shutdown().get(timeout=60)
    assert not w.alive and len(watchers()) == before


def test_reload_replaces_module_names_and_old_classes_method_bodies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from monarch_core._proc import _reload

    name = f"wsmod_{uuid.uuid4().hex[:8]}"
    _module(tmp_path, name, 1)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    mod = importlib.import_module(name)
    old_value, obj = mod.value, mod.Thing()
    _module(tmp_path, name, 333)
    reloaded, errors = _reload.reload_paths([str(tmp_path / f"{name}.py"), str(tmp_path / "not_loaded.py")])
    assert reloaded == [name] and errors == []
    assert mod.VALUE == 333 and mod.value() == 333 and obj.get() == 333  # the old object runs the new body
    assert old_value() == 1  # a binding taken before (from x import y) is the old function
    (tmp_path / f"{name}.py").write_text("raise RuntimeError('broken edit')\n")
    reloaded, errors = _reload.reload_paths([str(tmp_path / f"{name}.py")])
    assert reloaded == [] and "broken edit" in errors[0] and name in errors[0]
    sys_mod = types.SimpleNamespace(__file__=str(tmp_path / "ext.cpython-311-x86_64-linux-gnu.so"))
    monkeypatch.setitem(__import__("sys").modules, f"{name}_ext", sys_mod)
    reloaded, errors = _reload.reload_paths([sys_mod.__file__])
    assert reloaded == [] and "C extension" in errors[0]


def test_changed_files_and_where_the_host_holds_them(tmp_path: Path) -> None:
    from monarch_core._launch import _code_sync
    from monarch_core._workspace import SyncedHost

    a, b = tmp_path / "a", tmp_path / "b"
    (a / "pkg").mkdir(parents=True)
    b.mkdir()
    (a / "pkg" / "m.py").write_text("x = 1\n")
    (b / "n.py").write_text("y = 1\n")
    (a / "pkg" / "m.cpython-311.pyc").write_bytes(b"\0")
    ws = Workspace(dirs=[a, b])
    before = _code_sync.snapshot(ws)
    assert sorted(p.name for p in before) == ["m.py", "n.py"]
    (b / "n.py").write_text("y = 22\n")
    (b / "new.py").write_text("z = 1\n")
    after = _code_sync.snapshot(ws)
    changed = _code_sync.changed_files(before, after)
    assert changed == [b / "n.py", b / "new.py"]
    host = SyncedHost(paths=("/r/a", "/r/b"))
    assert _code_sync.remote_files(ws, host, changed + [a / "pkg" / "m.py"]) == ["/r/a/pkg/m.py", "/r/b/n.py", "/r/b/new.py"]


def test_remote_procs_do_not_get_the_clients_environment_on_sys_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    from monarch_core._launch import _code_sync

    site = str(Path(sys.prefix) / "lib" / "site-packages-x")
    code = str(tmp_path)
    monkeypatch.setattr(sys, "path", [code, site, str(Path(sys.base_prefix) / "lib" / "python3.zip"), ""])
    assert _code_sync.remote_sys_path() == (code,)
    shared = {"synced": {"h1": __import__("monarch_core._workspace", fromlist=["x"]).SyncedHost(("/r/ws",), "/r/env/bin/python")}}
    assert _code_sync.spawn_overrides(shared, "h1", (code,)) == (("/r/ws", code), "/r/env/bin/python")
    assert _code_sync.spawn_overrides(shared, "h2", (code,)) == ((code,), None)


def test_active_environment_is_the_conda_env_or_the_venv_else_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    from monarch_core._workspace import active_environment

    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /opt/python/bin\ninclude-system-site-packages = false\n")
    monkeypatch.setattr(sys, "prefix", str(venv))
    env = active_environment()
    assert (env.kind, env.name, env.home, env.prefix) == ("venv", "venv", "/opt/python/bin", venv)
    assert env.remote_root("/w") == "/w/.monarch/env/venv"
    conda = tmp_path / "envs" / "train"
    conda.mkdir(parents=True)
    monkeypatch.setenv("CONDA_PREFIX", str(conda))
    env = active_environment()
    assert (env.kind, env.name, env.home, env.python) == ("conda", "train", None, "bin/python")
    monkeypatch.delenv("CONDA_PREFIX")
    monkeypatch.setattr(sys, "prefix", sys.base_prefix)
    with pytest.raises(RuntimeError, match=r"system interpreter.*python -m venv.*conda activate"):
        active_environment()
