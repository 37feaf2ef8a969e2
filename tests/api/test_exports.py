"""The public surface of ``monarch_core.actor``: exactly the names the
reference documents as ``monarch.actor.X``; the tensor-engine entry points
come from the engine plugin (``ImportError`` naming it without one)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

import monarch_core.actor as mactor
from monarch_core.actor import Actor, endpoint, traced

from _helpers import fresh


#: every ``monarch.actor.X`` documented in the reference page
SPEC_NAMES = {
    "Accumulator",
    "Actor",
    "ActorError",
    "Channel",
    "Context",
    "Endpoint",
    "Extent",
    "Future",
    "HostMesh",
    "MeshFailure",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "ValueMesh",
    "as_endpoint",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "default_bootstrap_cmd",
    "enable_transport",
    "endpoint",
    "get_or_spawn_controller",
    "hosts_from_config",
    "send",
    "shutdown_context",
    "this_host",
    "this_proc",
    "traced",
    "unhandled_fault_hook",
}


class Plain(Actor):
    @endpoint
    def one(self) -> int:
        return 1


def test_all_is_exactly_the_documented_names() -> None:
    assert len(mactor.__all__) == len(set(mactor.__all__)), "duplicates in __all__"
    assert sorted(mactor.__all__) == sorted(SPEC_NAMES)


def test_every_documented_name_is_importable() -> None:
    for name in SPEC_NAMES:
        assert hasattr(mactor, name), name
    ns: dict = {}
    exec("from monarch_core.actor import *", ns)  # noqa: S102
    assert SPEC_NAMES <= set(ns)


def test_documented_classes_and_functions() -> None:
    for cls in (
        "Accumulator",
        "Actor",
        "ActorError",
        "Channel",
        "Context",
        "Extent",
        "Future",
        "HostMesh",
        "MeshFailure",
        "Point",
        "Port",
        "PortReceiver",
        "ProcMesh",
        "ValueMesh",
    ):
        assert inspect.isclass(getattr(mactor, cls)), cls
    for fn in (
        "as_endpoint",
        "concurrent_endpoint",
        "context",
        "current_actor_name",
        "current_rank",
        "current_size",
        "default_bootstrap_cmd",
        "enable_transport",
        "endpoint",
        "get_or_spawn_controller",
        "hosts_from_config",
        "send",
        "shutdown_context",
        "this_host",
        "this_proc",
        "traced",
        "unhandled_fault_hook",
    ):
        assert callable(getattr(mactor, fn)), fn
    assert issubclass(mactor.ActorError, Exception)


def test_endpoint_rref_outside_an_active_mesh_says_so(procs) -> None:
    m = procs.spawn(fresh("plain"), Plain)
    with pytest.raises((RuntimeError, ImportError)):  # outside activate(); no engine: install it
        m.one.rref()
    assert m.one.call().get().values() == [1, 1, 1, 1]


def test_proc_mesh_tensor_methods_come_from_the_engine_plugin(procs) -> None:
    """With monarch-tensor-engine installed they work (its own tests cover
    them); without it each raises ImportError naming the plugin
    (plugins/tensor_engine/tests/test_tensor_engine.py runs that case)."""
    from importlib.util import find_spec

    if find_spec("monarch_tensor_engine") is None:
        for call in (procs.activate, lambda: procs.rank_tensor("gpus"), procs.rank_tensors):
            with pytest.raises(ImportError, match="needs the distributed tensor engine.*plugins/tensor_engine"):
                call()
        return
    with procs.activate():
        assert set(procs.rank_tensors()) == {"gpus"}
        assert procs.rank_tensor("gpus").shape == ()


def test_traced_wraps_sync_and_async_functions() -> None:
    @traced
    def add(a: int, b: int) -> int:
        return a + b

    @traced(name="custom_span")
    async def mul(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a * b

    assert add(2, 3) == 5
    assert add.__name__ == "add"
    assert asyncio.run(mul(4, 5)) == 20


def test_the_version_attribute_is_the_distributions() -> None:
    """``monarch_core.__version__`` is what the plugin registry reports for
    the core, so it must match the installed distribution's metadata."""
    from importlib import metadata

    import monarch_core

    try:
        installed = metadata.version("monarch-core")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a plain checkout
        pytest.skip("monarch-core is not installed (scripts/test.sh installs it)")
    assert monarch_core.__version__ == installed
