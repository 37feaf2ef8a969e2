"""Inside an allocation: a real ``sbatch`` job (and an ``salloc`` shell) whose
Python program calls ``hosts_from_config`` with ``scheduler = "slurm"`` and
no job parameters, gets one host per node (a worker loop each, started as a
job step, authenticated with credentials of this job only), calls 3 x 4
actors and writes what it saw to ``results.json``, which the test reads.
The same program runs unchanged with a ``local`` entry outside Slurm.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import slurm_helpers as H

pytest.importorskip("hostlist")
trustme = pytest.importorskip("trustme")

PROGRAM = r'''
import json, logging, os, socket, ssl, sys, time
from pathlib import Path

logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(levelname)s %(message)s")
from monarch_core.actor import Actor, endpoint, hosts_from_config

HERE = Path(__file__).resolve().parent
MODE = sys.argv[1]


class Where(Actor):
    @endpoint
    def where(self):
        print(f"stdout-marker {socket.gethostname()} {os.getpid()}", flush=True)
        print(f"stderr-marker {socket.gethostname()} {os.getpid()}", file=sys.stderr, flush=True)
        return [socket.gethostname(), os.getpid()]


def call_all(hm, per_host=4):
    pm = hm.spawn_procs(per_host={"gpus": per_host})
    return pm.spawn("where", Where).where.call().get(timeout=120).values()


def stranger(address, certfile=None):
    """A TLS client that is not this job's: no certificate, or one of another CA."""
    host, port = address.split("://")[1].rsplit(":", 1)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if certfile:
        ctx.load_cert_chain(certfile)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as s:
            with ctx.wrap_socket(s) as t:
                t.settimeout(10)
                t.sendall(b"MONARCH\x00\x01" + b"\x00" * 64)
                return "got %r" % (t.recv(100),)
    except (ssl.SSLError, OSError) as e:
        return "refused: " + type(e).__name__


out = {"job": os.environ.get("SLURM_JOB_ID")}
t0 = time.monotonic()
hm = hosts_from_config("trainers")
out["alloc_s"] = time.monotonic() - t0
out["hosts"] = [h.name for h in hm.hosts]
out["addresses"] = [h.address for h in hm.hosts]
out["table"] = hm.to_table()
out["extent"] = dict(hm.extent.items()) if hasattr(hm.extent, "items") else str(hm.extent)
if MODE == "full":
    state = Path(os.path.expanduser("~/.monarch/slurm"))
    sessions = list(state.glob(f"job{out['job']}-*"))
    out["session_files"] = [sorted(os.listdir(p)) for p in sessions]
out["where"] = call_all(hm)
out["first_reply_s"] = time.monotonic() - t0
if MODE == "full":
    out["no_cert"] = stranger(hm.hosts[1].address)
    out["other_ca"] = stranger(hm.hosts[1].address, sys.argv[2])
    out["after_strangers"] = len(call_all(hm, 1))
hm.shutdown().get(timeout=60)
if MODE == "full":
    out["sessions_after"] = [str(p) for p in state.glob(f"job{out['job']}-*")]
    hm2 = hosts_from_config("pair")  # nodes = 2: the first two nodes of the job
    out["pair"] = [h.name for h in hm2.hosts]
    out["pair_where"] = sorted({w[0] for w in call_all(hm2, 1)})
    hm2.shutdown().get(timeout=60)
    os.chdir("/")  # no configuration file from here up: the zero-config default
    hm3 = hosts_from_config("anything")
    out["default"] = [h.name for h in hm3.hosts]
    out["default_where"] = sorted({w[0] for w in call_all(hm3, 1)})
    hm3.shutdown().get(timeout=60)
(HERE / "results.json").write_text(json.dumps(out))
print("done", flush=True)
'''

SLURM_TOML = """
[hosts.trainers]
scheduler = "slurm"

[hosts.pair]
scheduler = "slurm"
nodes = 2
"""


@pytest.fixture(scope="module")
def batch_job(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, Any]:
    """One real sbatch job on 3 nodes running the program (shared by the tests of this module)."""
    d = tmp_path_factory.mktemp("sbatch")
    other = trustme.CA()
    other.issue_cert("10.250.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(d / "other.pem"))
    H.write_project(d, PROGRAM, SLURM_TOML)
    (d / "prog.py").write_text((d / "prog.py").read_text().replace("sys.argv[1]", '"full"').replace(
        "sys.argv[2]", repr(str(d / "other.pem"))))
    job, res = H.sbatch_wait(d, 3)
    return d, job, res


def _check_three_by_four(out: dict, names: list[str]) -> None:
    assert out["hosts"] == names
    where = out["where"]
    assert len(where) == 12 and len({pid for _, pid in where}) == 12
    # rank order: hosts then gpus; each host's 4 procs run on that host
    assert [w[0] for w in where] == [n for n in names for _ in range(4)], where


def test_an_sbatch_script_gets_one_host_per_node_in_node_order_and_calls_3x4_actors(batch_job) -> None:  # type: ignore[no-untyped-def]
    d, job, res = batch_job
    assert res.returncode == 0, f"sbatch --wait: rc {res.returncode}\n{res.stderr}\n{(d / 'out.txt').read_text()[-6000:]}"
    out = H.results(d)
    assert out["job"] == job
    _check_three_by_four(out, list(H.NODES))
    for k, (name, i) in enumerate(zip(H.NODES, H.NODE_NUMBERS)):
        assert re.search(rf"^\s*\d+\s+\{{'hosts': {k}/3\}}\s+{name}\s+tls://{re.escape(H.host_addr(i))}:\d+\s+"
                         rf"job={job} node={name}$", out["table"], re.M), out["table"]
    # no fixed ports: every worker bound a port of its own choosing on its node's address
    for a, i in zip(out["addresses"], H.NODE_NUMBERS):
        assert re.fullmatch(rf"tls://{re.escape(H.host_addr(i))}:(\d+)", a), a


def test_what_the_nodes_print_reaches_the_job_output_with_the_node_name(batch_job) -> None:  # type: ignore[no-untyped-def]
    d, _, _ = batch_job
    text = (d / "out.txt").read_text()
    out = H.results(d)
    # procs of one node share its pipe; with PYTHONUNBUFFERED two of them may
    # write parts of a line in turn, so look for the marker on any line of its node.
    # A line comes either from the worker step (``[h1] ...``) or streamed to the
    # client by the proc itself (``[where{'hosts': 0/3, 'gpus': 1/4} h1] ...``).
    for host, pid in out["where"]:
        mine = "\n".join(ln for ln in text.splitlines()
                         if ln.startswith(f"[{host}] ") or re.match(rf"\[\S+\{{.*\}} {re.escape(host)}\] ", ln))
        assert f"stdout-marker {host} {pid}" in mine, text[-4000:]
        assert f"stderr-marker {host} {pid}" in mine, text[-4000:]


def test_worker_credentials_are_private_to_the_job_and_strangers_are_refused(batch_job) -> None:  # type: ignore[no-untyped-def]
    d, _, _ = batch_job
    out = H.results(d)
    # the launch files (worker keys) are removed once read, and the session directory by the last reader
    assert out["session_files"] == [], out
    assert out["sessions_after"] == [], "the session directory must be removed at release"
    assert out["no_cert"].startswith("refused"), out["no_cert"]
    assert out["other_ca"].startswith("refused"), out["other_ca"]
    assert out["after_strangers"] == 3


def test_nodes_takes_the_first_nodes_and_no_configuration_means_the_allocation(batch_job) -> None:  # type: ignore[no-untyped-def]
    d, _, _ = batch_job
    out = H.results(d)
    assert out["pair"] == [H.N1, H.N2] and out["pair_where"] == [H.N1, H.N2]
    assert out["default"] == list(H.NODES) and out["default_where"] == list(H.NODES)
    text = (d / "out.txt").read_text()
    lines = [ln for ln in text.splitlines() if "no configuration file found" in ln]
    assert len(lines) == 1 and "INFO" in lines[0] and "using its allocation" in lines[0], lines


def test_an_salloc_shell_runs_the_same_program(cluster: Any, tmp_path: Path) -> None:
    H.write_project(tmp_path, PROGRAM, SLURM_TOML)
    (tmp_path / "prog.py").write_text((tmp_path / "prog.py").read_text().replace("sys.argv[1]", '"basic"'))
    res = H.salloc(tmp_path, 3)
    assert res.returncode == 0, (tmp_path / "out.txt").read_text()[-6000:]
    out = H.results(tmp_path)
    _check_three_by_four(out, list(H.NODES))
    assert out["job"] and out["job"].isdigit()


def test_the_same_program_runs_unchanged_with_a_local_entry(tmp_path: Path) -> None:
    H.write_project(tmp_path, PROGRAM, '[hosts.trainers]\nscheduler = "local"\nhosts = 3\n')
    res = H.client(tmp_path, "basic")
    assert res.returncode == 0, res.stderr[-6000:]
    out = H.results(tmp_path)
    assert out["hosts"] == ["local0", "local1", "local2"]
    assert len(out["where"]) == 12 and len({pid for _, pid in out["where"]}) == 12


ZERO = r'''
import json, logging, os, sys
logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(levelname)s %(message)s")
from monarch_core.actor import hosts_from_config
from monarch_core.errors import ConfigError

hm = hosts_from_config("trainers")   # no configuration file anywhere above the working directory
out = {"hosts": [h.name for h in hm.hosts]}
hm.shutdown().get(timeout=60)
open("monarch.toml", "w").write('[hosts.other]\nscheduler = "local"\n')
try:                                  # a file that does not define the name: an error, not a default
    hosts_from_config("trainers")
    out["configured"] = "allocated"
except ConfigError as e:
    out["configured"] = str(e)
print(json.dumps(out))
'''


def test_without_any_configuration_outside_slurm_two_local_hosts_and_one_info_line(tmp_path: Path) -> None:
    d = tmp_path / "empty"
    H.write_project(d, ZERO, None)
    res = H.client(d)
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["hosts"] == ["local0", "local1"]
    lines = [ln for ln in res.stderr.splitlines() if "no configuration file found" in ln]
    assert len(lines) == 1, lines
    assert lines[0].startswith("LOG monarch.config INFO hosts_from_config('trainers'): no configuration file found; "
                               'using the default, two hosts on this machine (scheduler "local", hosts = 2); '
                               "define [hosts.trainers] in monarch.toml"), lines[0]
    assert "Host mesh 'trainers' is not configured in" in out["configured"], out["configured"]
