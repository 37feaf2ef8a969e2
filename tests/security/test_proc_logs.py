"""Remote procs that do not stream write to a private per-user folder.

``MONARCH_PROC_LOG_DIR`` (default ``<tmp>/monarch-<uid>-logs``) must be a
folder of the job's user, mode 0700 (created so); the files are 0600 and
opened without following a link.  A folder another user made first, a 0755
one, or a planted link: the job refuses (``logging_option`` fails with a
message naming the path, what was found and the fix) and writes nothing.
Real worker loops over ``ipc``, a real second user where it matters.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from _helpers.procs import kill_tree
from _helpers.transport import WorkerSet

from security_helpers import PY, OtherUser, run_as, security_env

#: A client attached to one worker loop; commands on stdin: ``quiet`` (no
#: streaming: the log file), ``stream``, ``say TEXT``; one JSON line each.
CLIENT = """
import json, sys
from monarch_core.worker import attach_to_workers
from attack_actors import Talker
hosts = attach_to_workers([sys.argv[1]], timeout=30)
pm = hosts.spawn_procs(per_host={"gpus": 1})
t = pm.spawn("talker", Talker)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    try:
        if cmd == "quiet":
            pm.logging_option(stream_to_client=False)
        elif cmd == "stream":
            pm.logging_option(stream_to_client=True)
        elif cmd == "say":
            t.say.call(arg).get(timeout=30)
        print(json.dumps({"ok": True}), flush=True)
    except Exception as e:
        print(json.dumps({"ok": False, "error": str(e)}), flush=True)
"""


class Job:
    """A worker loop (as root, with ``env``) and a client attached to it."""

    def __init__(self, env: dict[str, str | None]) -> None:
        self.address = f"ipc://@monarch-worker-{uuid.uuid4().hex[:12]}"
        self.ws = WorkerSet()
        self.worker = self.ws.start(self.address, env={**security_env(env), "MONARCH_FORK_SERVER": "0"})
        self.client = subprocess.Popen([PY, "-c", CLIENT, self.address], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env=security_env(), cwd="/")
        assert self._answer().get("ready"), self.describe()

    def _answer(self) -> dict:
        line = self.client.stdout.readline()  # the client answers every command (its calls have timeouts)
        assert line, self.describe()
        return json.loads(line)

    def do(self, cmd: str) -> dict:
        self.client.stdin.write(cmd + "\n")
        self.client.stdin.flush()
        return self._answer()

    def describe(self) -> str:
        return f"worker output:\n{self.worker.output()[-3000:]}"

    def close(self) -> None:
        kill_tree(self.client)
        self.ws.close()


@pytest.fixture
def job() -> Iterator:
    made: list[Job] = []

    def start(env: dict[str, str | None]) -> Job:
        j = Job(env)
        made.append(j)
        return j

    yield start
    for j in made:
        j.close()


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_the_default_log_folder_is_private_and_the_logs_are_0600(job, tmp_path: Path) -> None:
    j = job({"TMPDIR": str(tmp_path), "MONARCH_PROC_LOG_DIR": None})
    assert j.do("quiet") == {"ok": True}, j.describe()
    assert j.do("say the-secret-42") == {"ok": True}
    logs = tmp_path / f"monarch-{os.getuid()}-logs"
    files = list(logs.iterdir())
    assert len(files) == 1 and "the-secret-42" in files[0].read_text()
    assert _mode(logs) == 0o700 and _mode(files[0]) == 0o600
    assert os.stat(logs).st_uid == os.getuid()


def test_a_log_folder_another_user_made_first_is_refused(job, other_user: OtherUser, shared_tmp: Path) -> None:
    # the other user makes the folders (today's default name and the old one) before the job starts
    names = [f"monarch-{os.getuid()}-logs", f"monarch-logs-{os.getuid()}"]
    got = run_as(other_user, f"""
for n in {names!r}:
    os.mkdir(os.path.join({str(shared_tmp)!r}, n)); os.chmod(os.path.join({str(shared_tmp)!r}, n), 0o777)
report(made=True)
""")
    assert got.get("made"), got
    j = job({"TMPDIR": str(shared_tmp), "MONARCH_PROC_LOG_DIR": None})
    answer = j.do("quiet")
    assert answer["ok"] is False, answer
    planted = shared_tmp / names[0]
    assert f"{planted} belongs to uid {other_user.uid} ({other_user.name})" in answer["error"], answer
    assert "MONARCH_PROC_LOG_DIR" in answer["error"]
    assert j.do("say the-secret-42") == {"ok": True}  # the proc goes on, its output stays where it was
    for n in names:
        assert list((shared_tmp / n).iterdir()) == [], f"the job wrote into {n}, a folder of another user"


def test_a_log_folder_others_may_enter_is_refused_with_the_fix(job, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    os.chmod(logs, 0o755)
    j = job({"MONARCH_PROC_LOG_DIR": str(logs)})
    answer = j.do("quiet")
    assert answer["ok"] is False, answer
    assert f"{logs} has mode 0755" in answer["error"] and f"chmod 700 {logs}" in answer["error"], answer
    assert list(logs.iterdir()) == []


def test_a_planted_link_is_not_followed(job, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    victim = tmp_path / "root-only"
    victim.write_text("untouched\n")
    os.chmod(victim, 0o600)
    j = job({"MONARCH_PROC_LOG_DIR": str(logs)})
    assert j.do("quiet") == {"ok": True}, j.describe()
    (log,) = logs.iterdir()
    assert j.do("stream") == {"ok": True}
    log.unlink()
    log.symlink_to(victim)  # the link an attacker plants where the job will append
    answer = j.do("quiet")
    assert answer["ok"] is False and "is a symbolic link" in answer["error"], answer
    assert j.do("say the-secret-42") == {"ok": True}
    assert victim.read_text() == "untouched\n"
