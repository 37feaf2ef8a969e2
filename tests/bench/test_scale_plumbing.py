"""``bench/scale.py``'s plumbing: ``--reference-python`` runs the procs and
actors scripts under a second interpreter and tables both side by side with
their ratio; a size that fails there is a ``failed: <first line>`` cell, not
an aborted run; the hosts axis's idle floor is measured.  Structure and logic
only: no figure is judged, never a wall-clock bound."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"monarch_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


scale = _load("scale")


@pytest.mark.timeout(300)
def test_reference_python_puts_both_figures_and_their_ratio_in_each_row() -> None:
    # The "reference" here is this interpreter, whose ``monarch`` is our compat package: the same
    # script on ``monarch.actor`` as torchmonarch would run it, end to end, in a few seconds.
    res = subprocess.run([sys.executable, str(BENCH / "scale.py"), "--procs", "2", "--actors", "8", "--hosts", "",
                          "--ssh-hosts", "", "--reference-python", sys.executable, "--timeout", "240"],
                         capture_output=True, text=True, timeout=280, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "(torchmonarch)" in res.stderr  # each size ran on the reference side too
    lines = res.stdout.splitlines()
    procs_header = next(ln for ln in lines if ln.startswith("| procs N |"))
    for col in ("stop, s: ours", "stop, s: torchmonarch", "stop, s: ours ÷ torchmonarch",
                "left after stop: ours / torchmonarch"):
        assert col in procs_header, procs_header
    row = next(ln for ln in lines if ln.startswith("| 2 |")).split(" | ")
    assert "failed" not in " ".join(row), row
    assert row[-1].strip(" |") == "0 / 0", row  # nothing left on either side
    ratios = [c for c in row if re.fullmatch(r"\d+\.\d\d \((same|(ours|torchmonarch) [\d.]+× better)\)", c)]
    assert len(ratios) == 3, row  # each figure's ratio says which is better
    actors_header = next(ln for ln in lines if ln.startswith("| actors M (8 procs) |"))
    assert "spawn rate, actors/s: ours ÷ torchmonarch" in actors_header
    assert any(ln.startswith("| 8 |") for ln in lines)
    floor_at = next(i for i, ln in enumerate(lines) if "spawn rate floor (a thread per actor)" in ln)
    floor_row = lines[floor_at + 2].split(" | ")  # (measured in this run: a number, and each side's share)
    assert floor_row[0] == "| 8" and len(floor_row) == 6 and "failed" not in " ".join(floor_row), floor_row
    assert floor_row[3].endswith("%") and floor_row[5].strip(" |").endswith("%"), floor_row


def test_a_missing_reference_interpreter_is_refused_before_anything_runs() -> None:
    res = subprocess.run([sys.executable, str(BENCH / "scale.py"), "--procs", "2", "--actors", "", "--hosts", "",
                          "--ssh-hosts", "", "--reference-python", "/nonexistent/python"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 2
    assert "--reference-python /nonexistent/python" in res.stderr
    assert "[scale] procs" not in res.stderr


@pytest.mark.timeout(120)
def test_a_failing_or_dying_client_becomes_an_error_row_not_an_abort() -> None:
    raises = textwrap.dedent("""
        import json, os
        try:
            raise RuntimeError("client is not reachable\\nsecond line")
        except BaseException as e:
            print("ERROR " + json.dumps(f"{type(e).__name__}: {e}".splitlines()[0]), flush=True)
            os._exit(1)
    """)
    assert scale.run(raises, 1, 60) == {"error": "RuntimeError: client is not reachable"}
    dies = "import os, signal, sys; print('the client dies', file=sys.stderr, flush=True); os.kill(os.getpid(), 9)"
    assert scale.run(dies, 1, 60) == {"error": "client died (killed by SIGKILL): the client dies"}
    assert scale.run("import time; time.sleep(60)", 1, 1.0) == {"error": "timed out after 1s"}
    # a child the client started in a session of its own (as torchmonarch's procs are) is killed too
    orphan = textwrap.dedent("""
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        import time; time.sleep(3)
        print('RESULT {"child": %d}' % p.pid, flush=True)
    """)
    child = scale.run(orphan, 1, 60)["child"]
    deadline = time.monotonic() + 30
    while scale._running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not scale._running(child)


def test_the_table_shows_a_failed_reference_size_and_the_ratios() -> None:
    ours = [{"m": 1000, "rate": 4000.0, "up_s": 0.25, "call_s": 0.1, "stop_s": 0.2, "rss_per_actor_kib": 2.0,
             "left": 0},
            {"m": 10000, "rate": 3000.0, "up_s": 3.3, "call_s": 0.5, "stop_s": 1.0, "rss_per_actor_kib": 2.5,
             "left": 0}]
    ref = [{"m": 1000, "rate": 800.0, "up_s": 1.25, "call_s": 0.2, "stop_s": 2.0, "rss_per_actor_kib": 40.0,
            "left": 0},
           {"m": 10000, "error": "client died (killed by SIGABRT): thread 'tokio' panicked\nmore"}]
    lines = scale.actors_table(ours, ref).splitlines()
    row = lines[2].split(" | ")
    assert row[1:4] == ["4,000", "800", "5.00 (ours 5.0× better)"]  # a rate: higher is better
    assert row[7:10] == ["0.20", "2.00", "0.10 (ours 10.0× better)"]  # a time: lower is better
    failed_row = lines[3].split(" | ")
    assert failed_row[2] == "failed: client died (killed by SIGABRT): thread 'tokio' panicked"
    assert failed_row[3] == scale.T.DASH and failed_row[1] == "3,000"
    assert lines[-1].startswith("| growth exponent | -0.12 | — |")  # theirs: one good size only
    assert scale.ratio_cell(2.0, 1.0, higher_is_better=False) == "2.00 (torchmonarch 2.0× better)"
    shares = scale.actors_floor_table(ours, ref, {1000: 20000.0, 10000: 15000.0}).splitlines()
    assert shares[2].split(" | ")[1:] == ["20,000", "4,000", "20 %", "800", "4 % |"]
    assert shares[3].split(" | ")[3:5] == ["20 %", "failed: client died (killed by SIGABRT): thread 'tokio' panicked"]


@pytest.mark.timeout(180)
def test_the_hosts_axis_idle_floor_is_the_client_with_no_host() -> None:
    floor = scale.run_hosts(0, rounds=1, tree_min=8, timeout=150, idle=1.0)
    assert "error" not in floor, floor
    assert floor["n"] == 0 and floor["idle_s"] >= 1.0
    assert floor["idle_cpu"] >= 0 and floor["idle_stat_cpu"] >= 0
    assert isinstance(floor["idle_threads"], dict)
    table = scale.idle_table([{"n": 4, "error": "worker loop 1 did not start"}], floor).splitlines()
    assert table[2].startswith("| 0 (floor: no host attached) | ")
    assert table[3].startswith("| 4 | failed: worker loop 1 did not start |")
