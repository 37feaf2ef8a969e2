"""Worker loops started with a service id (``ID@tcp://...``, the reference's
``new_service_proc_id()``): attaching by ``ID@address`` reaches that worker
loop, refuses one started with another id, and ``run_worker_loop_until_shutdown``
returns once its host mesh shuts it down."""

from __future__ import annotations

import subprocess

from _helpers.transport import LISTENING, PY, LineReader, child_env, free_port, kill_tree, run_client

WORKER = """
from monarch_core.actor import run_worker_loop_until_shutdown
run_worker_loop_until_shutdown({address!r})
print("RETURNED", flush=True)
"""

CLIENT = """
import json, os
from monarch_core.actor import Actor, endpoint, enable_transport
from monarch_core.errors import ConnectError
from monarch_core.worker import attach_to_workers

class Hello(Actor):
    @endpoint
    def doit(self) -> str:
        return "hello!"

enable_transport("tcp://127.0.0.1:0")
out = {{}}
try:
    attach_to_workers([{wrong!r}], timeout=30)
    out["wrong"] = None
except ConnectError as e:
    out["wrong"] = str(e)
hosts = attach_to_workers([{right!r}], timeout=30)
out["values"] = list(hosts.spawn_procs().spawn("hello", Hello).doit.call().get(timeout=60).values())
hosts.shutdown().get(timeout=60)
print(json.dumps(out), flush=True)
os._exit(0)
"""


def test_a_worker_loop_started_with_a_service_id_is_attached_by_it_and_returns_at_shutdown() -> None:
    from monarch_core.job import new_service_proc_id

    sid, other = new_service_proc_id(), new_service_proc_id()
    assert sid != other and sid.startswith("service-") and "@" not in sid and ":" not in sid
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    popen = subprocess.Popen([PY, "-c", WORKER.format(address=f"{sid}@{address}")], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd="/",
                             start_new_session=True)
    out = LineReader(popen.stdout, "service-worker")
    try:
        _, m = out.wait_for(LISTENING.match, 60)
        assert m.group(1) == address  # it serves at the address; the id is what it tells attachers
        got = run_client(CLIENT.format(wrong=f"{other}@{address}", right=f"{sid}@{address}"))
        assert got["values"] == ["hello!"], got
        assert got["wrong"] is not None and f"the worker loop at {address} is service {sid}, not {other}" in got["wrong"]
        assert popen.wait(timeout=60) == 0, out.text()  # the loop returned once its host mesh shut it down
        out.join(5)
        assert "RETURNED" in out.text(), out.text()
    finally:
        kill_tree(popen)
