"""An undeliverable call names the call too: a call to an actor that never
appears on a live proc is returned as ``UndeliverableMessageError`` after the
hold timeout, with the actor mesh, class, endpoint and rank it was for."""

from __future__ import annotations

import pytest

from monarch_core._proc import _agent
from monarch_core._actor._actor_mesh import _rebuild_actor_mesh
from monarch_core._mesh._shape import Extent
from monarch_core.actor import Actor, endpoint, this_proc
from monarch_core.errors import UndeliverableMessageError

from _helpers import T, client_runtime


class Ghost(Actor):
    @endpoint
    def ok(self) -> int:
        return 1


def test_an_undeliverable_call_names_mesh_class_endpoint_and_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    this_proc()  # the client's runtime
    monkeypatch.setattr(_agent, "HOLD_TIMEOUT", 0.2)
    rt = client_runtime()
    ref = (rt.proc_id, rt.kernel.address)
    # a reference to a mesh whose actor this (live) proc never spawns
    ghost = _rebuild_actor_mesh(Ghost, "ghosts", "ghosts-0000000000", [ref, ref], Extent(["gpus"], [2]).region)
    exc = ghost.slice(gpus=1).ok.call_one().exception(timeout=T)
    assert type(exc) is UndeliverableMessageError, f"{type(exc).__name__}: {exc}"
    text = str(exc)
    assert "was not delivered" in text  # what it said before
    assert "call_one() of ghosts.ok (actor mesh 'ghosts', class Ghost) failed on rank 0" in text
    exc = ghost.ok.call().exception(timeout=T)
    assert type(exc) is UndeliverableMessageError, f"{type(exc).__name__}: {exc}"
    assert "call() of ghosts.ok (actor mesh 'ghosts', class Ghost) failed on rank " in str(exc)
