"""Reports use the user's names (mesh name, actor class, endpoint, rank
coordinates), say whether the cause is user/system/infrastructure, and show
the first failure of a cascade first."""

from __future__ import annotations

import os
import re
import signal

import pytest

from monarch_core.actor import Actor, ActorError, endpoint, this_proc
from monarch_core.errors import SupervisionError

from _helpers import T, fresh
from _helpers.config import configured_host_mesh


class Fatal(BaseException):
    pass


class TrainerActor(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def train_step(self, msg: str) -> None:
        raise Fatal(msg)

    @endpoint
    def bad_step(self, msg: str) -> None:
        raise ValueError(msg)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """``{'hosts': 2, 'gpus': 2}`` procs on a configured two-host mesh."""
    hm = configured_host_mesh(tmp_path_factory.mktemp("reports_cfg"), "two", hosts=2)
    pm = hm.spawn_procs(per_host={"gpus": 2})
    pm.initialized.get(timeout=60)
    yield pm
    hm.shutdown().get(timeout=60)


def _internal_proc_ids(pm) -> list[str]:
    """The framework's own proc ids (from ``ProcMesh.to_table()``): these must
    not be what a report names."""
    rows = pm.to_table().splitlines()[1:]
    ids = []
    for row in rows:
        m = re.search(r"\}\s+(\S+)\s+\d+\s", row)
        if m:
            ids.append(m.group(1))
    return ids


def test_actor_error_names_actor_endpoint_and_coordinates(grid) -> None:
    mesh = grid.spawn(fresh("trainer_err"), TrainerActor)
    exc = mesh.slice(hosts=1, gpus=0).bad_step.call_one("bad input 17").exception(timeout=T)
    assert type(exc) is ActorError
    text = str(exc)
    assert "bad_step" in text
    assert "{'hosts': 1/2, 'gpus': 0/2}" in text
    assert "bad input 17" in text


def test_user_failure_report_uses_user_names_and_2d_coordinates(grid, faults) -> None:
    name = fresh("trainers")
    mesh = grid.spawn(name, TrainerActor)
    mesh.slice(hosts=1, gpus=1).train_step.broadcast("loss is nan")
    f = faults.wait_mesh(name)[0]
    text = str(f)
    assert f.mesh_name == name
    assert f"'{name}'" in text
    assert "TrainerActor" in text
    assert "train_step" in text
    assert "{'hosts': 1/2, 'gpus': 1/2}" in text
    assert "loss is nan" in text
    assert f.category == "user"
    assert "user error" in text
    for pid in _internal_proc_ids(grid):
        assert pid not in text, f"report names internal proc id {pid!r}:\n{text}"
    # the fail-fast error names the same
    exc = mesh.pid.call().exception(timeout=T)
    assert type(exc) is SupervisionError
    assert "{'hosts': 1/2, 'gpus': 1/2}" in str(exc) and "TrainerActor" in str(exc)


def test_infrastructure_failure_report_uses_user_names(faults, configured_hosts) -> None:
    """A proc killed by a signal: category infrastructure, coordinates and
    names the user gave, not internal ids."""
    hm = configured_hosts("two", hosts=2)
    try:
        pm = hm.spawn_procs(per_host={"gpus": 2}, name="workers")
        name = fresh("infra")
        mesh = pm.spawn(name, TrainerActor)
        pids = mesh.pid.call().get(timeout=60).values()
        os.kill(pids[1], signal.SIGKILL)  # {'hosts': 0/2, 'gpus': 1/2}
        f = faults.wait_mesh(name)[0]
        text = str(f)
        assert f.category == "infrastructure"
        assert "infrastructure error" in text
        assert "{'hosts': 0/2, 'gpus': 1/2}" in text
        assert "TrainerActor" in text
        assert "SIGKILL" in text
        assert "workers{'hosts': 0/2, 'gpus': 1/2}" in text  # the proc, by the user's name
        for pid in _internal_proc_ids(pm):
            assert pid not in text, f"report names internal proc id {pid!r}:\n{text}"
    finally:
        hm.shutdown().get(timeout=60)


# ====================================================================== cascades


class LeafChild(Actor):
    @endpoint
    def fail(self, msg: str) -> None:
        raise Fatal(msg)


class MiddleParent(Actor):
    """Spawns a LeafChild mesh; does not handle its failure."""

    @endpoint
    async def go(self, child_name: str, msg: str) -> None:
        self.child = this_proc().spawn(child_name, LeafChild)
        self.child.fail.broadcast(msg)


class TopActor(Actor):
    """Spawns a MiddleParent mesh; does not handle its failure (returns False)."""

    @endpoint
    async def go(self, parent_name: str, child_name: str, msg: str) -> None:
        self.parent = this_proc().spawn(parent_name, MiddleParent)
        await self.parent.go.call_one(child_name, msg)

    def __supervise__(self, failure) -> bool:
        return False


def _first_failure_line(report: str) -> str:
    """The line that describes the first event of the cascade (the header
    line before it names the mesh that was delivered)."""
    lines = [ln for ln in report.splitlines() if ln.strip()]
    return next(ln for ln in lines if "first failure" in ln.lower())


def test_cascade_report_shows_the_first_failure_first(procs, faults) -> None:
    pname, cname = fresh("nest_parent"), fresh("nest_child")
    parent = procs.slice(gpus=0).spawn(pname, MiddleParent)
    parent.go.call_one(cname, "root cause 9000").get(timeout=T)
    f = faults.wait_mesh(pname)[0]
    report = f.report()
    assert "First failure" in report
    first = _first_failure_line(report)
    assert cname in first and "LeafChild" in first, report
    assert report.index("root cause 9000") < report.index(f"actor {pname}")
    assert report.index("LeafChild") < report.index("MiddleParent")
    assert "user" in first
    assert faults.for_mesh(cname) == []


def test_three_level_cascade_keeps_the_whole_chain(procs, faults) -> None:
    tname, pname, cname = fresh("top"), fresh("mid"), fresh("leaf")
    top = procs.slice(gpus=1).spawn(tname, TopActor)
    top.go.call_one(pname, cname, "deep root cause").get(timeout=T)
    f = faults.wait_mesh(tname)[0]
    report = f.report()
    first = _first_failure_line(report)
    assert cname in first and "deep root cause" in report
    # child first, then the middle, then the top
    i_child, i_mid, i_top = report.index("LeafChild"), report.index("MiddleParent"), report.index("TopActor")
    assert i_child < i_mid < i_top, report
