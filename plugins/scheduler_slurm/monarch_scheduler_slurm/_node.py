"""The task of the worker step on each node:
``python -m monarch_scheduler_slurm._node SESSION_DIR [--signal USR2]``.

Standard library only (it starts before anything else on the node).  It

1. prints ``@@monarch-slurm hello NODE STEP PID`` (the client learns which
   ``srun --label`` task is which node);
2. reads its launch file ``SESSION_DIR/NODE.json`` (mode 0600, in the 0700
   session directory the client made on the shared filesystem: the worker's
   command line and its TLS key and certificate, issued for this node
   alone) and removes it at once -- no secret on a command line, in the job's
   environment (which slurmctld stores), or left on disk; the last node to
   read its file removes the emptied directory (a client killed outright
   leaves nothing behind);
3. starts the worker loop as its child with those credentials in the
   child's environment, ``PYTHONUNBUFFERED=1``, its standard streams the
   step's (so everything it and its procs print reaches the client, labelled)
   and the warning signal *ignored* (inherited by the procs: Slurm signals
   every process of the step, and a proc must not die of the warning);
4. on the warning signal (``--signal``: Slurm's ``--signal=SIG@SECONDS``)
   prints ``@@monarch-slurm notice NODE SIG`` once -- the client turns it
   into a notice for the host mesh's owner;
5. when the worker loop exits, prints ``@@monarch-slurm exit NODE RC`` and
   exits with its code; SIGTERM/SIGINT are passed on to it.

A missing launch file (a ``state_dir`` that is not shared with the node)
ends it with ``@@monarch-slurm error NODE MESSAGE`` and exit code 2.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

MARK = "@@monarch-slurm "
#: Seconds to wait for the launch file (a shared filesystem may show a new
#: file on another node a little late).
FILE_WAIT = 30.0


def say(*words: object) -> None:
    sys.stdout.write(MARK + " ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def _read_launch(path: str, node: str) -> dict:
    deadline = time.monotonic() + FILE_WAIT
    delay = 0.005
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"no launch file {path} on {node} after {FILE_WAIT:.0f}s: the slurm scheduler's state_dir must "
                    "be on a filesystem every node shares (set state_dir in the [hosts] entry)"
                ) from None
            time.sleep(delay)
            delay = min(0.1, delay * 2)
            continue
        try:
            os.unlink(path)
            os.rmdir(os.path.dirname(path))  # the last node to read removes the (then empty) session directory
        except OSError:
            pass
        return data


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--signal"):
        print("usage: python -m monarch_scheduler_slurm._node SESSION_DIR [--signal SIGNAME]", file=sys.stderr)
        return 2
    session = argv[0]
    warn = getattr(signal, "SIG" + argv[2]) if len(argv) == 3 else None
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    say("hello", node, os.environ.get("SLURM_STEP_ID", "?"), os.getpid())
    warned = []
    child: list[subprocess.Popen] = []

    def on_warning(signum: int, frame: object) -> None:
        if not warned:
            warned.append(signum)
            say("notice", node, signal.Signals(signum).name)

    def on_end(signum: int, frame: object) -> None:
        if child and child[0].poll() is None:
            child[0].send_signal(signum)
        else:
            sys.exit(128 + signum)

    if warn is not None:
        signal.signal(warn, on_warning)
    signal.signal(signal.SIGTERM, on_end)
    signal.signal(signal.SIGINT, on_end)
    try:
        data = _read_launch(os.path.join(session, f"{node}.json"), node)
    except (RuntimeError, OSError, ValueError) as e:
        say("error", node, str(e).replace("\n", " "))
        return 2
    env = dict(os.environ)
    env.update(data["env"])
    env["PYTHONUNBUFFERED"] = "1"

    def ignore_warning() -> None:  # in the child: ignored dispositions survive exec
        if warn is not None:
            signal.signal(warn, signal.SIG_IGN)

    try:
        child.append(subprocess.Popen(data["argv"], env=env, stdin=subprocess.DEVNULL, preexec_fn=ignore_warning))
    except OSError as e:
        say("error", node, f"cannot start the worker loop {data['argv'][:3]}: {e}")
        return 2
    del data, env
    rc = child[0].wait()
    say("exit", node, rc)
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
