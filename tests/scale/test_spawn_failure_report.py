"""A spawn whose procs fail in numbers is reported once: how many ranks
failed, which (compressed ranges), the first cause, and how those procs were
started (forked from the fork server pid X, or exec'd with the command).

Each test runs a client of its own (``run_code``): its procs, its fork server."""

from __future__ import annotations

import pytest

from _helpers.clients import describe, run_code

pytestmark = pytest.mark.scale

FORKED = """
import os
from monarch_core.actor import this_host, current_rank

def boot():
    if current_rank().rank % 3 == 0:
        os._exit(3)

pm = this_host().spawn_procs(per_host={"p": 24}, bootstrap=boot)
try:
    pm.initialized.get(timeout=240)
except Exception as e:
    print("ERROR", type(e).__name__, e, flush=True)
pm.stop().get(timeout=120)
"""


def test_many_forked_procs_failing_at_start_are_one_error_naming_count_ranks_and_fork_server() -> None:
    res = run_code(FORKED, env={"MONARCH_FORK_SERVER": None}, timeout=300)
    assert res.returncode == 0, describe(res)
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("ERROR ")]
    assert line.startswith("ERROR SupervisionError 8 of 24 procs of proc mesh"), line
    assert "(ranks 0, 3, 6, 9, 12, 15, 18, 21)" in line, line
    assert "they were forked from the fork server (pid " in line, line
    assert "exited with code 3" in line, line
    assert "exec'd" not in line and "-m" not in line, line
    # one ERROR line for the spawn on the client's stderr, no WARNING line per rank
    assert res.stderr.count("procs of proc mesh") == 1, describe(res)
    per_rank = [ln for ln in res.stderr.splitlines() if "exited with code 3" in ln and "procs of proc mesh" not in ln]
    assert per_rank == [], describe(res)


EXECD = """
import sys
from monarch_core.actor import BootstrapCommand, default_bootstrap_cmd, this_host

def command(point):
    if 4 <= point.rank <= 9 or point.rank == 12:
        return BootstrapCommand(program="/nonexistent/monarch-scale/python")
    return default_bootstrap_cmd(sys.executable)

pm = this_host().spawn_procs(per_host={"p": 16}, bootstrap_command=command)
try:
    pm.initialized.get(timeout=240)
except Exception as e:
    print("ERROR", type(e).__name__, e, flush=True)
pm.stop().get(timeout=120)
"""


def test_many_execd_procs_that_cannot_start_are_one_error_naming_count_ranks_and_command() -> None:
    res = run_code(EXECD, timeout=300)
    assert res.returncode == 0, describe(res)
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("ERROR ")]
    assert line.startswith("ERROR SupervisionError 7 of 16 procs of proc mesh"), line
    assert "(ranks 4-9, 12)" in line, line
    assert "they were exec'd with ['/nonexistent/monarch-scale/python'" in line, line
    assert "No such file or directory" in line, line
    assert "fork server" not in line, line
    assert res.stderr.count("procs of proc mesh") == 1, describe(res)
    assert "could not start" not in res.stderr.replace(line[len("ERROR SupervisionError "):], ""), describe(res)


AFTER_START = """
import os, time
import monarch_core.actor as api
from monarch_core.actor import Actor, endpoint, this_host

handled = []
api.unhandled_fault_hook = lambda failure: handled.append(failure)   # the client goes on

class Quitter(Actor):
    @endpoint
    def quit(self) -> None:
        os._exit(5)

pm = this_host().spawn_procs(per_host={"p": 2})
pm.initialized.get(timeout=120)                       # every proc has started
q = pm.spawn("q", Quitter)
q.slice(p=1).quit.broadcast()
deadline = time.time() + 60
while not handled and time.time() < deadline:
    time.sleep(0.05)
print("HANDLED", bool(handled), flush=True)
pm.stop().get(timeout=120)
"""


def test_a_proc_that_dies_after_it_started_still_gets_its_own_warning_line() -> None:
    res = run_code(AFTER_START, timeout=300)
    assert res.returncode == 0, describe(res)
    assert "HANDLED True" in res.stdout, describe(res)
    lines = [ln for ln in res.stderr.splitlines() if "exited with code 5" in ln]
    assert any(ln.startswith("proc ") for ln in lines), describe(res)  # the kernel's WARNING for that rank
