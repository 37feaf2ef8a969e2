"""The ``[hosts.<name>]`` parameters of ``scheduler = "ssh"`` and their
resolution with ``~/.ssh/config`` (no network: paramiko parses a real
ssh_config file, nothing connects)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monarch_core.errors import AllocationError, ConfigError
from monarch_core.hookspecs import AllocationRequest

from monarch_scheduler_ssh._params import PARAMS, HostEntry, parse
from monarch_scheduler_ssh._scheduler import SSHScheduler

SRC = "/x/monarch.toml [hosts.lab]"


def _err(params: dict, *needles: str) -> str:
    with pytest.raises(ConfigError) as ei:
        SSHScheduler().validate(AllocationRequest("lab", params, SRC))
    msg = str(ei.value)
    assert SRC in msg, msg
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


def test_host_entries_user_host_port_ipv6_and_ranges() -> None:
    p = parse({"hosts": ["a", "bob@b:2222", "c:23", "[fe80::1]:2200", "alice@[::2]", "::1", "n[1-3,7]", "u@g[01-02]:9"]},
              SRC)
    assert p.hosts == (
        HostEntry("a", "a"),
        HostEntry("b:2222", "b", "bob", 2222),
        HostEntry("c:23", "c", None, 23),
        HostEntry("[fe80::1]:2200", "fe80::1", None, 2200),
        HostEntry("::2", "::2", "alice", None),
        HostEntry("::1", "::1"),
        HostEntry("n1", "n1"), HostEntry("n2", "n2"), HostEntry("n3", "n3"), HostEntry("n7", "n7"),
        HostEntry("g01:9", "g01", "u", 9), HostEntry("g02:9", "g02", "u", 9),
    )


def test_duplicate_hosts_are_named() -> None:
    _err({"hosts": ["a", "root@a", "b"]}, "'hosts' names ['a'] more than once")


def test_a_hostfile_is_read_with_comments_and_mpi_style_extras(tmp_path: Path) -> None:
    f = tmp_path / "hosts.txt"
    f.write_text("# lab machines\nnode1 slots=8\n\n  alice@node2:2222   # the other one\nnode[3-4]\n")
    p = parse({"hosts": str(f)}, SRC)
    assert [h.name for h in p.hosts] == ["node1", "node2:2222", "node3", "node4"]
    assert p.hosts[1].user == "alice"
    _err({"hosts": str(tmp_path / "missing.txt")}, "names a hostfile", "missing.txt", "cannot be read")
    (tmp_path / "empty.txt").write_text("# nothing\n")
    _err({"hosts": str(tmp_path / "empty.txt")}, "names no host")


@pytest.mark.parametrize(
    ("params", "needles"),
    [
        ({}, ("needs 'hosts'", 'scheduler = "ssh"')),
        ({"hosts": []}, ("'hosts' must be a non-empty list",)),
        ({"hosts": [1]}, ("'hosts' must be",)),
        ({"hosts": ["a b"]}, ("is not a host", "user@host:port")),
        ({"hosts": ["a:99999"]}, ("is not a host",)),
        ({"hosts": ["n[3-1]"]}, ("not a host or a host range",)),
        ({"hosts": ["a"], "port": 0}, ("'port' must be a TCP port number",)),
        ({"hosts": ["a"], "port": True}, ("'port' must be",)),
        ({"hosts": ["a"], "user": ""}, ("'user' must be a non-empty string",)),
        ({"hosts": ["a"], "env": {"A": 1}}, ("'env' must be a table of strings",)),
        ({"hosts": ["a"], "env": {"A=B": "1"}}, ("'env' has names or values",)),
        ({"hosts": ["a"], "connect_timeout": 0}, ("'connect_timeout' must be a number of seconds >= 0.1",)),
        ({"hosts": ["a"], "connect_timeout": "5"}, ("'connect_timeout' must be",)),
        ({"hosts": ["a"], "keepalive_count": 1.5}, ("'keepalive_count' must be an integer",)),
        ({"hosts": ["a"], "identity_file": "/nonexistent/key"}, ("'identity_file' names '/nonexistent/key'",)),
        ({"hosts": ["a"], "known_hosts": ["/nonexistent/kh"]}, ("'known_hosts' names",)),
        ({"hosts": ["a"], "ssh_config": "/nonexistent/cfg"}, ("'ssh_config' names",)),
        ({"hosts": ["a"], "insecure_tcp": "yes"}, ("'insecure_tcp' must be true or false",)),
        ({"hosts": ["a"], "worker_host": "{nope}"}, ("'worker_host' must be a host name",)),
        ({"hosts": ["a"], "client_address": "ipc://x"}, ("'client_address' must be an address",)),
        ({"hosts": ["a"], "partition": "gpu"}, ("unknown parameter(s) ['partition']", "it accepts")),
    ],
)
def test_bad_parameters_are_config_errors_naming_the_key(params: dict, needles: tuple) -> None:
    _err(params, *needles)


def test_the_declared_params_are_the_ones_parsed() -> None:
    assert SSHScheduler.params == PARAMS
    assert SSHScheduler.transport == "tls"


def _cfg(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "ssh_config"
    p.write_text(textwrap.dedent(text))
    return p


def test_ssh_config_aliases_and_precedence(tmp_path: Path) -> None:
    from monarch_scheduler_ssh import _connect

    key = tmp_path / "id_test"
    key.write_text("not really a key")
    kh = tmp_path / "kh"
    kh.write_text("")
    cfg = _cfg(tmp_path, f"""
        Host gpu*
          HostName %h.example.org
          User carol
          Port 2200
          IdentityFile {key}
          UserKnownHostsFile {kh}
          ServerAliveInterval 7
          ServerAliveCountMax 2
          SetEnv RT_A=1 "RT_B=two words"
        Host bastion
          HostName 192.0.2.1
          User jump
        Host inner
          HostName 10.0.0.5
          ProxyJump bastion,alice@mid:2022
        Host weird
          ProxyCommand nc %h %p
        Host *
          User fallback
    """)
    p = parse({"hosts": ["gpu1", "dave@gpu2:22", "inner", "plain"], "ssh_config": str(cfg)}, SRC)
    c = _connect.load_ssh_config(p)
    t1, t2, t3, t4 = (_connect.resolve(e, p, c) for e in p.hosts)
    assert (t1.hostname, t1.user, t1.port, t1.identity_files, t1.known_hosts) == (
        "gpu1.example.org", "carol", 2200, (str(key),), (str(kh),))
    assert (t1.keepalive_interval, t1.keepalive_count) == (7.0, 2)
    assert dict(t1.set_env) == {"RT_A": "1", "RT_B": "two words"}
    assert (t2.user, t2.port) == ("dave", 22)  # the entry wins over ssh_config
    assert t3.hostname == "10.0.0.5" and [(j.name, j.hostname, j.user, j.port) for j in t3.jumps] == [
        ("bastion", "192.0.2.1", "jump", 22), ("mid:2022", "mid", "alice", 2022)]
    assert "via bastion -> mid:2022" in t3.where
    assert (t4.hostname, t4.user, t4.port) == ("plain", "fallback", 22)
    assert (t4.keepalive_interval, t4.keepalive_count) == (5.0, 6)  # the defaults
    # parameters win over ssh_config, and reach jump hosts only for keys and known_hosts
    p2 = parse({"hosts": ["inner"], "ssh_config": str(cfg), "user": "erin", "port": 2999, "keepalive_interval": 1,
                "proxy_jump": "none"}, SRC)
    t = _connect.resolve(p2.hosts[0], p2, _connect.load_ssh_config(p2))
    assert (t.user, t.port, t.jumps, t.keepalive_interval) == ("erin", 2999, (), 1.0)
    p3 = parse({"hosts": ["weird"], "ssh_config": str(cfg)}, SRC)
    with pytest.raises(AllocationError, match="ProxyCommand.*use ProxyJump"):
        _connect.resolve(p3.hosts[0], p3, _connect.load_ssh_config(p3))
    p4 = parse({"hosts": ["gpu1"], "ssh_config": False}, SRC)
    assert _connect.load_ssh_config(p4) is None


def test_client_address_from_the_config_or_the_route_to_the_first_host(tmp_path: Path) -> None:
    s = SSHScheduler()
    assert s.client_address(AllocationRequest("lab", {"hosts": ["a"], "client_address": "10.1.2.3"}, SRC)) == \
        "tls://10.1.2.3:0"
    assert s.client_address(AllocationRequest("lab", {"hosts": ["a"], "client_address": "fe80::5"}, SRC)) == \
        "tls://[fe80::5]:0"
    assert s.client_address(AllocationRequest("lab", {"hosts": ["a"], "client_address": "tls://h:7"}, SRC)) == "tls://h:7"
    # no setting: the local end of this machine's route to the first host (loopback here)
    req = AllocationRequest("lab", {"hosts": ["127.0.0.1:2222"], "ssh_config": False}, SRC)
    assert s.client_address(req) == "tls://127.0.0.1:0"
    bad = AllocationRequest("lab", {"hosts": ["no-such-host.invalid"], "ssh_config": False}, SRC)
    with pytest.raises(AllocationError, match="cannot resolve host 'no-such-host.invalid'.*client_address"):
        s.client_address(bad)


def test_importing_the_plugin_and_validating_do_not_import_paramiko() -> None:
    code = (
        "import sys\n"
        "from monarch_core._plugins import registry\n"
        "from monarch_core.hookspecs import AllocationRequest\n"
        "s = registry().scheduler('ssh')\n"
        "s.validate(AllocationRequest('lab', {'hosts': ['a', 'b[1-2]']}, '<t>'))\n"
        "print(sorted(m for m in ('paramiko', 'tqdm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
