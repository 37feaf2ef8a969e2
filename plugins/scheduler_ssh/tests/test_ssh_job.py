"""``monarch_core.job.SSHJob`` over the ``ssh`` scheduler, on the testbed's
namespace hosts: named meshes of SSH hosts, a second program reattaching to
the saved job (the same hosts, its own worker loops), and ``kill()``
leaving nothing on the hosts."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import ssh_helpers as H
from _helpers.clients import run_script

PROGRAM = '''
import json, socket, sys
from monarch_core.actor import Actor, endpoint
from monarch_core.job import SSHJob


class Where(Actor):
    @endpoint
    def where(self):
        return socket.gethostname()


job = SSHJob(params=json.loads(sys.argv[1]))
job.add_mesh("trainers", ["h1", "h2"])
job.add_mesh("loaders", ["h3"])
state = job.state()
trainers = state.trainers.spawn_procs().spawn("where", Where).where.call().get(timeout=120).values()
loaders = state.loaders.spawn_procs().spawn("where", Where).where.call().get(timeout=120).values()
print("RESULT " + json.dumps({"apply": job.apply_id, "trainers": trainers, "loaders": loaders}), flush=True)
if sys.argv[2] == "kill":
    job.kill()
'''


def _result(out: Any) -> dict:
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"no RESULT line; rc {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")


def test_ssh_job_meshes_reattach_from_the_saved_state_and_kill(sshd: Any, tmp_path: Path) -> None:
    tag = H.new_tag()
    params = json.dumps(H.entry(tag, tmp_path))
    (tmp_path / "prog.py").write_text(textwrap.dedent(PROGRAM))
    first = run_script(tmp_path / "prog.py", params, "keep", timeout=240)
    assert first.returncode == 0, first.stderr[-6000:]
    one = _result(first)
    assert one["trainers"] == ["h1", "h2"] and one["loaders"] == ["h3"]
    H.wait_tagged_gone(tag, (1, 2, 3))  # this client's worker loops ended with it
    second = run_script(tmp_path / "prog.py", params, "kill", timeout=240)
    assert second.returncode == 0, second.stderr[-6000:]
    two = _result(second)
    assert two["apply"] == one["apply"], "the second program reattached to the saved job"
    assert two["trainers"] == ["h1", "h2"] and two["loaders"] == ["h3"]
    H.wait_tagged_gone(tag, (1, 2, 3))
