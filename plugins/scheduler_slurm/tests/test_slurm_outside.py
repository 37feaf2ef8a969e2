"""From outside an allocation (the root namespace is the login node): the
entry's job parameters become a real ``sbatch`` job whose steps run the
worker loops.  The scheduler passes ``check_scheduler``; ``stop()`` leaves
the job running and a new client reattaches (``MONARCH_SLURM_JOB_ID``);
``shutdown()`` cancels it; a bad partition, a job that waits too long and a
failing worker step each give an ``AllocationError`` that says so.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import slurm_helpers as H

pytest.importorskip("hostlist")

CONFORMANCE = r'''
import os, signal, subprocess, sys
from monarch_core._plugins import registry
from monarch_core.actor import enable_transport
from monarch_core.hookspecs import SESSION_CREDENTIALS
from monarch_core.testing import check_scheduler
from monarch_scheduler_slurm import SlurmScheduler

enable_transport("tls://10.250.0.1:0")
registry().transport("tls").set_credentials(ca=SESSION_CREDENTIALS)


def kill_worker(host):
    """The host's worker loop dies on its node (SIGKILL, found in the node's namespace): only this job's
    (the namespace hosts are shared: other tests' worker loops run there too)."""
    pids = subprocess.run(["ip", "netns", "pids", "rt-" + host.labels["node"]], capture_output=True, text=True,
                          timeout=30).stdout.split()
    job = b"SLURM_JOB_ID=" + host.labels["job"].encode()
    for pid in pids:
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            comm = open(f"/proc/{pid}/comm", "rb").read().strip()
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        # exec'd (python -m monarch_core.worker) or forked by the node launcher (named monarch-worker)
        if (b"monarch_core.worker" in cmd or comm == b"monarch-worker") and job in env:
            os.kill(int(pid), signal.SIGKILL)


# the long-idle check: quiet for several times every timeout it could trip (shortened in this client's environment)
check_scheduler(SlurmScheduler(), {"nodes": 2, "time": "00:05:00", "job_name": sys.argv[1]},
                bad_params={"nodes": 0}, lose_host=kill_worker, timeout=120, idle=float(sys.argv[2]))
print("conformant")
'''


#: timeouts silence could trip, shortened for the long-idle check (seconds); it stays quiet for QUIET s
IDLE_SETTINGS = {"MONARCH_HEARTBEAT_INTERVAL": "1", "MONARCH_HEARTBEAT_TIMEOUT": "4", "MONARCH_DELIVERY_TIMEOUT": "4"}
QUIET = 12.0


def test_the_slurm_scheduler_passes_check_scheduler_with_a_job_it_submits(cluster: Any, tmp_path: Path) -> None:
    assert QUIET >= 3 * max(map(float, IDLE_SETTINGS.values()))
    H.write_project(tmp_path, CONFORMANCE, None)
    res = H.client(tmp_path, H.JOB_NAME, str(QUIET), env_extra=IDLE_SETTINGS)
    assert res.returncode == 0, res.stderr[-6000:]
    assert res.stdout.strip().splitlines()[-1] == "conformant"


PERSIST = r'''
import json, logging, os, socket, sys
logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(levelname)s %(message)s")
from monarch_core.actor import Actor, endpoint, hosts_from_config


class Where(Actor):
    @endpoint
    def where(self):
        return socket.gethostname()


hm = hosts_from_config("cluster")
pm = hm.spawn_procs(per_host={"gpus": 2})
where = pm.spawn("where", Where).where.call().get(timeout=120).values()
print("RESULT " + json.dumps({"job": hm.hosts[0].labels["job"], "where": where,
                              "hosts": [h.name for h in hm.hosts]}), flush=True)
if sys.argv[1] == "stop":
    hm.stop().get(timeout=60)      # the client then ends: the job is kept
elif sys.argv[1] == "hang":
    import time
    time.sleep(600)                # until the test SIGKILLs it
else:
    hm.shutdown().get(timeout=60)  # the job is cancelled
'''


def _result(res: Any) -> dict:
    for line in res.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise AssertionError(f"no RESULT line; rc {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}")


def test_stop_keeps_the_job_a_new_client_reattaches_and_shutdown_cancels_it(cluster: Any, netns: Any,
                                                                           tmp_path: Path) -> None:
    H.write_project(tmp_path, PERSIST, f'''
        [hosts.cluster]
        scheduler = "slurm"
        nodes = 2
        time = "00:10:00"
        job_name = "{H.JOB_NAME}"
    ''')
    first = H.client(tmp_path, "stop")
    assert first.returncode == 0, first.stderr[-6000:]
    out = _result(first)
    job = out["job"]
    assert out["hosts"] == [H.N1, H.N2] and out["where"] == [H.N1, H.N1, H.N2, H.N2]
    assert re.search(rf"Slurm job {job} keeps running .*job_id = {job}", first.stderr), first.stderr[-3000:]
    assert H.job_state(job) == "RUNNING"
    for i in H.NODE_NUMBERS[:2]:  # the client's workers ended with it; the job holds its nodes
        assert H.worker_pids(i, netns) == [], f"worker loops left on h{i} after the client ended"

    second = H.client(tmp_path, "shutdown", env_extra={"MONARCH_SLURM_JOB_ID": job})
    assert second.returncode == 0, second.stderr[-6000:]
    again = _result(second)
    assert again["job"] == job and again["where"] == [H.N1, H.N1, H.N2, H.N2]
    assert f"attaching to Slurm job {job}" in second.stderr
    assert H.wait_state(job, {"CANCELLED"}) == "CANCELLED"


def test_a_client_killed_by_sigkill_takes_its_workers_along(cluster: Any, netns: Any, tmp_path: Path) -> None:
    """SIGKILL runs nothing in the client: its srun (PR_SET_PDEATHSIG) ends the
    worker step, and the job waits for a client to attach (or its time limit)."""
    import signal
    import subprocess

    H.write_project(tmp_path, PERSIST, f'''
        [hosts.cluster]
        scheduler = "slurm"
        nodes = 2
        time = "00:05:00"
        job_name = "{H.JOB_NAME}"
    ''')
    p = subprocess.Popen([H.PY, "prog.py", "hang"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True, env=H.env())
    try:
        line = ""
        assert p.stdout is not None
        while not line.startswith("RESULT "):
            line = p.stdout.readline()
            assert line, f"the client ended early (rc {p.poll()})"
        job = json.loads(line[len("RESULT "):])["job"]
        assert H.worker_pids(H.NODE_NUMBERS[0], netns) and H.worker_pids(H.NODE_NUMBERS[1], netns)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    deadline = time.monotonic() + 30
    while (H.worker_pids(H.NODE_NUMBERS[0], netns) or H.worker_pids(H.NODE_NUMBERS[1], netns)) and time.monotonic() < deadline:
        time.sleep(0.2)  # /proc has nothing to wait on
    assert H.worker_pids(H.NODE_NUMBERS[0], netns) == [] and H.worker_pids(H.NODE_NUMBERS[1], netns) == [], "worker loops outlived their client"
    assert H.job_state(job) == "RUNNING"
    H.run(["scancel", job], 30, env=H.env())
    assert not list(Path("~/.monarch/slurm").expanduser().glob(f"job{job}-*")), "a session directory was left"


FAILURES = r'''
import json, re, sys
from monarch_core.actor import hosts_from_config
from monarch_core.errors import AllocationError

out = {}
for name in ("badpart", "latewarn", "waits", "nopython", "nomonarch", "toomany"):
    try:
        hosts_from_config(name).shutdown().get(timeout=60)
        out[name] = "allocated"
    except AllocationError as e:
        out[name] = str(e)
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def failures(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("failures")
    # a Python that can run the node launcher (standard library only, found through
    # PYTHONPATH) but not the worker loop: monarch-core is not installed for it
    import monarch_scheduler_slurm
    nomonarch = d / "python-without-monarch"
    nomonarch.write_text("#!/bin/sh\nPYTHONPATH=%s exec /usr/bin/python3 \"$@\"\n"
                         % Path(monarch_scheduler_slurm.__file__).parent.parent)
    nomonarch.chmod(0o755)
    H.write_project(d, FAILURES, f'''
        [defaults]
        scheduler = "slurm"
        job_name = "{H.JOB_NAME}"
        time = "00:05:00"

        [hosts.badpart]
        partition = "no-such-partition"

        [hosts.latewarn]
        partition = "no-such-partition"
        time = 1   # the default signal, USR2@60, is then due at the job's first limit check

        [hosts.waits]
        sbatch_args = ["--begin=now+3600"]
        queue_timeout = 3

        [hosts.nopython]
        nodes = 2
        python = "/nonexistent/bin/python3"

        [hosts.nomonarch]
        nodes = 2
        python = "{nomonarch}"

        [hosts.toomany]
        nodes = 5
        queue_timeout = 60   # a bound only: Slurm's reason says at once that it never runs
    ''')
    res = H.client(d)
    return {**_result(res), "nomonarch-python": str(nomonarch), "stderr": res.stderr}


def test_a_job_slurm_refuses_fails_with_slurms_own_message(failures: dict) -> None:
    msg = failures["badpart"]
    assert "[hosts.badpart]" in msg and "Slurm refused the job" in msg, msg
    assert "Invalid partition name specified" in msg, msg


def test_an_entry_whose_time_leaves_no_room_for_its_warning_signal_is_warned_at_submission(failures: dict) -> None:
    err = failures["stderr"]
    assert re.search(r"\[hosts\.latewarn\]: the warning signal USR2@60 is due at the job's first time-limit check.*"
                     r'use signal = "USR2@20" or less, or a longer time', err), err[-4000:]
    assert "[hosts.badpart]: the warning signal" not in err, err[-4000:]  # five minutes leave room
    assert "Slurm refused the job" in failures["latewarn"]  # then submitted as asked


def test_a_job_that_waits_longer_than_queue_timeout_is_cancelled_and_the_error_says_so(failures: dict) -> None:
    msg = failures["waits"]
    m = re.search(r"Slurm job (\d+) did not start within \d+s \(state PENDING, reason BeginTime\); it was "
                  r"cancelled\. Raise queue_timeout", msg)
    assert m, msg
    assert H.wait_state(m.group(1), {"CANCELLED"}) == "CANCELLED"


def test_a_failing_worker_step_gives_srun_s_stderr_and_the_job_is_cancelled(failures: dict) -> None:
    msg = failures["nopython"]
    m = re.search(r"the worker step of Slurm job (\d+) ended before the worker loops of \['(\w+)', '(\w+)'\] listened", msg)
    assert m and {m.group(2), m.group(3)} <= set(H.NODES), msg
    assert "srun exit code" in msg and "srun's last output" in msg, msg
    assert "/nonexistent/bin/python3" in msg and "No such file or directory" in msg, msg
    assert H.wait_state(m.group(1), {"CANCELLED"}) == "CANCELLED"


def test_a_wrong_python_names_the_python_key_and_every_node(failures: dict) -> None:
    for case, python, what in (("nopython", "/nonexistent/bin/python3", "the node launcher"),
                               ("nomonarch", str(failures["nomonarch-python"]), "the worker loop")):
        msg = failures[case]
        # the job's two nodes (the first two idle ones: a node the job before still completes on is skipped)
        nodes = re.search(r"worker loops of \['(\w+)', '(\w+)'\]", msg)
        assert nodes and {nodes.group(1), nodes.group(2)} <= set(H.NODES), msg
        assert f"The Python {python!r} (the entry's python) could not run {what} on {nodes.group(1)}, {nodes.group(2)}" in msg, msg
        assert 'set python = "/path/to/python" in the entry' in msg, msg
    assert "No module named" in failures["nomonarch"], failures["nomonarch"]


def test_more_nodes_than_the_partition_has_fails_at_once_with_slurms_reason(failures: dict) -> None:
    msg = failures["toomany"]
    m = re.search(r"\[hosts.toomany\]: Slurm will never run job (\d+) as asked \(state PENDING, reason "
                  r"PartitionNodeLimit\): it asks for more nodes than the partition has", msg)
    assert m, msg
    assert "nodes = ..." in msg and "it was cancelled" in msg, msg
    assert H.wait_state(m.group(1), {"CANCELLED"}) == "CANCELLED"


BAR = r"""
from monarch_core.actor import hosts_from_config
hosts_from_config("held").shutdown().get(timeout=60)
print("allocated", flush=True)
"""


def _release_when_held(hold_for: float) -> threading.Thread:
    """Release this suite's held job once it has waited ``hold_for`` s."""
    def run() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            held = [j for j, st in H.our_jobs().items() if st == "PENDING"]
            if held:
                time.sleep(hold_for)
                H.run(["scontrol", "release", *held], 30, env=H.env())
                return
            time.sleep(0.1)  # squeue has nothing to wait on

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_the_wait_shows_a_progress_bar_on_a_terminal_only(cluster: Any, tmp_path: Path) -> None:
    import fcntl
    import pty
    import struct
    import subprocess
    import termios

    H.write_project(tmp_path, BAR, f"""
        [hosts.held]
        scheduler = "slurm"
        job_name = "{H.JOB_NAME}"
        sbatch_args = ["--hold"]
    """)
    master, slave = pty.openpty()  # stderr is a terminal of 120 columns
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    releaser = _release_when_held(1.5)
    p = subprocess.Popen([H.PY, "prog.py"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=slave, env=H.env())
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    releaser.join(60)
    assert p.wait(120) == 0, seen.decode(errors="replace")[-4000:]
    assert p.stdout is not None and p.stdout.read().decode().strip() == "allocated"
    text = seen.decode(errors="replace")
    assert re.search(r"Slurm job \d+, state PENDING, reason JobHeldUser, waited \ds", text), text[-3000:]
    # without a terminal (every other test here): no bar
    releaser = _release_when_held(1.5)
    quiet = H.client(tmp_path)
    releaser.join(60)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "waited" not in quiet.stderr and "JobHeldUser" not in quiet.stderr, quiet.stderr[-3000:]
