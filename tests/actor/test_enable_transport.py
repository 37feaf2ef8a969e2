"""``enable_transport``: the once-per-process choice of channel.

The choice is process-wide, so every scenario runs in a fresh interpreter and
reports what it saw as JSON.  Scenarios that spawn a mesh use real procs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid

import pytest

from monarch_core.actor import Actor, endpoint

from _helpers.clients import child_env

HERE = os.path.dirname(os.path.abspath(__file__))


class Probe(Actor):
    @endpoint
    def where(self) -> dict:
        from monarch_core._proc import _state

        rt = _state.current()
        return {"address": rt.kernel.address, "transport": rt.transport, "pid": os.getpid()}


def _py(code: str, timeout: float = 120) -> dict:
    env = child_env(drop=("MONARCH_DISABLED_PLUGINS",))
    prelude = f"import sys; sys.path.insert(0, {HERE!r})\n"
    res = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert res.returncode == 0, f"child failed (rc {res.returncode}):\n{res.stderr[-4000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture
def short_dir():  # type: ignore[no-untyped-def]
    """A directory with a short path (Unix socket paths are limited to 107 bytes)."""
    d = tempfile.mkdtemp(prefix="mc-et-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- accepted forms work end to end

_USE = """
import json, os, stat
from monarch_core.actor import ChannelTransport, enable_transport, this_host
from monarch_core._proc import _state
from test_enable_transport import Probe

choice = {choice}
enable_transport(choice)
enable_transport(choice)  # the same again: a no-op
pm = this_host().spawn_procs(per_host={{"gpus": 2}})
where = pm.spawn("p", Probe).where.call().get(timeout=60).values()
rt = _state.current()
client = rt.kernel.address
path = client[len("ipc://"):]
is_sock = (not path.startswith("@")) and stat.S_ISSOCK(os.stat(path).st_mode)
enable_transport(choice)  # still a no-op once the kernel uses it
try:
    enable_transport("inproc")
    other = None
except RuntimeError as e:
    other = str(e)
pm.stop().get(timeout=30)
print(json.dumps({{"client": client, "client_transport": rt.transport, "is_sock": is_sock,
                  "where": where, "other": other}}))
"""


def _check_mesh(out: dict) -> None:
    assert out["client_transport"] == "ipc"
    assert [w["transport"] for w in out["where"]] == ["ipc", "ipc"]
    assert all(w["address"].startswith("ipc://@") for w in out["where"])  # procs use their default bind
    assert len({w["pid"] for w in out["where"]}) == 2
    assert out["other"] is not None
    assert "is already enabled and it is already in use by this process's kernel" in out["other"]
    assert "only one transport can be enabled per process" in out["other"]


@pytest.mark.parametrize(
    "choice, label",
    [('"ipc"', "'ipc'"), ("ChannelTransport.Unix", "ChannelTransport.Unix"), ('"unix"', "'unix'")],
    ids=["ipc", "ChannelTransport.Unix", "unix"],
)
def test_named_ipc_transport_is_enabled_and_a_spawned_mesh_works(choice: str, label: str) -> None:
    out = _py(_USE.format(choice=choice))
    _check_mesh(out)
    assert out["client"].startswith("ipc://@")
    assert out["is_sock"] is False
    assert f"transport {label} is already enabled" in out["other"]


def test_abstract_ipc_url_is_this_process_address_and_a_spawned_mesh_works() -> None:
    name = f"mc-test-{uuid.uuid4().hex[:10]}"
    out = _py(_USE.format(choice=repr(f"ipc://@{name}")))
    _check_mesh(out)
    assert out["client"] == f"ipc://@{name}"


def test_path_ipc_url_is_this_process_socket_file_and_a_spawned_mesh_works(short_dir: str) -> None:
    path = os.path.join(short_dir, "client.sock")
    out = _py(_USE.format(choice=repr(f"ipc://{path}")))
    _check_mesh(out)
    assert out["client"] == f"ipc://{path}"
    assert out["is_sock"] is True


def test_unix_url_is_accepted_as_an_ipc_path(short_dir: str) -> None:
    path = os.path.join(short_dir, "c.sock")
    out = _py(_USE.format(choice=repr(f"unix://{path}")))
    _check_mesh(out)
    assert out["client"] == f"ipc://{path}"
    assert out["is_sock"] is True


# ---------------------------------------------------------------- once per process


def test_enabling_a_different_transport_before_use_raises_runtime_error_explaining_why() -> None:
    out = _py(
        """
        import json
        from monarch_core.actor import ChannelTransport, enable_transport
        res = {}
        enable_transport("ipc")
        enable_transport(ChannelTransport.Unix)   # same transport: no-op
        enable_transport("unix")                  # alias: no-op
        for other in ("ipc://@somewhere-else", "inproc"):
            try:
                enable_transport(other)
                res[other] = None
            except RuntimeError as e:
                res[other] = str(e)
        print(json.dumps(res))
        """
    )
    assert out["ipc://@somewhere-else"] == (
        "enable_transport('ipc://@somewhere-else'): transport 'ipc' is already enabled and it was enabled earlier; "
        "only one transport can be enabled per process. Call enable_transport() once, before any other monarch "
        "API call, in every process of the program."
    )
    assert out["inproc"].startswith("enable_transport('inproc'): transport 'ipc' is already enabled and it was enabled earlier;")


def test_implicit_ipc_at_first_use_then_enable_same_is_noop_and_different_raises() -> None:
    out = _py(
        """
        import json
        from monarch_core.actor import enable_transport, this_host
        from test_enable_transport import Probe
        pm = this_host().spawn_procs()
        where = pm.spawn("p", Probe).where.call_one().get(timeout=60)
        enable_transport("ipc")
        try:
            enable_transport("ipc://@too-late")
            err = None
        except RuntimeError as e:
            err = str(e)
        pm.stop().get(timeout=30)
        print(json.dumps({"where": where, "err": err}))
        """
    )
    assert out["where"]["transport"] == "ipc"
    assert out["err"] is not None
    assert "transport 'ipc' is already enabled and it is already in use by this process's kernel" in out["err"]


# ---------------------------------------------------------------- every accepted form

# id: (source of the value, transport it names, this process's bind spec: None = the transport's default)
_ACCEPTED = {
    "ipc": ('"ipc"', "ipc", None),
    "unix": ('"unix"', "ipc", None),
    "tcp": ('"tcp"', "tcp", None),
    "tls": ('"tls"', "tls", None),
    "ChannelTransport.Unix": ("ChannelTransport.Unix", "ipc", None),
    "ChannelTransport.TcpWithHostname": ("ChannelTransport.TcpWithHostname", "tcp", None),
    "ChannelTransport.TcpWithLocalhost": ("ChannelTransport.TcpWithLocalhost", "tcp", "tcp://127.0.0.1:0"),
    "ChannelTransport.Tls": ("ChannelTransport.Tls", "tls", None),
    "ipc-path": ('"ipc:///tmp/mc-et.sock"', "ipc", "ipc:///tmp/mc-et.sock"),
    "ipc-abstract": ('"ipc://@mc-et-name"', "ipc", "ipc://@mc-et-name"),
    "unix-path": ('"unix:///tmp/mc-et.sock"', "ipc", "ipc:///tmp/mc-et.sock"),
    "tcp-ip-port": ('"tcp://10.1.2.3:29500"', "tcp", "tcp://10.1.2.3:29500"),
    "tcp-name-port": ('"tcp://h1.example:0"', "tcp", "tcp://h1.example:0"),
    "tcp-wildcard": ('"tcp://*:29500"', "tcp", "tcp://*:29500"),
    "tcp-ipv6": ('"tcp://[::1]:29500"', "tcp", "tcp://[::1]:29500"),
    "tcp-alias": ('"tcp://10.1.2.3:29500@tcp://*:0"', "tcp", "tcp://10.1.2.3:29500@tcp://*:0"),
    "tcp-alias-v6": ('"tcp://[fe80::1]:0@tcp://[::]:0"', "tcp", "tcp://[fe80::1]:0@tcp://[::]:0"),
    "tls-ip-port": ('"tls://10.1.2.3:29501"', "tls", "tls://10.1.2.3:29501"),
    "tls-wildcard": ('"tls://*:0"', "tls", "tls://*:0"),
    "tls-ipv6": ('"tls://[::1]:0"', "tls", "tls://[::1]:0"),
    "tls-alias": ('"tls://h1.example:29501@tls://0.0.0.0:29501"', "tls", "tls://h1.example:29501@tls://0.0.0.0:29501"),
}


@pytest.fixture(scope="module")
def accepted() -> dict:
    """Every accepted value, each in a fresh choice (the module's choice is
    cleared between them; nothing is bound, so the addresses need not exist): the
    choice, whether enabling it again is a no-op, and what enabling a
    different transport then raises."""
    cases = ",\n".join(f"    {k!r}: lambda: {v[0]}" for k, v in _ACCEPTED.items())
    code = (
        "import json\n"
        "from monarch_core.actor import ChannelTransport, enable_transport\n"
        "from monarch_core._proc import _transport as T\n"
        f"cases = {{\n{cases}\n}}\n"
        "def forget_choice():\n"  # as if no transport was ever enabled in this process
        "    with T._lock:\n"
        "        T._enabled, T._in_use = None, False\n"
        "out = {}\n"
        "for key, make in cases.items():\n"
        "    forget_choice()\n"
        "    enable_transport(make())\n"
        "    c = T.enabled_choice()\n"
        "    enable_transport(make())\n"
        "    same = T.enabled_choice() is c\n"
        "    try:\n"
        "        enable_transport('inproc')\n"
        "        other = None\n"
        "    except RuntimeError as e:\n"
        "        other = str(e)\n"
        "    out[key] = [c.name, c.bind_spec, repr(c), same, other]\n"
        "print(json.dumps(out))\n"
    )
    return _py(code)


@pytest.mark.parametrize("case", list(_ACCEPTED), ids=list(_ACCEPTED))
def test_every_accepted_form_is_enabled_once_and_a_different_one_then_raises(accepted: dict, case: str) -> None:
    src, name, bind = _ACCEPTED[case]
    got_name, got_bind, label, same, other = accepted[case]
    assert (got_name, got_bind) == (name, bind)
    assert label == (src if src.startswith("ChannelTransport.") else repr(eval(src)))  # noqa: S307 - our literal
    assert same is True, "enabling the same value again changed the choice"
    assert other == (
        f"enable_transport('inproc'): transport {label} is already enabled and it was enabled earlier; only one "
        "transport can be enabled per process. Call enable_transport() once, before any other monarch API call, "
        "in every process of the program."
    )


@pytest.mark.parametrize(
    "first, second, same",
    [
        ('"tcp"', "ChannelTransport.TcpWithHostname", True),
        ('"tls"', "ChannelTransport.Tls", True),
        ('"unix"', '"ipc"', True),
        ('"tcp://127.0.0.1:0"', "ChannelTransport.TcpWithLocalhost", True),
        ('"unix:///tmp/mc-et.sock"', '"ipc:///tmp/mc-et.sock"', True),
        ('"tcp"', "ChannelTransport.TcpWithLocalhost", False),
        ('"tcp"', '"tls"', False),
        ('"tcp://127.0.0.1:1"', '"tcp://127.0.0.1:2"', False),
        ('"tcp://h1:0"', '"tcp://h1:0@tcp://*:0"', False),
        ('"tls://h1:0"', '"tcp://h1:0"', False),
        ('"ipc"', '"tcp"', False),
    ],
)
def test_equivalent_spellings_are_one_choice_and_others_raise(first: str, second: str, same: bool) -> None:
    out = _py(
        f"""
        import json
        from monarch_core.actor import ChannelTransport, enable_transport
        enable_transport({first})
        try:
            enable_transport({second})
            out = None
        except RuntimeError as e:
            out = str(e)
        print(json.dumps(out))
        """
    )
    if same:
        assert out is None
    else:
        assert out is not None and "is already enabled and it was enabled earlier" in out, out


# ---------------------------------------------------------------- rejected values

TCP_FORMS = "tcp://host:port, tcp://*:port, tcp://[::1]:port, tcp://PUBLIC:PORT@tcp://BIND:PORT"
TLS_FORMS = "tls://host:port, tls://*:port, tls://[::1]:port, tls://PUBLIC:PORT@tls://BIND:PORT"
INSTALLED = "Installed transports: ['inproc', 'ipc', 'tcp', 'tls'] (URL schemes: ['inproc', 'ipc', 'tcp', 'tls'])."

_REJECTS = {
    # malformed URLs: ValueError naming the accepted forms
    "relative-ipc-path": ('"ipc://relative/sock"', "ValueError", ["the path must be absolute", "ipc:///absolute/path/to/socket or ipc://@abstract-name"]),
    "empty-abstract-name": ('"ipc://@"', "ValueError", ["the abstract name is empty", "ipc://@abstract-name"]),
    "too-long-ipc-path": ('"ipc:///" + "x" * 200', "ValueError", ["is too long", "Unix allows 107"]),
    "empty-scheme": ('"://host:1"', "ValueError", ["malformed transport URL", "ipc:///path, ipc://@abstract-name, tcp://host:port"]),
    "bad-scheme-chars": ('"i p c://x"', "ValueError", ["malformed transport URL", "tcp://PUBLIC:PORT@tcp://BIND:PORT"]),
    "missing-slashes": ('"ipc:/tmp/x"', "ValueError", ["a URL needs a scheme", "ipc:///path"]),
    "host-port-without-scheme": ('"127.0.0.1:29500"', "ValueError", ["a URL needs a scheme, e.g. 'tcp://host:port'"]),
    "empty-string": ('""', "ValueError", ["expected a name", "ipc://@abstract-name"]),
    "tcp-no-port": ('"tcp://h1"', "ValueError", [f"malformed tcp address 'tcp://h1'; accepted forms: {TCP_FORMS}"]),
    "tcp-no-host": ('"tcp://:29500"', "ValueError", ["tcp address 'tcp://:29500' has no host; use '*' for every interface"]),
    "tcp-port-range": ('"tcp://h1:65536"', "ValueError", ["tcp address 'tcp://h1:65536': port 65536 is out of range (0-65535)"]),
    "tcp-port-not-number": ('"tcp://h1:http"', "ValueError", [f"accepted forms: {TCP_FORMS}"]),
    "tcp-bad-ipv6": ('"tcp://[::zz]:1"', "ValueError", ["tcp address 'tcp://[::zz]:1': '::zz' is not an IPv6 address"]),
    "tcp-unbracketed-ipv6": ('"tcp://::1:29500"', "ValueError", [f"accepted forms: {TCP_FORMS}"]),
    "tcp-path": ('"tcp://h1:29500/x"', "ValueError", [f"accepted forms: {TCP_FORMS}"]),
    "tcp-alias-other-scheme": ('"tcp://h1:0@tls://*:0"', "ValueError", ["malformed tcp alias address", "expected tcp://PUBLIC:PORT@tcp://BIND:PORT"]),
    "tcp-alias-wildcard-public": ('"tcp://*:0@tcp://*:0"', "ValueError", ["the advertised (left) host cannot be '*'"]),
    "tls-no-port": ('"tls://h1"', "ValueError", [f"malformed tls address 'tls://h1'; accepted forms: {TLS_FORMS}"]),
    "tls-alias-bind-no-port": ('"tls://h1:0@tls://*"', "ValueError", [f"accepted forms: {TLS_FORMS}"]),
    # unknown schemes / names: UnknownTransportError (a ValueError too) naming what is installed and what to install
    "unknown-scheme": ('"quic://x:1"', "UnknownTransportError", ["transport 'quic'", INSTALLED, "Check the spelling"]),
    "unknown-name": ('"carrier-pigeon"', "UnknownTransportError", ["transport 'carrier-pigeon'", INSTALLED]),
    "rdma-scheme": ('"rdma://h1:0"', "UnknownTransportError", ["transport 'rdma'", INSTALLED, "'rdma' is not a transport", "monarch_core.rdma.RDMABuffer"]),
    "rdma-name": ('"rdma"', "UnknownTransportError", ["'rdma' is not a transport: RDMA is monarch-core's data plane", "pip install ./plugins/transport_rdma"]),
    "ChannelTransport.MetaTlsWithIpV6": ("ChannelTransport.MetaTlsWithIpV6", "UnknownTransportError", ["Meta's internal TLS", "Use 'tls'"]),
    "ChannelTransport.MetaTlsWithHostname": ("ChannelTransport.MetaTlsWithHostname", "UnknownTransportError", ["Meta's internal TLS", "Use 'tls'"]),
    "metatls-url": ('"metatls://h1:0"', "UnknownTransportError", ["transport 'metatls'", INSTALLED]),
    # not a string or ChannelTransport: TypeError
    "int": ("5", "TypeError", ["takes a ChannelTransport, a name such as 'ipc' or 'tcp', or a URL", "got int"]),
    "none": ("None", "TypeError", ["got NoneType"]),
    "bytes": ('b"ipc"', "TypeError", ["got bytes"]),
    "list": ('["ipc"]', "TypeError", ["got list"]),
}


@pytest.fixture(scope="module")
def rejected() -> dict:
    """Every rejected value tried in one fresh process, then a valid choice
    (a rejected call must leave the process free to choose)."""
    cases = ",\n".join(f"    {k!r}: lambda: {v[0]}" for k, v in _REJECTS.items())
    code = (
        "import json\n"
        "from monarch_core.actor import ChannelTransport, enable_transport, this_host\n"
        "from test_enable_transport import Probe\n"
        f"cases = {{\n{cases}\n}}\n"
        "out = {}\n"
        "for key, make in cases.items():\n"
        "    try:\n"
        "        enable_transport(make())\n"
        "        out[key] = ['accepted', '', []]\n"
        "    except Exception as e:\n"
        "        out[key] = [type(e).__name__, str(e), [c.__name__ for c in type(e).__mro__]]\n"
        "enable_transport('ipc')\n"
        "pm = this_host().spawn_procs()\n"
        "out['__after__'] = pm.spawn('p', Probe).where.call_one().get(timeout=60)['transport']\n"
        "pm.stop().get(timeout=30)\n"
        "print(json.dumps(out))\n"
    )
    return _py(code)


@pytest.mark.parametrize("case", list(_REJECTS), ids=list(_REJECTS))
def test_rejected_transport_values_raise_the_documented_error_naming_the_problem(rejected: dict, case: str) -> None:
    _src, exc_name, fragments = _REJECTS[case]
    got_name, message, mro = rejected[case]
    assert got_name == exc_name, f"{case}: got {got_name}: {message}"
    for f in fragments:
        assert f in message, f"{case}: {f!r} not in {message!r}"
    if exc_name == "UnknownTransportError":
        assert "ValueError" in mro and "PluginError" in mro


def test_a_rejected_value_leaves_the_choice_open(rejected: dict) -> None:
    assert rejected["__after__"] == "ipc"
