"""A proc mesh whose ``bootstrap=`` raises: ``initialized`` fails with
``ActorError`` (user code raised, as for an actor's ``__init__``; the
reference raises the same), every time it is asked, carrying the remote
exception and traceback; a proc that could not start or died stays a
``SupervisionError`` (tests/launch/test_procs.py)."""

from __future__ import annotations

import pytest

from monarch_core.actor import this_host
from monarch_core.errors import ActorError, MonarchError

BOOT_FAILURE = "monarch-test bootstrap failure 7c1"


def failing_bootstrap() -> None:
    raise ValueError(BOOT_FAILURE)


def test_bootstrap_that_raises_fails_initialized_with_actor_error_every_time(meshes: list) -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=failing_bootstrap)
    meshes.append(pm)
    errors = []
    for _ in range(2):
        with pytest.raises(ActorError) as ei:
            pm.initialized.get(timeout=60)
        errors.append(ei.value)
    assert all(type(e) is ActorError for e in errors), errors
    assert not isinstance(errors[0], MonarchError)
    assert str(errors[0]) == str(errors[1])
    text = str(errors[0])
    assert "procs of proc mesh" in text and "failed while starting" in text, text
    assert "2 of 2 procs" in text and "(ranks 0-1)" in text, text  # which ranks, not "rank unknown"
    assert "start method unknown" not in text, text
    assert f"ValueError: {BOOT_FAILURE}" in text, text
    assert "in failing_bootstrap" in text, text  # the remote traceback, once
    assert text.count("Traceback of where the remote call failed") == 1, text
    assert isinstance(errors[0].exception, ValueError) and str(errors[0].exception) == BOOT_FAILURE
