"""Proc output: stdout, stderr and ``logging`` records of every proc reach the
client with their prefix, in order, aggregated over a window, nothing lost at
stop; local procs that do not stream write to the terminal themselves; procs
on remote hosts (network-namespace worker loops) stream, or write a per-host
log file whose path the client logs."""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

import pytest

from _helpers.transport import HERE, PRELUDE, PY, ROOT_ADDR, child_env, host_addr

ACTOR = r"""
import logging, os, sys, time
from monarch_core.actor import Actor, endpoint, this_host, current_rank

class Printer(Actor):
    @endpoint
    def say(self, text):
        print(text)
    @endpoint
    def many(self, n):
        for i in range(n):
            print(f"line {i:04d} of rank {current_rank().rank}")
    @endpoint
    def mixed(self):
        print("to stdout")
        print("to stderr", file=sys.stderr)
        logging.getLogger("user").warning("a warning record")
        os.write(1, b"straight to fd 1\n")
    @endpoint
    def last_words(self, n):
        for i in range(n):
            sys.stdout.write(f"last {i}\n")         # buffered, never flushed by the endpoint
"""


def lines(text: str, pattern: str) -> list[str]:
    return [ln for ln in text.splitlines() if re.search(pattern, ln)]


def test_streamed_lines_carry_their_prefix_and_keep_their_order(client_script) -> None:
    out = client_script(ACTOR + r"""
pm = this_host().spawn_procs({"gpus": 2})
m = pm.spawn("printer", Printer)
pm.logging_option(stream_to_client=True, aggregate_window_sec=None, level=logging.INFO)
m.slice(gpus=1).mixed.call_one().get()
m.slice(gpus=0).many.call_one(300).get()
pm.stop().get()
print("client done")
""", timeout=120)
    assert out.returncode == 0, out.stderr
    so, se = out.stdout, out.stderr
    assert "[printer{'gpus': 1/2} localhost] to stdout" in so
    assert "[printer{'gpus': 1/2} localhost] to stderr" in se
    # one prefix; the record is printed as a plain Python program prints it with no logging configured
    assert "[printer{'gpus': 1/2} localhost] a warning record" in se, se
    assert "[procs0{'gpus': 1/2} localhost] straight to fd 1" in so  # written below Python: the proc's prefix
    got = lines(so, r"^\[printer\{'gpus': 0/2\} localhost\] line ")
    assert got == [f"[printer{{'gpus': 0/2}} localhost] line {i:04d} of rank 0" for i in range(300)]
    assert so.rstrip().endswith("client done")


def test_lines_printed_right_before_stop_are_not_lost(client_script) -> None:
    for stream in ("1", "0"):
        out = client_script(ACTOR + r"""
pm = this_host().spawn_procs({"gpus": 2})
m = pm.spawn("quitter", Printer)
m.last_words.call(50).get()
pm.stop().get()
print("client done")
""", env={"MONARCH_STREAM_LOGS": stream}, timeout=120)
        assert out.returncode == 0, out.stderr
        for i in range(50):
            # streamed: each line of the two ranks once, or merged ("[2 similar lines]");
            # direct (local procs, not streaming): unprefixed, from each proc itself
            n = sum(int(m.group(1) or 1) for m in re.finditer(
                rf"^(?:\[(\d+) similar lines\] |\[quitter\{{'gpus': [01]/2\}} localhost\] |)last {i}$", out.stdout, re.M))
            assert n == 2, (stream, i, out.stdout[-2000:])
        assert out.stdout.rstrip().endswith("client done")


def test_identical_lines_of_64_ranks_are_printed_once_with_a_count(client_script) -> None:
    out = client_script(ACTOR + r"""
pm = this_host().spawn_procs({"gpus": 64})
m = pm.spawn("trainers", Printer)
m.say.call("warm").get()
pm.logging_option(stream_to_client=True, aggregate_window_sec=2)
m.say.call("step 10 loss 0.12").get()
m.slice(gpus=5).say.call_one("only rank 5").get()
pm.stop().get()
print("client done")
""", env={"MONARCH_STREAM_LOGS": "0"}, timeout=240)
    assert out.returncode == 0, out.stderr
    assert lines(out.stdout, r"step 10 loss 0\.12") == ["[64 similar lines] step 10 loss 0.12"]
    assert lines(out.stdout, r"only rank 5") == ["[trainers{'gpus': 5/64} localhost] only rank 5"]
    # before logging_option each proc wrote to the terminal itself (their writes may interleave)
    assert out.stdout.count("warm") == 64


def test_logging_option_refuses_bad_arguments_with_the_fix(procs) -> None:
    with pytest.raises(TypeError, match="True or False"):
        procs.logging_option(stream_to_client="yes")
    with pytest.raises(ValueError, match="seconds >= 0 or None"):
        procs.logging_option(aggregate_window_sec=-1)
    with pytest.raises(ValueError, match="logging level"):
        procs.logging_option(level="LOUD")
    with pytest.raises(TypeError, match="logging level"):
        procs.logging_option(level=2.5)


def test_stream_logs_tells_the_truth(client_script, tmp_path: Path) -> None:
    (tmp_path / "monarch.toml").write_text('[hosts.one]\nscheduler = "local"\nhosts = 1\n')
    code = r"""
import json
from monarch_core.actor import this_host, hosts_from_config
hm = hosts_from_config("one")
print(json.dumps([this_host().stream_logs, hm.stream_logs]))
hm.shutdown().get()
"""
    got = {}
    for setting in (None, "1", "0"):
        out = client_script(code, env={"MONARCH_CONFIG": str(tmp_path / "monarch.toml"), "MONARCH_STREAM_LOGS": setting},
                            timeout=120)
        assert out.returncode == 0, out.stderr
        got[setting] = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {None: [True, True], "1": [True, True], "0": [False, False]}  # streaming is the default


REMOTE = r"""
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from monarch_core.actor import Actor, endpoint, enable_transport, current_rank
from monarch_core.worker import attach_to_workers

class Printer(Actor):
    @endpoint
    def say(self, text):
        print(f"{text} from rank {current_rank().rank}")

enable_transport("tcp://ROOT:0")
hosts = attach_to_workers(URLS, timeout=30)
pm = hosts.spawn_procs(per_host={"gpus": 2})
m = pm.spawn("far", Printer)
BODY
m.say.call("hello").get(timeout=60)
pm.stop().get(timeout=60)
print("client done")
import os
os._exit(0)
"""


@pytest.fixture
def two_workers(netns, workers):  # type: ignore[no-untyped-def]
    port = random.randrange(30000, 40000)
    return lambda env=None: [workers(f"tcp://{host_addr(i)}:{port}", host=i, args=["--insecure-tcp"], env=env)
                             for i in (1, 2)]


def remote_client(ws: list, body: str = "") -> subprocess.CompletedProcess:
    """Run the client of :data:`REMOTE` in the root namespace, attached to ``ws``."""
    code = REMOTE.replace("ROOT", ROOT_ADDR).replace("URLS", repr([w.address for w in ws])).replace("BODY", body)
    res = subprocess.run([PY, "-c", PRELUDE.format(here=str(HERE)) + code], capture_output=True, text=True,
                         timeout=120, env=child_env(), cwd="/")
    assert res.returncode == 0, res.stderr[-4000:]
    return res


def test_lines_from_remote_procs_arrive_with_their_prefix(two_workers) -> None:
    ws = two_workers()
    res = remote_client(ws)
    for h in (0, 1):
        for g in (0, 1):
            rank = h * 2 + g
            want = f"[far{{'hosts': {h}/2, 'gpus': {g}/2}} h{h + 1}] hello from rank {rank}"
            assert want in res.stdout.splitlines(), res.stdout
    for w in ws:
        assert "hello from rank" not in w.output(), "streamed lines do not (also) go to the worker's output"


def test_remote_procs_that_do_not_stream_write_a_per_host_log_file(two_workers, tmp_path: Path) -> None:
    ws = two_workers({"MONARCH_PROC_LOG_DIR": str(tmp_path)})
    res = remote_client(ws, "pm.logging_option(stream_to_client=False)")
    assert "hello from rank" not in res.stdout
    logged = dict(re.findall(r"output of procs on host (h\d) goes to (\S+)", res.stderr))
    assert set(logged) == {"h1", "h2"}, res.stderr[-3000:]
    for h, path in logged.items():
        assert Path(path).parent == tmp_path
        text = Path(path).read_text()
        i = int(h[1]) - 1
        for g in (0, 1):
            assert f"[far{{'hosts': {i}/2, 'gpus': {g}/2}}] hello from rank {i * 2 + g}" in text.splitlines(), text
