"""The runtime's instrumentation (``_proc._instrumentation``): the per-call
interface the proc runtime calls telemetry through.  Telemetry implements
every method of the ``Instrumentation`` protocol with its parameters, the null
one answers "not instrumented", a runtime is built with the null one unless
handed another, and what the runtime *tells* is not on it (those are events)."""

from __future__ import annotations

import inspect

import pytest

from monarch_core._proc._instrumentation import Instrumentation, NoInstrumentation
from monarch_core._proc._runtime_events import EVENTS
from monarch_core._telemetry._runtime import Telemetry

pytestmark = pytest.mark.unit


def _members() -> list[str]:
    return sorted(n for n, v in vars(Instrumentation).items() if not n.startswith("_") and callable(v))


def test_telemetry_and_the_null_one_implement_every_method_with_its_parameters() -> None:
    assert _members(), "the protocol declares no method"
    for impl in (Telemetry, NoInstrumentation):
        for name in _members():
            assert name in vars(impl), f"{impl.__name__} lacks {name}"
            want = list(inspect.signature(getattr(Instrumentation, name)).parameters)[1:]  # (less ``self``)
            got = list(inspect.signature(getattr(impl(), name)).parameters)
            assert got == want, f"{impl.__name__}.{name}{got} does not take the protocol's parameters {want}"
    assert Telemetry.current_span is not None  # what the runtime sets around an endpoint run with a span
    assert NoInstrumentation.current_span is None


def test_the_null_instrumentation_instruments_nothing() -> None:
    null = NoInstrumentation()
    assert null.client_side(object()) is False  # kept by the endpoint: the call path skips telemetry
    assert null.server_stat(object(), "step", None) is False  # kept by the actor's invoker
    assert null.server_span(("k", "step")) is None and null.init_span(b"x" * 24) is None
    assert null.spawn_trace("mesh") == (None, None)
    assert null.log_extra("user", actor="a") == {}
    ran: list[tuple] = []
    null.run_init(object(), (b"", 1, None), lambda *a, **k: ran.append((a, k)), (1,), {"x": 2})
    assert ran == [((1,), {"x": 2})]


def test_what_the_runtime_tells_is_an_event_not_an_instrumentation_method() -> None:
    assert not set(_members()) & set(EVENTS), "a method of the instrumentation is also an event"
    for gone in ("lifecycle", "register_procs", "proc_ready", "proc_ended", "actor_failed", "supervision_event",
                 "supervision_handled", "actor_mesh_spawned", "actor_mesh_stopping", "after_procs_stopped",
                 "retire_when_stopped", "retire_server", "final_flush"):
        assert not hasattr(Telemetry, gone) and not hasattr(NoInstrumentation, gone), gone


def test_a_runtime_is_built_with_the_null_instrumentation_unless_handed_one() -> None:
    from monarch_core._proc._state import ProcRuntime

    fields = {f.name: f for f in ProcRuntime.__dataclass_fields__.values()}
    assert type(fields["instrumentation"].default_factory()) is NoInstrumentation
    assert "observer" not in fields
