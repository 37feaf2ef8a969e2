"""A proc gets the spawner's ``ProcSpec`` itself: encoded once
(``ProcSpec.to_env``), decoded and checked once (``ProcSpec.from_env``), with
an error naming the field that does not fit."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from monarch_core._launch._bootstrap import BOOTSTRAP_ENV, PROC_MODULE, BootstrapCommand
from monarch_core._launch._spec import ProcSpec


def _spec(**over: object) -> ProcSpec:
    fields = dict(
        proc_id="p-0-abc", name="p", rank=1, labels=("hosts", "gpus"), sizes=(1, 2), describe="proc p{'gpus': 1/2}",
        command=BootstrapCommand(program=sys.executable, env={"A": "1", "B": None}, inherit_env=False),
        default_program=True, bind={"cpus": "0"}, status=("client-1", "ipc:///tmp/x", 7),
        parent=("client-1", "ipc:///tmp/x"), root=("client-1", "ipc:///tmp/x"), transport="ipc", log_level=10,
        host_name="h1", output="stream", sys_path=("/a", "/b"), bind_spec=None, parent_pid=42, cpus="0",
        worker_loop=("worker-loop-3", "tcp://127.0.0.1:1", 3),
    )
    fields.update(over)
    return ProcSpec(**fields)  # type: ignore[arg-type]


@pytest.mark.unit
def test_the_spec_the_proc_decodes_is_the_one_its_spawner_encoded() -> None:
    spec = _spec()
    assert ProcSpec.from_env(spec.to_env()) == spec
    assert ProcSpec.from_env(_spec(worker_loop=None, bind=None, log_level="INFO").to_env()).worker_loop is None


@pytest.mark.parametrize(("field", "value", "says"), [
    ("rank", "1", "ProcSpec.rank must be int, got '1'"),
    ("rank", True, "ProcSpec.rank must be int, got True"),
    ("status", ["c", "a"], "ProcSpec.status must be tuple[str, str, int]"),
    ("status", ["c", "a", "7"], "ProcSpec.status[2] must be int, got '7'"),
    ("labels", ["hosts", 3], "ProcSpec.labels[1] must be str, got 3"),
    ("output", "files", "ProcSpec.output must be Literal['direct', 'stream', 'file'], got 'files'"),
    ("worker_loop", ["w", "a"], "ProcSpec.worker_loop must be"),
    ("command", {"program": 3}, "ProcSpec.command.program must be str, got 3"),
    ("command", {"args": []}, "ProcSpec.command: "),
    ("nonsense", 1, "unexpected keyword argument 'nonsense'"),
])
@pytest.mark.unit
def test_a_field_that_does_not_fit_is_named(field: str, value: object, says: str) -> None:
    fields = json.loads(_spec().to_env())
    fields[field] = value
    with pytest.raises(ValueError, match=f"^{BOOTSTRAP_ENV}: ") as e:
        ProcSpec.from_env(json.dumps(fields))
    assert says in str(e.value)


@pytest.mark.unit
def test_a_spec_missing_a_field_or_not_json_is_refused() -> None:
    fields = json.loads(_spec().to_env())
    del fields["parent_pid"], fields["proc_id"]
    with pytest.raises(ValueError, match="proc_id"):
        ProcSpec.from_env(json.dumps(fields))
    with pytest.raises(ValueError, match="is not JSON"):
        ProcSpec.from_env("{")
    with pytest.raises(ValueError, match="ProcSpec must be an object"):
        ProcSpec.from_env("[]")


def test_a_proc_started_with_a_bad_spec_exits_naming_the_field() -> None:
    fields = dataclasses.asdict(_spec(parent_pid=os.getpid()))
    fields["sizes"] = [1, "2"]
    env = {**os.environ, BOOTSTRAP_ENV: json.dumps(fields)}
    out = subprocess.run([sys.executable, "-m", PROC_MODULE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "ProcSpec.sizes[1] must be int, got '2'" in out.stderr
