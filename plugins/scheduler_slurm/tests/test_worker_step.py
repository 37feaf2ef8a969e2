"""The worker step's ``srun`` process, without Slurm: a stand-in command in
its place.  It dies with the client (its parent-death signal, set by
``setpriv --pdeathsig`` or a ``preexec_fn``), and a missing ``srun`` is an
error at start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from _helpers.procs import pid_running
from monarch_core.errors import AllocationError
from monarch_scheduler_slurm import _step

CLIENT = r'''
import os, sys, time
from monarch_scheduler_slurm._step import WorkerStep
stand_in = [sys.executable, "-c", "import os, time; print('0: pid', os.getpid(), flush=True); time.sleep(120)"]
step = WorkerStep(None, "9", ["n1"], stand_in, dict(os.environ), on_lost=lambda n, r: None,
                  on_notice=lambda m: None, warning=None)
step.start()
print("srun", step.proc.pid, flush=True)
time.sleep(120)
'''


@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "preexec_fn"])
def test_the_step_process_dies_with_a_client_killed_outright(setpriv: bool) -> None:
    if setpriv and not _step._setpriv_prefix():
        pytest.skip("this host's setpriv has no --pdeathsig")
    code = CLIENT if setpriv else "import monarch_scheduler_slurm._step as s; s._SETPRIV[:] = [[]]\n" + CLIENT
    client = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        line = ""
        while not line.startswith("srun "):  # (the stand-in's own line comes through too, as "[n1] pid N")
            line = client.stdout.readline()
            assert line, "the client ended early"
        pid = int(line.split()[1])
        assert pid_running(pid)
        client.send_signal(signal.SIGKILL)  # runs nothing of the client
        client.wait(30)
        deadline = time.monotonic() + 10
        while pid_running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # /proc has nothing to wait on
        assert not pid_running(pid), "the step's process outlived its client"
    finally:
        client.kill()
        client.wait()


def test_a_missing_srun_is_an_allocation_error_at_start() -> None:
    step = _step.WorkerStep(None, "9", ["n1"], ["no-such-srun-for-monarch", "--jobid=9"], dict(os.environ),  # type: ignore[arg-type]
                            on_lost=lambda n, r: None, on_notice=lambda m: None, warning=None)
    with pytest.raises(AllocationError, match=r"cannot start the worker step of Slurm job 9: "
                                              r"`no-such-srun-for-monarch --jobid=9 \.\.\.`: .*No such file"):
        step.start()
