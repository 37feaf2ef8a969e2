"""A user's logging and prints in an actor, as a new user expects them: their
own ``logging.basicConfig`` works (INFO lines reach the client), monarch's
own loggers stay quiet, each line carries one prefix, a proc's stdout and
stderr lines keep the order it wrote them in, and what an endpoint printed
is printed before the caller's next line; ``MONARCH_LOG_TIMESTAMPS`` adds the
time each line was written.  Local procs stream by default."""

from __future__ import annotations

import re
import subprocess

from _helpers.clients import PY, child_env, describe, write_script

PROGRAM = r"""
import logging, sys
from monarch_core.actor import Actor, endpoint, this_host

class Trainer(Actor):
    @endpoint
    def train(self, step: int) -> int:
        logging.basicConfig(level=logging.INFO)          # the user's own configuration
        logging.getLogger("user").info("info at step %d", step)
        print("print at step", step)
        logging.getLogger("user").warning("warning at step %d", step)
        print("print after step", step)
        logging.getLogger("monarch.proc").info("monarch's own detail")   # quiet by default
        return step

pm = this_host().spawn_procs(per_host={"gpus": 2})
t = pm.spawn("trainers", Trainer)
for step in (50, 60):
    t.train.call(step).get(timeout=120)
    print("client after step", step)
print("client done")
"""


def run(tmp_path, env=None) -> tuple[subprocess.CompletedProcess, list[str]]:  # noqa: ANN001
    script = write_script(tmp_path, PROGRAM, "client.py")
    res = subprocess.run([PY, str(script)], cwd=str(tmp_path), env=child_env(env), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=240)
    return res, res.stdout.splitlines()


def test_a_users_info_line_reaches_the_client_with_one_prefix_in_the_order_written(tmp_path) -> None:
    res, lines = run(tmp_path)
    assert res.returncode == 0, describe(res)
    for rank in (0, 1):
        mine = [ln for ln in lines if ln.startswith(f"[trainers{{'gpus': {rank}/2}} localhost] ")]
        body = [ln.split("] ", 1)[1] for ln in mine]
        # the user's basicConfig worked (INFO shown), one prefix, stdout and stderr in the order written
        assert body == ["INFO:user:info at step 50", "print at step 50", "WARNING:user:warning at step 50",
                        "print after step 50", "INFO:user:info at step 60", "print at step 60",
                        "WARNING:user:warning at step 60", "print after step 60"], describe(res)
    assert not any("monarch's own detail" in ln for ln in lines), describe(res)
    assert not any(re.search(r"\] \[(WARNING|INFO) proc ", ln) for ln in lines), describe(res)
    # what the endpoints printed comes before the caller's next line
    for step in (50, 60):
        after = lines.index(f"client after step {step}")
        for rank in (0, 1):
            last = lines.index(f"[trainers{{'gpus': {rank}/2}} localhost] print after step {step}")
            assert last < after, describe(res)
    assert lines[-1] == "client done", describe(res)


def test_timestamps_when_asked(tmp_path) -> None:
    res, lines = run(tmp_path, {"MONARCH_LOG_TIMESTAMPS": "1"})
    assert res.returncode == 0, describe(res)
    stamped = [ln for ln in lines if re.match(r"^\[trainers\{'gpus': [01]/2\} localhost \d\d:\d\d:\d\d\.\d{3}\] ", ln)]
    assert len(stamped) == 16, describe(res)


def test_streaming_off_leaves_local_procs_writing_to_the_terminal(tmp_path) -> None:
    res, lines = run(tmp_path, {"MONARCH_STREAM_LOGS": "0"})
    assert res.returncode == 0, describe(res)
    assert lines.count("print at step 50") == 2, describe(res)  # unprefixed: written by the procs themselves
    assert lines.count("INFO:user:info at step 60") == 2, describe(res)


BUSY = r"""
import sys
from monarch_core.actor import Actor, current_rank, endpoint, this_host

class Printer(Actor):
    @endpoint
    def lines(self, n: int) -> int:
        r = current_rank().rank
        for i in range(n):
            print("rank", r, "line", i, "of", n)   # five pieces, one line
        return n

pm = this_host().spawn_procs(per_host={"gpus": 2})
p = pm.spawn("printers", Printer)
p.lines.call(300).get(timeout=120)
print("client after the lines")
"""


def test_local_procs_that_do_not_stream_write_each_line_whole_and_at_once(tmp_path) -> None:
    """Two procs printing at the same time to one terminal: every line comes
    out whole, with or without ``PYTHONUNBUFFERED`` (which makes Python write
    each piece of a ``print`` on its own), and before the client's next line
    (to a pipe, Python would hold a proc's prints until it ended)."""
    script = write_script(tmp_path, BUSY, "busy.py")
    expected = {f"rank {r} line {i} of 300" for r in (0, 1) for i in range(300)}
    for unbuffered in ("1", None):
        res = subprocess.run([PY, str(script)], cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=child_env({"MONARCH_STREAM_LOGS": "0", "PYTHONUNBUFFERED": unbuffered}),
                             text=True, timeout=240)
        assert res.returncode == 0, describe(res)
        lines = res.stdout.splitlines()
        after = lines.index("client after the lines")
        assert sorted(lines[:after]) == sorted(expected), (unbuffered, describe(res))
