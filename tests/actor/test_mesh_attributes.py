"""``MESH_ATTRIBUTES`` (the names ``Actor`` refuses for endpoints) covers every
attribute an ``ActorMesh`` answers itself, instance attributes included."""

from __future__ import annotations

from monarch_core._actor._actor_mesh import MESH_ATTRIBUTES
from monarch_core.actor import Actor, endpoint, this_proc

from _helpers import T, fresh
import pytest

pytestmark = pytest.mark.unit


class Plain(Actor):
    @endpoint
    def ok(self) -> int:
        return 1


def test_mesh_attributes_cover_what_a_spawned_mesh_sets() -> None:
    mesh = this_proc().spawn(fresh("plain"), Plain)
    try:
        assert mesh.ok.call_one().get(timeout=T) == 1
        for view in (mesh, mesh.slice(), mesh._with_region(mesh._region_)):
            missing = set(vars(view)) - MESH_ATTRIBUTES
            assert not missing, f"ActorMesh instance attributes missing from MESH_ATTRIBUTES: {sorted(missing)}"
        assert {"size", "slice", "rename", "stop", "split", "flatten", "sizes", "extent"} <= MESH_ATTRIBUTES
        assert not any(n.startswith("__") and n.endswith("__") for n in MESH_ATTRIBUTES)
    finally:
        mesh.stop().get(timeout=T)
