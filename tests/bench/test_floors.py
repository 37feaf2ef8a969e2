"""``bench/floors.py`` (the bare-Python floors) keeps working, and
``bench/run.py`` judges each target against its floor the right way round.
Structure and logic only: never wall-clock bounds."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"monarch_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


floors = _load("floors")
run = _load("run")  # (it puts bench/ on sys.path for its own imports)

KEYS = {"pingpong_p50_us", "pingpong_p99_us", "pipelined_calls_s", "fanout16_p50_ms", "cold4_s",
        "cold4_trio_s", "spawn1000_actors_s", "memcpy_64mib_mib_s"}  # (trio: a dependency of monarch-core, so installed here)


@pytest.mark.timeout(240)
def test_a_quick_run_measures_every_floor(tmp_path: Path) -> None:
    out = tmp_path / "floors.json"
    res = subprocess.run([sys.executable, str(BENCH / "floors.py"), "--quick", "--json", str(out)],
                         capture_output=True, text=True, timeout=220, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert KEYS <= set(figures)
    placements = {k for k in figures if k.startswith("pingpong_") and k not in KEYS}
    assert {"pingpong_free_p50_us", "pingpong_same_cpu_p50_us"} <= placements, placements
    assert figures["pingpong_p50_us"] == min(figures[k] for k in placements if k.endswith("_p50_us"))
    assert all(isinstance(v, float) and v > 0 for v in figures.values()), figures
    assert figures["pingpong_p99_us"] >= figures["pingpong_p50_us"]
    for key in figures:  # the printed table names every figure
        assert key in res.stdout


class _Impl:
    def __init__(self, figures: dict[str, float]) -> None:
        self.figures = figures


def _table(monkeypatch: pytest.MonkeyPatch, core: dict[str, float], monarch: dict[str, float],
           floor: dict[str, float]) -> dict[str, Any]:
    monkeypatch.setattr(run, "medians", lambda impl: {} if impl is None else impl.figures)
    text, data = run.target_floor_table({"monarch_core": _Impl(core), "monarch": _Impl(monarch), "ray": None},
                                        {k: [v] for k, v in floor.items()})
    assert "bare-Python floor" in text
    return data


@pytest.mark.unit
def test_a_time_target_below_its_floor_and_a_rate_target_above_its_floor_are_out_of_reach(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = _table(
        monkeypatch,
        core={"call_one p50, µs": 140.0, "pipelined call_one, calls/s": 70_000.0},
        monarch={"call_one p50, µs": 500.0, "pipelined call_one, calls/s": 20_000.0},
        # p50 target 0.12 x 500 = 60 µs < a 80 µs floor; rate target 20 x 20k = 400k > a 300k floor
        floor={"pingpong_p50_us": 80.0, "pipelined_calls_s": 300_000.0},
    )
    p50, rate = data["call_one p50, µs"], data["pipelined call_one, calls/s"]
    assert p50["target_value"] == pytest.approx(60.0) and p50["target_beyond_floor"] is True
    assert rate["target_value"] == pytest.approx(400_000.0) and rate["target_beyond_floor"] is True
    assert p50["core_cost_over_floor"] == pytest.approx(140 / 80)
    assert p50["allowed_cost_over_floor"] == pytest.approx(60 / 80)
    assert rate["core_cost_over_floor"] == pytest.approx(300_000 / 70_000)


@pytest.mark.unit
def test_targets_the_floor_allows_are_within_reach_and_missing_figures_decide_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = _table(
        monkeypatch,
        core={"call_one p50, µs": 140.0, "cold spawn 4 procs + first reply, s": 0.18},
        monarch={"call_one p50, µs": 900.0, "64 MiB bytes send, MiB/s": 600.0},
        # p50 target 108 µs > a 30 µs floor; 64 MiB target 6,000 < a 6,500 MiB/s memcpy; no Monarch cold figure
        floor={"pingpong_p50_us": 30.0, "memcpy_64mib_mib_s": 6_500.0, "cold4_s": 0.03},
    )
    assert data["call_one p50, µs"]["target_beyond_floor"] is False
    assert data["call_one p50, µs"]["allowed_cost_over_floor"] == pytest.approx(108 / 30)
    assert data["64 MiB bytes send, MiB/s"]["target_beyond_floor"] is False
    assert data["cold spawn 4 procs + first reply, s"]["target_beyond_floor"] is None
    assert data["call() on 16 actors p50, ms"]["target_beyond_floor"] is None


@pytest.mark.unit
def test_a_row_with_two_floors_gets_a_verdict_for_each(monkeypatch: pytest.MonkeyPatch) -> None:
    label = "cold spawn 4 procs + first reply, s"
    data = _table(
        monkeypatch,
        core={label: 0.18},
        monarch={label: 0.30},
        # target 0.3 x 0.30 = 0.09 s: above exec'ing 4 interpreters, below one that imports trio and forks 4
        floor={"cold4_s": 0.03, "cold4_trio_s": 0.096},
    )
    bare, trio = data[label], data[f"{label} [cold4_trio_s]"]
    assert bare["target_value"] == trio["target_value"] == pytest.approx(0.09)
    assert bare["target_beyond_floor"] is False and bare["allowed_cost_over_floor"] == pytest.approx(3.0)
    assert trio["target_beyond_floor"] is True and trio["core_cost_over_floor"] == pytest.approx(0.18 / 0.096)


@pytest.mark.unit
def test_every_floor_row_names_a_row_with_a_monarch_target_and_a_floor_the_script_measures() -> None:
    labels = {row.label: row for row in run.ROWS}
    for label, key, _title in run.TARGET_FLOORS:
        assert labels[label].target is not None, label
        assert key in KEYS, key
    for label, key, _title, _bound in run.FLOORS:
        assert label in labels and key in KEYS
    assert callable(floors.measure)


@pytest.mark.unit
def test_a_floor_whose_peer_is_gone_raises_instead_of_waiting() -> None:
    import select
    import socket

    mine, theirs = socket.socketpair()
    ep = select.epoll()
    ep.register(mine.fileno(), select.EPOLLIN)
    theirs.close()  # the child "died"
    try:
        with pytest.raises(ConnectionError, match="closed its socket"):
            floors._read_replies(mine, ep, b"", 1)
    finally:
        mine.close()
        ep.close()
