"""The ``ipc`` transport serves processes of its own user only.

Abstract Unix sockets have no permission check and their names are listed in
``/proc/net/unix``; a kernel refuses a Unix-socket peer of another uid
(``SO_PEERCRED``) before it reads a byte, with one WARNING per uid and
``MONARCH_DROP_LOG_INTERVAL``.  Each test attacks a real job (a worker loop,
a client and its procs, all running as root) from a real second local user.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

from _helpers.clients import LineReader
from _helpers.procs import kill_tree
from _helpers.transport import WorkerSet

from security_helpers import PY, OtherUser, run_as, security_env

WARNING = re.compile(r"refused a connection to (\S+) from a process of uid (\d+)")

ATTACH_AND_SPAWN = """
from monarch_core.worker import attach_to_workers
from attack_actors import Intruder
try:
    hosts = attach_to_workers([{address!r}], timeout=8)
    pm = hosts.spawn_procs(per_host={{"gpus": 1}})
    a = pm.spawn("intruder", Intruder, {marker!r})
    report(outcome="ran", uid=a.whoami.call().get(timeout=20).values())
except BaseException as e:
    report(outcome="refused", error=f"{{type(e).__name__}}: {{e}}"[:500])
os._exit(0)
"""

#: Connect straight to abstract sockets (names from /proc/net/unix), send a
#: valid handshake, and see whether anything comes back.
PROBE = """
import select
names = {names!r}
hello = _wire.encode_handshake({{"session": uuid.uuid4().hex, "proc": "intruder", "address": "ipc://@nowhere"}})
got = {{}}
for name in names:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect("\\0" + name[1:])
        try:
            s.sendall(hello)
        except OSError:
            pass
        data = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                chunk = b""
            if not chunk:
                got[name] = {{"answered": len(data), "closed": True}}
                break
            data += chunk
            if len(data) >= 4:  # an answer: the handshake reply
                got[name] = {{"answered": len(data), "closed": False}}
                break
        else:
            got[name] = {{"answered": len(data), "closed": False}}
    except OSError as e:
        got[name] = {{"error": str(e)}}
    finally:
        s.close()
report(got=got)
"""


def abstract_listeners(pids: list[int]) -> dict[int, list[str]]:
    """The abstract names each of ``pids`` listens on, as another user sees
    them: ``/proc/net/unix`` (listening sockets: flag ``__SO_ACCEPTCON``),
    matched to processes by socket inode."""
    by_inode = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[7].startswith("@monarch-") and int(f[3], 16) & 0x10000:
            by_inode[f[6]] = f[7]
    out: dict[int, list[str]] = {}
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            m = re.fullmatch(r"socket:\[(\d+)\]", link)
            if m and m.group(1) in by_inode:
                out.setdefault(pid, []).append(by_inode[m.group(1)])
    return out


def test_another_user_cannot_attach_to_a_worker_loop_and_spawn(other_user: OtherUser, shared_tmp: Path) -> None:
    address = f"ipc://@monarch-worker-{uuid.uuid4().hex[:12]}"
    ws = WorkerSet()
    try:
        w = ws.start(address, env={**security_env({"MONARCH_DROP_LOG_INTERVAL": "600"}), "MONARCH_FORK_SERVER": "0"})
        marker = shared_tmp / "marker"
        attempts = [run_as(other_user, ATTACH_AND_SPAWN.format(address=address, marker=str(marker)))
                    for _ in range(2)]
        for got in attempts:
            assert got.get("outcome") == "refused", got
        assert not marker.exists(), f"the attack ran code as uid {marker.read_text()}"
        warnings = [(a, int(u)) for a, u in WARNING.findall(w.output())]
        assert warnings == [(address, other_user.uid)], w.output()[-3000:]
    finally:
        ws.close()


JOB = """
import sys
from monarch_core.actor import this_host
from attack_actors import Pid
pm = this_host().spawn_procs(per_host={"gpus": 2})
print("READY", *pm.spawn("pid", Pid).pid.call().get(timeout=60).values(), flush=True)
sys.stdin.readline()
"""


def test_another_user_cannot_talk_to_a_client_or_its_procs(other_user: OtherUser) -> None:
    job = subprocess.Popen([PY, "-c", JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, env=security_env({"MONARCH_DROP_LOG_INTERVAL": "600"}), cwd="/")
    out, err = LineReader(job.stdout, "job-out"), LineReader(job.stderr, "job-err")
    try:
        i, _ = out.wait_for(lambda line: line.startswith("READY"), 90)
        pids = [job.pid, *map(int, out.lines[i].split()[1:])]
        listening = abstract_listeners(pids)
        assert sorted(listening) == sorted(pids) and all(len(v) == 1 for v in listening.values()), listening
        names = [v[0] for v in listening.values()]
        client = listening[job.pid]
        got = run_as(other_user, PROBE.format(names=names))["got"]
        for name in names:
            assert got[name] == {"answered": 0, "closed": True}, (name, got)
        job.stdin.write("\n")
        job.stdin.flush()
        job.wait(60)
        warned = [(a, int(u)) for a, u in WARNING.findall(err.text())]
        # the client logs its own refusal; procs log theirs to the client's terminal too (direct output)
        assert (f"ipc://{client[0]}", other_user.uid) in warned, err.text()[-3000:]
        assert all(u == other_user.uid for _, u in warned)
        assert len(warned) == len(names), err.text()[-3000:]  # one line per listener (one connection each)
    finally:
        kill_tree(job)
