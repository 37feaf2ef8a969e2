"""``monarch torchrun`` on this machine, as a user runs it: a real command
process, real procs, real gloo.  It exits with the first failing rank's
status (a raising rank, ``sys.exit(3)``, a SIGKILLed rank), stops every rank
on a failure and on Ctrl-C, restarts with ``--max-restarts``, runs ``-m``
modules, and leaves no process behind.  Processes are found by a tag in
their environment (the command's procs inherit it)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from _helpers.clients import PY, LineReader, child_env  # noqa: E402

PROGRAMS = Path(__file__).resolve().parent / "programs"
#: generous bound of one command on a loaded 2-core machine (4 procs importing torch)
COMMAND_TIMEOUT = 240


def tagged(tag: str) -> list[int]:
    needle = f"\0SPMD_TEST_TAG={tag}\0".encode()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = b"\0" + f.read() + b"\0"
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state not in ("Z", "X"):
            found.append(int(d))
    return found


def assert_nothing_left(tag: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while tagged(tag):
        if time.monotonic() > deadline:
            left = tagged(tag)
            for p in left:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            raise AssertionError(f"processes of the command left {timeout:.0f} s after it exited: {left}")
        time.sleep(0.05)


def command(*argv: str, tag: str) -> subprocess.Popen:
    env = child_env({"SPMD_TEST_TAG": tag, "OMP_NUM_THREADS": None}, drop=("MONARCH_",))
    return subprocess.Popen([PY, "-m", "monarch_core.cli", "torchrun", *argv], cwd=PROGRAMS, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@contextlib.contextmanager
def cleaned_up(p: subprocess.Popen, tag: str) -> Iterator[subprocess.Popen]:
    """Whatever the test's outcome (a wait that timed out, a line that never
    came), neither the command nor a process of its tag outlives the test."""
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
        for pid in tagged(tag):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def finish(p: subprocess.Popen, tag: str) -> tuple[int, str]:
    try:
        out, _ = p.communicate(timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        raise AssertionError(f"monarch torchrun did not exit within {COMMAND_TIMEOUT} s:\n{out[-4000:]}")
    assert_nothing_left(tag)
    return p.returncode, out


def test_a_ddp_job_succeeds_with_every_ranks_output_prefixed_and_the_single_process_parameters(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex
    out_file = tmp_path / "ddp.json"
    rc, out = finish(command("--nproc-per-node", "4", "train_ddp.py", "--out", str(out_file), tag=tag), tag)
    assert rc == 0, out[-4000:]
    for r in range(4):  # each line names the rank's coordinates and host
        assert re.search(rf"\[_SPMDActor\{{'gpus': {r}/4\}} \S+\] rank {r}/4 local {r} host", out), out[-4000:]
    single = tmp_path / "single.json"
    subprocess.run([PY, "train_ddp.py", "--single", "--world", "4", "--out", str(single)], cwd=PROGRAMS, check=True,
                   timeout=120, env=child_env())
    assert json.loads(out_file.read_text()) == json.loads(single.read_text())


def test_a_rank_that_exits_3_makes_the_command_exit_3_and_stop_every_rank() -> None:
    tag = uuid.uuid4().hex
    rc, out = finish(command("--nproc-per-node", "3", "train_ddp.py", "--exit-rank", "1", "--exit-code", "3",
                             tag=tag), tag)
    assert rc == 3, out[-4000:]
    assert "first failure rank 1 {'gpus': 1}: exit status 3" in out, out[-4000:]


def test_a_raising_rank_is_the_first_failure_not_the_peers_whose_collective_broke() -> None:
    tag = uuid.uuid4().hex
    rc, out = finish(command("--nproc-per-node", "3", "train_ddp.py", "--fail-rank", "2", "--fail-step", "1",
                             tag=tag), tag)
    assert rc == 1, out[-4000:]
    assert "first failure rank 2 {'gpus': 2}: exit status 1" in out and "fails at step 1 on purpose" in out, out[-4000:]


def test_a_sigkilled_rank_makes_the_command_exit_137_within_bounded_time() -> None:
    tag = uuid.uuid4().hex
    p = command("--nproc-per-node", "3", "train_ddp.py", "--hang-rank", "1", "--steps", "100000", tag=tag)
    with cleaned_up(p, tag):
        reader = LineReader(p.stdout, "torchrun")
        _, m = reader.wait_for(lambda s: re.search(r"rank 1 pid (\d+) waits to be killed", s), COMMAND_TIMEOUT)
        os.kill(int(m.group(1)), signal.SIGKILL)
        rc = p.wait(timeout=COMMAND_TIMEOUT)
        reader.join(30)
    out = reader.text()
    assert_nothing_left(tag)
    assert rc == 128 + signal.SIGKILL, out[-4000:]
    assert "first failure rank 1 {'gpus': 1}: exit status 137" in out and "SIGKILL" in out, out[-4000:]


def test_ctrl_c_stops_every_rank_and_exits_130() -> None:
    tag = uuid.uuid4().hex
    p = command("--nproc-per-node", "2", "train_ddp.py", "--hang-rank", "0", tag=tag)
    with cleaned_up(p, tag):
        reader = LineReader(p.stdout, "torchrun")
        reader.wait_for(lambda s: "waits to be killed" in s, COMMAND_TIMEOUT)
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=COMMAND_TIMEOUT)
        reader.join(30)
    assert_nothing_left(tag)
    assert rc == 130, reader.text()[-4000:]
    assert "interrupted; every rank was stopped" in reader.text()


def test_max_restarts_runs_every_rank_again_with_the_restart_count_and_a_module_runs_with_m(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex
    out = tmp_path / "probe"
    rc, text = finish(command("--nproc-per-node", "2", "--max-restarts", "1", "--role", "trainer", "-m",
                              "spmd_pkg.probe", str(out), "--fail-first", tag=tag), tag)
    assert rc == 0, text[-4000:]
    assert "restarting every rank (restart 1 of 1)" in text, text[-4000:]
    seen = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(2)]
    assert [s["restart"] for s in seen] == ["1", "1"]  # the files of the second attempt
    assert all(s["argv"][0].endswith("spmd_pkg/probe.py") and s["argv"][1:] == [str(out), "--fail-first"]
               for s in seen)


# ---------------------------------------------------------------- each rank a process of its own


def test_a_failed_attempt_sigterms_the_other_ranks_whose_handler_checkpoints_and_the_restart_starts_fresh(
        tmp_path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex
    out = tmp_path / "life"
    rc, text = finish(command("--nproc-per-node", "2", "--max-restarts", "1", "lifecycle.py", str(out), "--wait",
                              "--fail-rank", "1", "--fail-first", tag=tag), tag)
    assert rc == 0, text[-4000:]
    assert "first failure" not in text and "restarting every rank (restart 1 of 1)" in text, text[-4000:]
    # attempt 0: rank 1 exited 3, so the job stopped rank 0 with SIGTERM, and its handler saved a checkpoint
    assert (tmp_path / "life.0.sigterm").read_text() == f"checkpoint of rank 0 on signal {int(signal.SIGTERM)}\n"
    assert "rank 0 got SIGTERM and saved its checkpoint" in text, text[-4000:]
    assert not (tmp_path / "life.1.sigterm").exists()
    for r in range(2):  # attempt 1 (its files replaced attempt 0's): a fresh interpreter, its atexit ran twice
        seen = json.loads((tmp_path / f"life.{r}.json").read_text())
        assert (seen["runs"], seen["restart"], seen["main_thread"]) == (1, "1", True)
        assert len((tmp_path / f"life.{r}.atexit").read_text().splitlines()) == 2


@pytest.mark.parametrize("sig, status, said", [(signal.SIGINT, 130, "interrupted; every rank was stopped"),
                                               (signal.SIGTERM, 143, "terminated (SIGTERM); every rank was stopped")])
def test_ctrl_c_or_sigterm_to_the_command_reaches_every_ranks_sigterm_handler(sig, status, said, tmp_path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex
    out = tmp_path / "pre"
    p = command("--nproc-per-node", "2", "lifecycle.py", str(out), "--wait", tag=tag)
    with cleaned_up(p, tag):
        reader = LineReader(p.stdout, "torchrun")
        for r in range(2):
            reader.wait_for(lambda s, r=r: f"rank {r} pid" in s and "ready" in s, COMMAND_TIMEOUT)
        p.send_signal(sig)  # a Slurm preemption sends SIGTERM; a terminal's Ctrl-C SIGINT
        rc = p.wait(timeout=COMMAND_TIMEOUT)
        reader.join(30)
    assert_nothing_left(tag)
    text = reader.text()
    assert rc == status and said in text, text[-4000:]
    for r in range(2):
        assert (tmp_path / f"pre.{r}.sigterm").read_text() == f"checkpoint of rank {r} on signal {int(signal.SIGTERM)}\n"
        assert f"rank {r} got SIGTERM and saved its checkpoint" in text, text[-4000:]


# ---------------------------------------------------------------- torchrun's other options


def test_log_dir_redirects_tee_local_ranks_filter_local_addr_monitor_interval_and_start_method(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex
    out, logs = tmp_path / "streams", tmp_path / "logs"
    rc, text = finish(command("--nproc-per-node", "2", "--rdzv-id", "job7", "--log-dir", str(logs), "-r", "1",
                              "--tee", "2", "--local-ranks-filter", "0", "--local-addr", "localhost",
                              "--monitor-interval", "0.5", "--start-method", "fork", "streams.py", str(out), tag=tag),
                      tag)
    assert rc == 0, text[-4000:]
    for r in range(2):  # torchrun's layout: <log dir>/<run id>/attempt_<k>/<rank>/std{out,err}.log
        folder = logs / "job7" / "attempt_0" / str(r)
        assert (folder / "stdout.log").read_text().splitlines() == [f"stdout of rank {r}"]
        assert f"stderr of rank {r}" in (folder / "stderr.log").read_text().splitlines()
        seen = json.loads(Path(f"{out}.{r}").read_text())
        assert seen == {"MASTER_ADDR": "localhost", "sum": 1.0}  # the rendezvous at --local-addr worked
    assert "stdout of rank" not in text  # -r 1: stdout went to the files only
    assert re.search(r"\[_SPMDActor\{'gpus': 0/2\} \S+\] stderr of rank 0", text), text[-4000:]  # --tee 2
    assert "stderr of rank 1" not in text  # --local-ranks-filter 0
    assert f"log files go to {logs / 'job7'}/attempt_K/RANK/" in text
    assert "--start-method fork: every rank runs as a fresh python process" in text


def test_run_path_runs_the_script_with_runpy_in_a_fresh_interpreter(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tag = uuid.uuid4().hex
    out = tmp_path / "rp"
    rc, text = finish(command("--nproc-per-node", "2", "--run-path", "argv_probe.py", str(out), "--x", tag=tag), tag)
    assert rc == 0, text[-4000:]
    for r in range(2):
        seen = json.loads(Path(f"{out}.{r}").read_text())
        assert seen["argv"] == ["argv_probe.py", str(out), "--x"] and seen["name"] == "__main__" and seen["sum"] == 1
        assert seen["path0"] == ""  # python -c's, as torchrun's run_script_path: not the script's folder


def test_no_python_runs_a_command_whose_status_is_the_jobs_and_redirects_default_to_a_temporary_folder() -> None:
    tag = uuid.uuid4().hex
    rc, text = finish(command("--nproc-per-node", "2", "--rdzv-id", "np", "--tee", "1", "--no-python", "sh", "-c",
                              'echo "rank $RANK of $WORLD_SIZE"; [ "$RANK" = 1 ] && exit 7; exit 0', tag=tag), tag)
    assert rc == 7, text[-4000:]
    assert "first failure rank 1 {'gpus': 1}: exit status 7: rank 1 on host" in text and "command sh" in text
    for r in range(2):
        assert re.search(rf"\[_SPMDActor\{{'gpus': {r}/2\}} \S+\] rank {r} of 2", text), text[-4000:]
    m = re.search(r"log files go to (\S*torchelastic_\w+/np)/attempt_K/RANK/", text)
    assert m, text[-4000:]
    try:
        assert Path(m.group(1), "attempt_0", "1", "stdout.log").read_text() == "rank 1 of 2\n"
    finally:
        import shutil

        shutil.rmtree(Path(m.group(1)).parent, ignore_errors=True)
