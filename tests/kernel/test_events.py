"""The runtime's event bus (``_kernel._events.EventBus``): declared events,
listeners called once each with the event's arguments, a raising listener
logged without stopping the others, unknown names refused with the known ones."""

from __future__ import annotations

import logging

import pytest

from monarch_core._kernel._events import EventBus
from monarch_core._proc import _lifecycle

pytestmark = pytest.mark.unit


def test_listeners_hear_each_event_once_and_in_subscription_order() -> None:
    bus = EventBus(("proc_failed",))
    heard: list[tuple] = []

    def first(**kw: object) -> None:
        heard.append(("first", kw))

    def second(**kw: object) -> None:
        heard.append(("second", kw))

    bus.subscribe("proc_failed", first)
    bus.subscribe("proc_failed", second)
    bus.subscribe("proc_failed", first)  # again: still once
    bus.emit("proc_failed", proc_id="p", reason="gone", stopped=False)
    assert heard == [("first", {"proc_id": "p", "reason": "gone", "stopped": False}),
                     ("second", {"proc_id": "p", "reason": "gone", "stopped": False})]
    bus.unsubscribe("proc_failed", first)
    bus.emit("proc_failed", proc_id="q", reason="", stopped=True)
    assert [who for who, _ in heard] == ["first", "second", "second"]


def test_a_raising_listener_is_logged_and_the_others_still_hear(caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus(("proc_failed",))
    heard: list[str] = []

    def broken(**kw: object) -> None:
        raise RuntimeError("listener bug")

    bus.subscribe("proc_failed", broken)
    bus.subscribe("proc_failed", lambda **kw: heard.append("ok"))
    with caplog.at_level(logging.ERROR, logger="monarch.events"):
        bus.emit("proc_failed", proc_id="p", reason="", stopped=False)
    assert heard == ["ok"]
    assert "proc_failed listener" in caplog.text and "broken" in caplog.text and "listener bug" in caplog.text


def test_an_unknown_event_is_refused_naming_the_known_ones() -> None:
    bus = EventBus(("proc_failed", "proc_stopped"))
    with pytest.raises(KeyError, match="'proc_fialed'.*proc_failed, proc_stopped"):
        bus.subscribe("proc_fialed", lambda **kw: None)
    with pytest.raises(KeyError, match="proc_failed, proc_stopped"):
        bus.emit("nope")


def test_the_process_lifecycle_is_an_event_bus() -> None:
    assert isinstance(_lifecycle.bus, EventBus)
    assert set(_lifecycle.bus.events) == set(_lifecycle.EVENTS)
