"""A failure of a nested mesh (an actor error, a proc killed by SIGKILL) reaches its owner's
``__supervise__`` with a report that also says it in the reference's (torchmonarch 0.7.0) words,
which programs written for it match: ``The actor <module.Class> <actor> and all its descendants
have failed: <why>``."""

from __future__ import annotations

import os
import re
import time

from monarch_core.actor import Actor, endpoint, this_host


class Leaf(Actor):
    @endpoint
    def fail(self) -> None:
        raise ValueError("Error.")

    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Owner(Actor):
    def __init__(self) -> None:
        self.leaf = this_host().spawn_procs(per_host={"a_dim": 1}).spawn("leaf", Leaf)
        self.reports: list[str] = []

    @endpoint
    def fail_leaf(self) -> None:
        self.leaf.fail.broadcast()

    @endpoint
    def kill_leaf(self) -> None:
        os.kill(self.leaf.pid.call_one().get(timeout=120), 9)

    @endpoint
    def seen(self) -> list[str]:
        return list(self.reports)

    def __supervise__(self, failure) -> bool:  # type: ignore[no-untyped-def]
        self.reports.append(failure.report())
        return True


def _first_report(owner) -> str:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        seen = owner.seen.call_one().get(timeout=120)
        if seen:
            return seen[0]
        time.sleep(0.2)
    raise AssertionError("the owner's __supervise__ never saw its nested mesh fail")


def _run(action: str, name: str) -> str:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner = procs.spawn(name, Owner)
        getattr(owner, action).call_one().get(timeout=120)
        return _first_report(owner)
    finally:
        procs.stop().get(timeout=120)


def test_an_actor_error_in_a_nested_mesh_is_reported_in_the_references_words() -> None:
    report = _run("fail_leaf", "owner_error")
    expected = (rf"The actor {re.escape(Leaf.__module__)}\.Leaf leaf\{{'a_dim': 0/1\}} and all its descendants "
                r"have failed: ValueError: Error\.")
    assert re.search(expected, report), report
    assert report.startswith("actor mesh 'leaf' failed")  # monarch-core's own report comes first, unchanged


def test_a_nested_proc_killed_by_sigkill_is_reported_in_the_references_words() -> None:
    report = _run("kill_leaf", "owner_kill")
    assert re.search(r"leaf\{'a_dim': 0/1\}", report), report
    assert "the process this actor was running on failed: Killed(sig=9)" in report, report



class StrOwner(Owner):
    def __supervise__(self, failure) -> bool:  # type: ignore[no-untyped-def]
        self.reports.append(str(failure))
        return True


def test_str_of_a_failure_names_its_type_then_gives_the_report() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        owner = procs.spawn("owner_str", StrOwner)
        owner.fail_leaf.call_one().get(timeout=120)
        text = _first_report(owner)
    finally:
        procs.stop().get(timeout=120)
    assert text.startswith("MeshFailure(mesh_name='leaf'"), text  # as the reference's str() starts
    assert "actor mesh 'leaf' failed" in text and "ValueError: Error." in text
