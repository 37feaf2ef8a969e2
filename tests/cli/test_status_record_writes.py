"""The client's status record (``monarch_core._status.Record``) is written
coalesced: a burst of changes (a program spawning thousands of meshes)
rewrites the file a few times, not once per change, and the last change is
on disk soon after the burst.  Stopped meshes are trimmed when it is written."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from monarch_core import _status

pytestmark = pytest.mark.unit


def test_a_burst_of_changes_is_written_a_few_times_and_ends_up_on_disk(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    rec = _status.Record(tmp_path / "1.json", "client")
    writes = []
    real = rec._write_now
    monkeypatch.setattr(rec, "_write_now", lambda: (writes.append(time.monotonic()), real())[1])
    with rec._lock:
        rec._write()  # the first write: at once
    assert len(writes) == 1
    t0 = time.monotonic()
    for i in range(2000):
        rec.actor_mesh(f"k{i}", "running", name=f"m{i}", class_name="A", proc_mesh="procs", extent={"p": 1})
    took = time.monotonic() - t0
    # one write per gap the burst lasted, at most (2,001 when each change was written)
    assert len(writes) <= 2 + took / _status.WRITE_GAP, (len(writes), took)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        on_disk = json.loads((tmp_path / "1.json").read_text())
        if len(on_disk["actor_meshes"]) == 2000:
            break
        time.sleep(0.05)
    assert len(on_disk["actor_meshes"]) == 2000  # the burst's last change was written after it
    assert all(b - a >= _status.WRITE_GAP * 0.99 for a, b in zip(writes, writes[1:])), writes
    rec.remove()


def test_stopped_meshes_beyond_the_kept_ones_are_trimmed_when_written(tmp_path: Path) -> None:
    rec = _status.Record(tmp_path / "2.json", "client")
    for i in range(_status.KEEP_STOPPED + 5):
        rec.actor_mesh(f"k{i}", "stopped", name=f"m{i}", class_name="A", proc_mesh="procs", extent={"p": 1})
    rec.actor_mesh("live", "running", name="live", class_name="A", proc_mesh="procs", extent={"p": 1})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        on_disk = json.loads((tmp_path / "2.json").read_text())
        if "live" in on_disk["actor_meshes"]:
            break
        time.sleep(0.05)
    kept = on_disk["actor_meshes"]
    assert "live" in kept and len(kept) == _status.KEEP_STOPPED + 1, sorted(kept)
    assert f"k{_status.KEEP_STOPPED + 4}" in kept and "k0" not in kept  # the newest stopped ones stay
    rec.remove()
