"""The ``monarch`` command line, as a user types it (a real ``monarch`` process
each): ``--version``; ``settings NAME`` (the value and where it comes from)
and ``settings --all``; ``summary --top`` with a negative count and a JSON
file that is not a trace; ``torchrun --hosts NAME`` where NAME names no host
mesh."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Optional

import pytest

from _helpers.clients import PY, child_env

TIMEOUT = 60


def monarch(*args: str, env: Optional[dict[str, Optional[str]]] = None, cwd: Optional[Path] = None
            ) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "monarch_core.cli", *args], capture_output=True, text=True, timeout=TIMEOUT,
                          env=child_env(env, drop=("MONARCH_",)), cwd=cwd)


def test_version_prints_the_core_version() -> None:
    from monarch_core import __version__

    out = monarch("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"monarch-core {__version__}"


def test_settings_name_shows_the_value_and_where_it_comes_from() -> None:
    default = monarch("settings", "MONARCH_DELIVERY_TIMEOUT")
    assert default.returncode == 0, default.stderr
    first = default.stdout.splitlines()[0]
    assert first == "MONARCH_DELIVERY_TIMEOUT = 30  (the default: not set in the environment)", default.stdout
    assert "a number of seconds" in default.stdout and "declared by monarch-core" in default.stdout

    env = monarch("settings", "delivery_timeout", env={"MONARCH_DELIVERY_TIMEOUT": "7.5"})  # the short name too
    assert env.returncode == 0, env.stderr
    assert env.stdout.splitlines()[0] == "MONARCH_DELIVERY_TIMEOUT = 7.5  (from the environment; the default is 30)"

    bad = monarch("settings", "MONARCH_DELIVERY_TIMEOUT", env={"MONARCH_DELIVERY_TIMEOUT": "soon"})
    assert bad.returncode == 1 and "MALFORMED" in bad.stdout and "must be a number of seconds" in bad.stdout

    unknown = monarch("settings", "MONARCH_DELIVERY_TIMOUT")
    assert unknown.returncode == 2
    assert "not a setting" in unknown.stderr and "did you mean MONARCH_DELIVERY_TIMEOUT" in unknown.stderr


def test_settings_all_lists_every_setting_with_its_value() -> None:
    from monarch_core import settings

    out = monarch("settings", "--all", env={"MONARCH_LOG_LEVEL": "DEBUG"})
    assert out.returncode == 0, out.stderr
    assert "usage:" not in out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["variable", "value", "from", "declared", "by"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert {s.name for s in settings.SETTINGS.values()} <= set(rows)  # the core's, and the plugins' too
    assert rows["MONARCH_LOG_LEVEL"][1:3] == ["DEBUG", "environment"]
    assert rows["MONARCH_DELIVERY_TIMEOUT"][1:3] == ["30", "default"]


def test_summary_top_negative_is_a_clear_error() -> None:
    for args in (["--top", "-3"], ["--top=-3"]):
        out = monarch("summary", *args, "/nonexistent.json")
        assert out.returncode == 2, out
        assert "argument --top: -3 rows" in out.stderr and "0: all" in out.stderr, out.stderr
        assert "expected one argument" not in out.stderr


@pytest.mark.parametrize("content, says", [
    ('{"name": "not telemetry"}\n', "not a telemetry event"),
    ('[{"a": 1}, {"b": 2}]', "not a Chrome trace: event 0"),
    ('{"traceEvents": {"a": 1}}', "its traceEvents are not a list"),
    ('{\n  "pretty": "printed"\n}\n', "not a Chrome trace (a JSON array) nor a JSON-lines telemetry file"),
])
def test_summary_of_json_that_is_not_a_trace_is_an_error(tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "data.json"
    path.write_text(content)
    out = monarch("summary", str(path))
    assert out.returncode == 1, out.stdout
    assert says in out.stderr and "(no endpoint calls recorded)" not in out.stdout, out.stderr


def test_summary_of_a_trace_without_calls_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps([{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "client"}}]))
    out = monarch("summary", str(path))
    assert out.returncode == 0, out.stderr
    assert "(no endpoint calls recorded)" in out.stdout


def test_torchrun_hosts_that_name_nothing_is_an_error_listing_the_known_ones(tmp_path: Path) -> None:
    pytest.importorskip("monarch_spmd")
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    nothing = monarch("torchrun", "--hosts", "nosuch", str(script), cwd=tmp_path, env={"SLURM_JOB_ID": None})
    assert nothing.returncode == 2, nothing
    assert "ran" not in nothing.stdout
    assert "--hosts nosuch: no host mesh is known here" in nothing.stderr and "[hosts.nosuch]" in nothing.stderr

    (tmp_path / "monarch.toml").write_text('[hosts.lab]\nscheduler = "local"\nhosts = 2\n'
                                           '[hosts.bench]\nscheduler = "local"\nhosts = 1\n')
    other = monarch("torchrun", "--hosts", "nosuch", str(script), cwd=tmp_path)
    assert other.returncode == 2, other
    assert "defines no host mesh 'nosuch'; the known ones: bench, lab" in other.stderr
