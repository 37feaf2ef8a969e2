"""The code that runs on a remote host before (and beside) its worker loop.

The ssh exec channel runs ``exec PYTHON -c '<stage one>' TOKEN`` (one shell
word of base64, so any login shell runs it, and the worker becomes the SSH
session's child, not a shell's; ``TOKEN`` names the allocation, not a secret).
Nothing secret is on a command line:

* **stage one** prints a ``hello`` line (pid, host name, Python, the SSH
  connection as the server saw it), reads *one* JSON line from stdin (working
  directory, environment -- the worker's TLS key and certificate among them --
  and the worker's argv), changes to the working directory and, in the same
  process, applies that environment (``PYTHONPATH`` onto ``sys.path``) and
  runs stage two: one interpreter start per host.  Only when the environment
  changes another variable the interpreter reads as it starts (``PYTHON*``,
  ``LD_*``) does it ``execve`` the same Python into stage two, so that those
  apply;
* **stage two** checks that the worker's module imports (else an ``error``
  line naming the interpreter and its ``sys.path``), starts a thread that
  reads control lines from stdin (``pythonpath``: prepend directories to
  ``PYTHONPATH`` for procs started from now on; every line is acknowledged
  with an ``ack`` line) and exits the process at once when stdin ends (the SSH
  channel is gone: the client died or dropped the connection; the procs die
  with the worker, by their parent-death signal), then runs
  ``python -m monarch_core.worker ...`` in-process (``runpy``).

Lines for the client are JSON objects with a ``"monarch_ssh"`` key, written
with one ``write`` each on stdout, where the worker's readiness line and the
procs' output also go.  Both stages run on Python 3 with the standard library
only.
"""

from __future__ import annotations

import base64
import shlex

#: Lines from the remote side start with this (JSON objects).
MARK = '{"monarch_ssh": '

STAGE_ONE = r'''
import json, os, socket, sys
def out(o):
    os.write(1, (json.dumps(o, sort_keys=False) + "\n").encode())
out({"monarch_ssh": "hello", "pid": os.getpid(), "hostname": socket.gethostname(), "python": sys.executable,
     "version": "%d.%d.%d" % tuple(sys.version_info[:3]), "ssh": os.environ.get("SSH_CONNECTION", "")})
buf = b""
while not buf.endswith(b"\n"):
    chunk = os.read(0, 65536)
    if not chunk:
        os._exit(0)
    buf += chunk
m = json.loads(buf.decode())
cwd = m.get("cwd")
if cwd:
    cwd = os.path.expanduser(cwd)
    try:
        if not os.path.isdir(cwd):
            os.makedirs(cwd)
        os.chdir(cwd)
    except OSError as e:
        out({"monarch_ssh": "error", "kind": "cwd", "cwd": cwd, "message": str(e)})
        os._exit(4)
env = dict(os.environ)
env.update(m["env"])
env.setdefault("PYTHONPATH", "")
out({"monarch_ssh": "cwd", "cwd": os.getcwd()})
startup = [k for k in set(env) | set(os.environ)
           if (k.startswith(("PYTHON", "LD_")) and k != "PYTHONPATH") and env.get(k) != os.environ.get(k)]
if not startup:
    # Nothing the interpreter reads at start-up changes but PYTHONPATH: stay in
    # this process (no second interpreter start); the PYTHONPATH entries go
    # where the interpreter would have put them, after sys.path[0].
    os.environ.clear()
    os.environ.update(env)
    new = [p for p in env["PYTHONPATH"].split(os.pathsep) if p]
    sys.path[1:1] = [os.path.abspath(p) for p in new if os.path.abspath(p) not in sys.path]
    sys.argv = ["-c", m["token"]] + m["argv"][1:]
    exec(compile(m["stage2"], "<monarch-ssh stage two>", "exec"), {"__name__": "__main__"})
    os._exit(0)
try:
    os.execve(sys.executable, [sys.executable, "-c", m["stage2"], m["token"]] + m["argv"][1:], env)
except OSError as e:
    out({"monarch_ssh": "error", "kind": "exec", "python": sys.executable, "message": str(e)})
    os._exit(5)
'''

STAGE_TWO = r'''
import json, os, sys, threading
TOKEN = sys.argv[1]
ARGV = sys.argv[2:]
def out(o):
    os.write(1, (json.dumps(o) + "\n").encode())
module = ARGV[1]
err = ""
try:
    import importlib.util
    found = importlib.util.find_spec(module) is not None
except Exception as e:
    found, err = False, "%s: %s" % (type(e).__name__, e)
if not found:
    out({"monarch_ssh": "error", "kind": "module", "module": module, "python": sys.executable,
         "version": "%d.%d.%d" % tuple(sys.version_info[:3]), "path": sys.path, "message": err})
    os._exit(3)
def control():
    buf = b""
    while True:
        try:
            chunk = os.read(0, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            os._exit(0)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                m = json.loads(line.decode())
            except ValueError:
                continue
            if m.get("op") == "pythonpath":
                cur = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
                new = list(m["paths"])
                os.environ["PYTHONPATH"] = os.pathsep.join(new + [p for p in cur if p not in new])
            out({"monarch_ssh": "ack", "token": TOKEN, "id": m.get("id")})
threading.Thread(target=control, name="monarch-ssh-control", daemon=True).start()
sys.argv = [module] + ARGV[2:]
import runpy
runpy.run_module(module, run_name="__main__", alter_sys=True)
'''

#: Stage three, separate: hash remote files for ``sync_workspace``.  Reads one
#: JSON line ``{"files": [[path, size], ...]}``; prints
#: ``{"monarch_ssh": "hashes", "hashes": {path: sha256 or null}}`` (null: missing
#: or another size).
HASHES = r'''
import hashlib, json, os, sys
buf = b""
while not buf.endswith(b"\n"):
    chunk = os.read(0, 1 << 20)
    if not chunk:
        break
    buf += chunk
req = json.loads(buf.decode())
res = {}
for path, size in req["files"]:
    try:
        if os.path.getsize(path) != size:
            res[path] = None
            continue
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        res[path] = h.hexdigest()
    except OSError:
        res[path] = None
os.write(1, (json.dumps({"monarch_ssh": "hashes", "hashes": res}) + "\n").encode())
'''


def python_c(code: str) -> str:
    """``code`` as the one argument of ``python -c`` (base64: no quoting issues)."""
    return 'import base64;exec(base64.b64decode("%s"))' % base64.b64encode(code.encode()).decode()


def remote_command(python: str, code: str, *args: str) -> str:
    """The exec channel's command: the login shell replaces itself with Python
    (``args``: its ``sys.argv[1:]``, e.g. the allocation's token, by which
    :func:`kill_command` recognises the worker)."""
    return " ".join([f"exec {shlex.quote(python)} -c {shlex.quote(python_c(code))}", *map(shlex.quote, args)])


def kill_command(pid: int, token: str) -> str:
    """Kill a worker left behind (a host lost while its link was down), only
    if that pid still is our worker (its command line holds ``token``)."""
    return (f"if grep -qa -- {shlex.quote(token)} /proc/{int(pid)}/cmdline 2>/dev/null; then "
            f"kill -KILL {int(pid)}; echo killed; else echo gone; fi")
