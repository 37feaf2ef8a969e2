"""Run the reference's (torchmonarch 0.7.0) own public-API tests on monarch-core and print how many
pass.

    python plugins/monarch_compat/tests/run_reference_tests.py WHEEL_OR_DIR [-k EXPR] [--list] [--keep DIR]

``WHEEL_OR_DIR`` is the reference's wheel (``torchmonarch-0.7.0-*.whl``; its tests are under
``tests/`` in it) or a directory holding that ``tests/`` folder (an unzipped wheel, or a checkout's
``python/``).  Nothing of the reference is copied into this repository: the tests are written to a
temporary folder, and ``import monarch`` there is monarch-compat, i.e. monarch-core.

Which files (the reference's ``tests/``)
----------------------------------------
Run: ``test_python_actors.py``, ``test_actor_error.py``, ``test_concurrent_endpoints.py``,
``test_returns_future.py``, ``test_proc_mesh.py``, ``test_host_mesh.py``,
``test_supervision_hierarchy.py``, ``test_future.py`` -- the files about actors, endpoints,
futures, meshes and supervision, which is what ``monarch.actor`` is (``test_future.py`` has no
public-API test: it is about the tensor engine's ``monarch.common`` futures).

Not run, each for its reason:

* Rust bindings, the reference's own internals: ``test_rust_*``, ``test_*_characterization.py``,
  ``test_sync_actor_driver.py``, ``test_actor_loop_finalization.py``, ``test_gil_*``,
  ``test_signal_safe_block_on.py``, ``test_extension_linking.py``, ``test_mesh_trait.py``,
  ``test_chain_broadcast.py``, ``test_controller_dedup.py``, ``test_value_mesh_compression_scheme.py``,
  ``test_worker_fork_contract.py``, ``test_client_context_guard.py``, ``_monarch/``;
* the tensor engine, CUDA or its simulator: ``test_tensor_engine.py``, ``test_remote_functions.py``,
  ``test_controller.py``, ``test_coalescing.py``, ``test_device_mesh.py``, ``test_grad_generator.py``,
  ``test_builtins_*``, ``test_cuda.py``, ``test_mock_cuda.py``, ``simulator/``;
* RDMA hardware: ``test_rdma*``, ``rdma_*``;
* Kubernetes, Slurm, FUSE mounts: ``_src/job/``, ``test_remotemount.py``, ``test_gather_mount.py``;
* the reference's telemetry store, dashboard, debugger and command line, which monarch-core
  provides differently (docs/observability.md, docs/debugging.md): ``test_*telemetry*``,
  ``test_debugger.py``, ``test_cli_integration.py``, ``tools/``, ``test_shell.py``,
  ``test_port_forward.py``, ``test_port_reconstruction.py``, ``code_sync/``, ``test_job.py``
  (its job state files and service processes), ``test_config.py`` (the reference's own keys),
  ``test_actor_logging.py`` / ``test_client_shutdown.py`` / ``test_shutdown_without_client.py`` /
  ``test_failure_introspection.py`` / ``test_inter_mesh_ping_pong.py`` /
  ``test_actor_shape.py`` / ``test_spmd*.py`` / ``test_cookbook.py`` (each reads the reference's
  private modules in every test).

Which tests of those files
--------------------------
A test is public-API when everything it uses is: the module's imports of the reference's private
paths (``monarch._rust_bindings``, ``monarch._src``, ``monarch.common``, ``monarch._testing``,
``monarch.simulator``; and ``monarch.tools``, the reference's TorchX launcher, which monarch-core
does not provide) are removed, except a private path to a name the reference exports publicly
(in ``monarch.actor``, ``monarch.job`` or ``monarch.config``'s ``__all__``, read from the
reference's own files), which is imported from the public module instead.  A module-level name
(helper, actor class, fixture, constant) that uses a removed name is removed with it, and so on to
a fixed point; a test is run when neither it, its decorators, its class, nor its fixtures use a
removed name, a ``monarch.<_private>`` attribute, a private attribute of an object
(``future._as_handle()``; ``self._x`` and the standard library's ``sys._getframe`` excepted), an
import of a private path in its body, or a ``"monarch._..."`` string (``mock.patch`` targets); it
does not mention CUDA, RDMA or Kubernetes; and it is not marked ``oss_skip`` (the reference skips
those in its own open-source CI).  A public name of the reference that monarch-core lacks
(``monarch.job.new_service_proc_id``) fails the tests that use it, not the whole file.  The selected tests' code is run as the
reference wrote it.  ``async def`` tests run under ``asyncio.run`` (the reference's runner does
that; pytest-asyncio is not a dependency here).

Differences kept on purpose (docs/compat.md, "Differences kept on purpose") make a test fail
here; such tests are listed in ``EXPECTED_DIFFERENT`` with the difference, counted as failed, and
counted apart too (the last line gives the pass rate without them).

A test that skips itself (a tool this machine lacks, such as ``numactl``) is listed and not counted.

``--python PATH`` runs the tests under another interpreter (default: the one running this).  When
that interpreter cannot import ``monarch_compat`` (e.g. a virtual environment holding the reference
itself, to compare), the selection is the same (it is made as above) but nothing is rewritten: the
reference's files run as it ships them, its private paths and all, and only the selected tests run
(by node id).
Prints each failure, then ``passed P failed F total T`` and the rate without the tests of kept
differences; the exit status is 0 when that rate is at least 95%.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
import zipfile

FILES: tuple[str, ...] = (
    "test_python_actors.py",
    "test_actor_error.py",
    "test_concurrent_endpoints.py",
    "test_returns_future.py",
    "test_proc_mesh.py",
    "test_host_mesh.py",
    "test_supervision_hierarchy.py",
    "test_future.py",
)

PRIVATE_PREFIXES = ("monarch._rust_bindings", "monarch._src", "monarch.common", "monarch._testing",
                    "monarch.simulator", "monarch.mesh_controller", "monarch.gather_mount",
                    "monarch.remotemount", "monarch.tools")
PUBLIC_MODULES = ("monarch.actor", "monarch.job", "monarch.config")
#: words whose mention marks a test as needing hardware or a cluster monarch-core's CI lacks
HARDWARE = re.compile(r"\bcuda\b|rdma|kubernetes|\bnccl\b", re.IGNORECASE)

#: tests that check a behaviour monarch-core keeps different on purpose (docs/compat.md)
_CONFIG = "configure() takes monarch-core's settings; the reference's key ({}) is a ConfigError naming the closest"
_SAME_NAME = ("a second live actor mesh of one name on a proc mesh is refused (an earlier test of the file spawned "
              "'{}' on this process's proc mesh)")
EXPECTED_DIFFERENT: dict[str, str] = {
    "test_mesh_len": _CONFIG.format("message_delivery_timeout"),
    "test_attach_fails_closed_on_unreachable_host": _CONFIG.format("mesh_attach_config_timeout"),
    "test_attach_failure_replays_to_fresh_readiness_observers": _CONFIG.format("mesh_attach_config_timeout"),
    "test_client_hard_exit_cleanup": _CONFIG.format("mesh_orphan_timeout"),
    "test_proc_mesh_on_root_client_spawns_actor_in_client_os_process": _SAME_NAME.format("pid_actor"),
    "test_context_proc_mesh_in_controller_spawns_actor_in_client_os_process": _SAME_NAME.format("pid"),
    "test_actor_mixing_sync_and_async_endpoints_is_rejected_at_spawn":
        "an actor may mix sync and async endpoints (each runs on the actor's own thread, one message at a time)",
    "test_alias_bootstrap": "a plain tcp:// worker loop listening beyond loopback (tcp://0.0.0.0) needs insecure_tcp=True",
}

#: modules whose ``_private`` names tests may use (``sys._current_frames``)
_STDLIB = frozenset(sys.stdlib_module_names)

_ASYNC_PLUGIN = '''
"""Runs ``async def`` tests under asyncio.run (written by run_reference_tests.py)."""
import asyncio
import inspect

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    fn = pyfuncitem.obj
    if not inspect.iscoroutinefunction(fn):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {n: pyfuncitem.funcargs[n] for n in names}
    asyncio.run(fn(**kwargs))
    return True


def pytest_configure(config):
    config.addinivalue_line("markers", "oss_skip: the reference skips it in its open-source CI")


class missing:
    """A public name of the reference that monarch-core does not provide: any use raises."""

    def __init__(self, module, name):
        self._what = f"{module}.{name} is not provided by monarch-core"

    def __getattr__(self, attr):
        if attr.startswith("__") or attr == "_what":  # (pickling, copying: no recursion through _what)
            raise AttributeError(attr)
        raise ImportError(self._what)

    def __call__(self, *args, **kwargs):
        raise ImportError(self._what)

    def __getitem__(self, item):
        return self

    def __mro_entries__(self, bases):
        raise ImportError(self._what)
'''


def _public_names(root: str) -> dict[str, str]:
    """Name -> the reference's public module exporting it (static read of its ``__all__``)."""
    out: dict[str, str] = {}
    for mod in PUBLIC_MODULES:
        path = os.path.join(root, *mod.split("."), "__init__.py")
        if not os.path.exists(path):
            path = os.path.join(root, *mod.split(".")) + ".py"
        if not os.path.exists(path):
            continue
        tree = ast.parse(open(path).read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                    for t in node.targets):
                for elt in getattr(node.value, "elts", []):
                    if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                        out.setdefault(elt.value, mod)
    return out


def _private(module: str | None) -> bool:
    return bool(module) and any(module == p or module.startswith(p + ".") for p in PRIVATE_PREFIXES)


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _uses(node: ast.AST) -> tuple[set[str], bool]:
    """(names it loads or takes as fixtures, whether it reaches a private path or hardware)."""
    names: set[str] = set()
    private = False
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            d = _dotted(sub)
            if d and d.startswith("monarch.") and any(p.startswith("_") for p in d.split(".")[1:]):
                private = True
            if d and _private(d):
                private = True
            if (sub.attr.startswith("_") and not sub.attr.startswith("__")
                    and not (isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls"))
                    and not (d and d.split(".")[0] in _STDLIB)):
                private = True  # a private attribute of a monarch object (``future._as_handle()``)
        elif isinstance(sub, ast.ImportFrom) and _private(sub.module):  # inside the test's body
            private = True
        elif isinstance(sub, ast.Import) and any(_private(a.name) for a in sub.names):
            private = True
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            if _private(sub.value.split(":")[0]) or sub.value.startswith("monarch._"):
                private = True
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for a in sub.args.args + sub.args.kwonlyargs + sub.args.posonlyargs:
                names.add(a.arg)
    src = ast.unparse(node)
    if HARDWARE.search(src):
        private = True
    return names, private


def _bound(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    out: set[str] = set()
    targets: list[ast.AST] = []
    if isinstance(stmt, ast.Assign):
        targets = list(stmt.targets)
    elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
        targets = [stmt.target]
    for t in targets:
        for sub in ast.walk(t):
            if isinstance(sub, ast.Name):
                out.add(sub.id)
    return out


def _is_test_class(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.ClassDef) and any(_is_test(m) for m in stmt.body) and (
        stmt.name.startswith("Test") or any((_dotted(b) or "").endswith("TestCase") for b in stmt.bases))


def _is_test(stmt: ast.stmt) -> bool:
    return isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name.startswith("test")


def select(source: str, public: dict[str, str]) -> tuple[str, list[str], dict[str, str]]:
    """Rewrite one test module: (new source, selected test ids, excluded test id -> why)."""
    tree = ast.parse(source)
    removed: set[str] = set()
    body: list[ast.stmt] = []
    for stmt in tree.body:  # the imports
        if isinstance(stmt, ast.ImportFrom) and _private(stmt.module):
            for alias in stmt.names:
                local = alias.asname or alias.name
                if alias.name in public and stmt.module.count(".") >= 3:  # (not a package's submodule)  # a name monarch-core lacks fails the tests that use it, not the file
                    body.extend(ast.parse(
                        f"try:\n    from {public[alias.name]} import {alias.name} as {local}\n"
                        f"except ImportError:\n    from _monarch_core_async import missing\n"
                        f"    {local} = missing({public[alias.name]!r}, {alias.name!r})\n").body)
                else:
                    removed.add(local)
            continue
        if isinstance(stmt, ast.ImportFrom) and stmt.module in PUBLIC_MODULES:
            for alias in stmt.names:  # one by one: a name monarch-core lacks fails the tests that use it
                local = alias.asname or alias.name
                body.extend(ast.parse(
                    f"try:\n    from {stmt.module} import {alias.name} as {local}\n"
                    f"except ImportError:\n    from _monarch_core_async import missing\n"
                    f"    {local} = missing({stmt.module!r}, {alias.name!r})\n").body)
            continue
        if isinstance(stmt, ast.Import) and any(_private(a.name) for a in stmt.names):
            kept = [a for a in stmt.names if not _private(a.name)]
            for a in stmt.names:
                if _private(a.name) and a.asname:
                    removed.add(a.asname)
            if kept:
                body.append(ast.Import(names=kept))
            continue
        body.append(stmt)
    # module-level definitions that use a removed name go too, to a fixed point
    info: dict[int, tuple[set[str], bool]] = {id(s): _uses(s) for s in body}
    dropped: set[int] = set()
    why_dropped: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for s in body:
            if id(s) in dropped or _is_test(s) or _is_test_class(s):
                continue
            names, priv = info[id(s)]
            if isinstance(s, (ast.Import, ast.ImportFrom)):
                continue
            if (priv and not _bound(s) == set()) or names & removed:
                if isinstance(s, (ast.Expr, ast.If, ast.Try)) and not _bound(s):
                    # a module-level statement binding nothing: drop only when it uses a removed name
                    if not names & removed:
                        continue
                dropped.add(id(s))
                why_dropped[", ".join(sorted(_bound(s)))] = ", ".join(sorted(names & removed)[:4]) or "private path"
                removed |= _bound(s)
                changed = True
    selected: list[str] = []
    excluded: dict[str, str] = {}
    out: list[ast.stmt] = []

    def verdict(node: ast.AST) -> str | None:
        names, priv = _uses(node)
        decorators = getattr(node, "decorator_list", [])
        if any("oss_skip" in ast.unparse(d) for d in decorators):
            return "marked oss_skip: the reference skips it in its open-source CI"
        bad = sorted(names & removed)
        if bad:
            return "uses " + ", ".join(bad[:4])
        if priv:
            return "private path or hardware"
        return None

    for s in body:
        if id(s) in dropped:
            continue
        if _is_test(s):
            why = verdict(s)
            if why:
                excluded[s.name] = why
                continue
            selected.append(s.name)
        elif isinstance(s, ast.ClassDef) and _is_test_class(s):
            head = ast.ClassDef(name=s.name, bases=s.bases, keywords=s.keywords, body=[],
                                decorator_list=s.decorator_list, type_params=[])
            helpers = [m for m in s.body if not _is_test(m)]
            why_cls = verdict(head) or next((w for w in map(verdict, helpers) if w), None)
            kept_methods = []
            for m in s.body:
                if not _is_test(m):
                    continue
                assert isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                why = why_cls or verdict(m)
                if why:
                    excluded[f"{s.name}::{m.name}"] = why
                else:
                    kept_methods.append(m)
                    selected.append(f"{s.name}::{m.name}")
            if not kept_methods:
                continue
            s = ast.ClassDef(name=s.name, bases=s.bases, keywords=s.keywords,
                             body=helpers + kept_methods, decorator_list=s.decorator_list,
                             type_params=[])
        out.append(s)
    new = ast.Module(body=out, type_ignores=[])
    ast.fix_missing_locations(new)
    for name, why in why_dropped.items():
        excluded[f"(module-level {name})"] = "uses " + why
    return ast.unparse(new) + "\n", selected, excluded


def _materialize(src: str, dest: str) -> str:
    """Put the reference's ``tests/`` (and its ``monarch/*/__init__.py`` for reading) under ``dest``."""
    if os.path.isfile(src):
        with zipfile.ZipFile(src) as z:
            for name in z.namelist():
                if name.startswith("tests/") or (name.startswith("monarch/") and name.endswith("__init__.py")
                                                 and name.count("/") == 2):
                    z.extract(name, os.path.join(dest, "ref"))
        return os.path.join(dest, "ref")
    root = src if os.path.isdir(os.path.join(src, "tests")) else os.path.dirname(src.rstrip("/"))
    shutil.copytree(os.path.join(root, "tests"), os.path.join(dest, "ref", "tests"))
    for mod in PUBLIC_MODULES:
        init = os.path.join(root, *mod.split("."), "__init__.py")
        if os.path.exists(init):
            os.makedirs(os.path.join(dest, "ref", *mod.split(".")), exist_ok=True)
            shutil.copy(init, os.path.join(dest, "ref", *mod.split("."), "__init__.py"))
    return os.path.join(dest, "ref")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="the reference's wheel, or a folder holding its tests/")
    ap.add_argument("-k", default=None, help="pytest -k expression: run only these")
    ap.add_argument("--list", action="store_true", help="print the selection and the exclusions; run nothing")
    ap.add_argument("--keep", default=None, help="write the tests here (kept) instead of a temporary folder")
    ap.add_argument("--timeout", type=int, default=240, help="per test, seconds (default 240)")
    ap.add_argument("-n", default="0", help="pytest-xdist workers (default 0)")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter that runs the tests (default: this one; see the module docstring)")
    args = ap.parse_args(argv)
    as_shipped = subprocess.run([args.python, "-c", "import importlib.util, sys; "
                                 "sys.exit(importlib.util.find_spec('monarch_compat') is not None)"],
                                capture_output=True, timeout=120).returncode == 0
    print(f"interpreter: {args.python}" + (" (the reference's files as shipped, the selected tests by node id)"
                                           if as_shipped else ""), flush=True)

    work = args.keep or tempfile.mkdtemp(prefix="monarch-reftests-")
    os.makedirs(work, exist_ok=True)
    ref = _materialize(args.source, work)
    public = _public_names(ref)
    tests_dir = os.path.join(ref, "tests")
    run_dir = os.path.join(work, "run")
    if os.path.exists(run_dir):
        shutil.rmtree(run_dir)
    shutil.copytree(tests_dir, run_dir)  # the helpers (isolate_in_subprocess, ...) beside them
    with open(os.path.join(run_dir, "_monarch_core_async.py"), "w") as f:
        f.write(_ASYNC_PLUGIN)
    total_sel: list[str] = []
    for name in FILES:
        path = os.path.join(tests_dir, name)
        if not os.path.exists(path):
            print(f"missing from the reference: {name}")
            continue
        new, selected, excluded = select(open(path).read(), public)
        if not as_shipped:
            with open(os.path.join(run_dir, name), "w") as f:
                f.write(new)
        total_sel += [f"{name}::{t}" for t in selected]
        if args.list:
            print(f"== {name}: {len(selected)} selected, {len(excluded)} excluded")
            for t in selected:
                print(f"   run   {t}")
            for t, why in excluded.items():
                print(f"   skip  {t}  ({why})")
    if args.list:
        print(f"selected {len(total_sel)}")
        return 0
    junit = os.path.join(work, "junit.xml")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [run_dir, os.environ.get("PYTHONPATH")])))
    targets = ([os.path.join(run_dir, t) for t in total_sel] if as_shipped else
               [os.path.join(run_dir, n) for n in FILES if os.path.exists(os.path.join(run_dir, n))])
    cmd = [args.python, "-m", "pytest", "-p", "_monarch_core_async", "-o", "addopts=", "--rootdir", run_dir,
           "-p", "no:cacheprovider", f"--timeout={args.timeout}", "-q", "-rN", "--junitxml", junit,
           "-n", args.n, *(["-k", args.k] if args.k else []), *targets]
    subprocess.run(cmd, cwd=run_dir, env=env)
    passed: list[str] = []
    failed: list[tuple[str, str]] = []
    skipped: list[tuple[str, str]] = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        tid = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        kinds = {c.tag for c in case}
        if "skipped" in kinds:  # the test skipped itself (a tool this machine lacks): not counted
            skipped.append((tid, (case.find("skipped").get("message") or "")[:200]))
        elif kinds & {"failure", "error"}:
            el = case.find("failure") if case.find("failure") is not None else case.find("error")
            failed.append((tid, (el.get("message") or "")[:300].replace("\n", " ")))
        else:
            passed.append(tid)
    for tid, why in failed:
        note = EXPECTED_DIFFERENT.get(tid.split("::", 1)[-1].split("[", 1)[0])
        print(f"FAILED {tid}: {why}" + (f"  [difference kept: {note}]" if note else ""))
    for tid, why in skipped:
        print(f"SKIPPED {tid}: {why}")
    total = len(passed) + len(failed)
    kept = [t for t, _ in failed if t.split("::", 1)[-1].split("[", 1)[0] in EXPECTED_DIFFERENT]
    print(f"passed {len(passed)} failed {len(failed)} total {total} (skipped by themselves, not counted: "
          f"{len(skipped)}; of the failures, {len(kept)} check a difference kept on purpose: without them "
          f"{len(passed)}/{total - len(kept)})")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    counted = total - len(kept)
    return 0 if counted and len(passed) >= 0.95 * counted else 1


if __name__ == "__main__":
    sys.exit(main())
