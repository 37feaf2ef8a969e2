"""The suite's time budgets are checked against measured runs
(``tests/_helpers/budgets.py``, ``scripts/test_budgets.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from _helpers.clients import child_env, describe

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_records_each_test_and_the_check_names_the_tight_one(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(textwrap.dedent("""
        import time
        import pytest

        @pytest.mark.timeout(1)
        def test_tight():
            time.sleep(0.6)

        @pytest.mark.timeout(100)
        def test_roomy():
            pass

        def test_default_budget():
            pass

        @pytest.mark.skip(reason="not here")
        def test_skipped():
            pass

        def test_failing():
            assert False
    """))
    record = tmp_path / "durations.jsonl"
    env = child_env({"MONARCH_TEST_DURATIONS": str(record)}, path=[ROOT / "tests"])
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "_helpers.budgets",
                          "-o", "timeout=30", "-q", str(tmp_path / "test_sample.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, describe(run)  # test_failing
    lines = {json.loads(x)["test"].split("::")[1]: json.loads(x) for x in record.read_text().splitlines()}
    assert set(lines) == {"test_tight", "test_roomy", "test_default_budget", "test_skipped", "test_failing"}
    assert lines["test_tight"]["budget"] == 1 and lines["test_tight"]["seconds"] >= 0.6
    assert lines["test_roomy"]["budget"] == 100 and lines["test_default_budget"]["budget"] == 30
    assert [lines[k]["outcome"] for k in ("test_roomy", "test_skipped", "test_failing")] == ["passed", "skipped", "failed"]

    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_budgets.py"), str(record), "--check"],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1, describe(check)
    flagged = check.stdout.split("slowest")[0]
    assert "test_tight" in flagged and "test_roomy" not in flagged, describe(check)
    loose = subprocess.run([sys.executable, str(ROOT / "scripts" / "test_budgets.py"), str(record), "--check",
                            "--share", "0.95"], capture_output=True, text=True, timeout=60)
    assert loose.returncode == 0, describe(loose)
