"""The checkpoint pattern of ``docs/slurm.md`` ("Preemption and time
limits"), run as written: its ``job.sh`` (``--time=1 --signal=USR2@20``) and
``train.py`` with the page's ``monarch.toml``, in a real batch job.  The
notice arrives 10-40 s after the start; the job checkpoints and ends itself
before Slurm's limit."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import slurm_helpers as H

DOC = Path(__file__).resolve().parents[3] / "docs" / "slurm.md"


def _blocks(section: str, lang: str) -> list[str]:
    text = DOC.read_text()
    start = text.index(section)
    end = text.find("\n## ", start + len(section))
    return re.findall(rf"```{lang}\n(.*?)```", text[start:end if end > 0 else None], re.S)


def test_the_documented_checkpoint_pattern_saves_on_the_notice_and_ends_before_the_limit(
        cluster: Any, tmp_path: Path) -> None:
    (tmp_path / "monarch.toml").write_text(_blocks("## Inside an allocation", "toml")[0])
    (job,) = _blocks("### The pattern: checkpoint on the notice", "sh")
    (train,) = _blocks("### The pattern: checkpoint on the notice", "python")
    (tmp_path / "job.sh").write_text(job)
    (tmp_path / "train.py").write_text(train)
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")  # `python` is this one
    res = H.run(["sbatch", "--wait", "--parsable", f"--job-name={H.JOB_NAME}", "job.sh"], H.CLIENT_TIMEOUT,
                cwd=tmp_path, env=H.env({"PATH": path}))
    job_id = res.stdout.strip().split(";")[0]
    out = (tmp_path / f"slurm-{job_id}.out").read_text() if job_id else res.stderr
    assert res.returncode == 0, f"rc {res.returncode}: {res.stderr}\n{out[-6000:]}"
    assert H.job_state(job_id) == "COMPLETED", out[-4000:]
    assert re.search(rf"^notice for host mesh 'trainers': Slurm job {job_id} will be preempted or end soon: its "
                     r"nodes got SIGUSR2", out, re.M), out[-4000:]
    m = re.search(r"^saved at steps \[(\d+)\]$", out, re.M)
    assert m and int(m.group(1)) > 0, out[-4000:]
    ckpts = sorted(p.name for p in tmp_path.glob("ckpt-*.txt"))
    assert len(ckpts) == 12, ckpts
    assert {p.read_text() for p in tmp_path.glob("ckpt-*.txt")} == {m.group(1)}
    assert {n.split("-")[1] for n in ckpts} == set(H.NODES)
