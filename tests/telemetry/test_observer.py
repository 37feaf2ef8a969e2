"""The runtime's observer: the proc runtime tells telemetry what happens only
through the hooks of ``_proc._observer.Observer``, and telemetry's observer
answers every one of them, with the same parameters."""

from __future__ import annotations

import inspect

import pytest

from monarch_core._proc._observer import Observer
from monarch_core._telemetry._observer import Telemetry

pytestmark = pytest.mark.unit


def _hooks() -> list[str]:
    return sorted(n for n, v in vars(Observer).items() if not n.startswith("_") and callable(v))


def test_telemetry_implements_every_hook_of_the_observer_with_its_parameters() -> None:
    assert _hooks(), "the null observer declares no hook"
    for name in _hooks():
        assert name in vars(Telemetry), f"Telemetry leaves {name} to the null observer"
        want = list(inspect.signature(getattr(Observer(), name)).parameters)
        got = list(inspect.signature(getattr(Telemetry(), name)).parameters)
        assert got == want, f"Telemetry.{name}{got} does not take the hook's parameters {want}"
    assert Telemetry.current_span is not None  # what the runtime sets around an endpoint run with a span


def test_the_null_observer_instruments_nothing() -> None:
    null = Observer()
    assert null.client_side(object()) is False  # kept by the endpoint: the call path skips telemetry
    assert null.server_stat(object(), "step", None) is False  # kept by the actor host
    assert null.server_span(("k", "step")) is None and null.init_span(b"x" * 24) is None
    assert null.spawn_trace("mesh") == (None, None)
    cell = object()
    assert null.actor_mesh_stopping(object(), "stopped", cell) is cell
    assert null.log_extra("user", actor="a") == {}


def test_a_runtime_is_built_with_the_null_observer_unless_handed_one() -> None:
    from monarch_core._proc._state import ProcRuntime

    fields = {f.name: f for f in ProcRuntime.__dataclass_fields__.values()}
    assert type(fields["observer"].default_factory()) is Observer
