"""Bad input and bad hosts: each a clear ``AllocationError`` naming the host
within a bounded time, with the other hosts' connections closed and nothing
left running -- unreachable host, refused connection, wrong user, wrong key,
unknown and changed host keys, remote Python missing or without monarch-core
(the path tried is named), a worker crashing at start (its stderr tail in
the error), a working directory that cannot be made, one bad host among good
ones.  Real sshd (mostly h4's, the spare host: nothing else uses it); one
client interpreter tries every case, and after each the test process checks
h4 (and h1) for leftover processes and SSH sessions."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import ssh_helpers as H

#: a bound for "within a bounded time" (connect_timeout is 2 s here): a hang check, not a speed test
BOUND = 60.0

PRELUDE = r'''
import time
from monarch_core.actor import hosts_from_config

def attempt(name):
    t0 = time.monotonic()
    try:
        hm = hosts_from_config(name, timeout=90)
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}
    hm.shutdown().get(timeout=60)
    return {"type": None, "message": "allocated", "seconds": time.monotonic() - t0}
'''


def _keys(sshd: Any, d: Path) -> dict[str, Path]:
    """An unknown key pair, an empty known_hosts, and one that files h1's key under h4's names."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    stranger = d / "stranger_ed25519"
    stranger.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                           serialization.NoEncryption()))
    stranger.chmod(0o600)
    empty = d / "known_hosts-empty"
    empty.write_text("")
    h1_key = (H.SSH_DIR / "host_h1.pub").read_text().split()[:2]
    changed = d / "known_hosts-changed"
    changed.write_text(f"h4,10.250.0.14 {h1_key[0]} {h1_key[1]}\n")
    return {"stranger": stranger, "empty": empty, "changed": changed}


CASES = ["unreachable", "refused", "wrong_user", "wrong_key", "unknown_host_key", "changed_host_key",
         "no_python", "no_monarch", "worker_crash", "bad_cwd", "one_bad_host", "no_python_everywhere",
         "no_monarch_everywhere"]


@pytest.fixture(scope="module")
def outcomes(sshd: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    d = tmp_path_factory.mktemp("ssh-failures")
    tag = H.new_tag()
    keys = _keys(sshd, d)
    base = dict(connect_timeout=2)
    code_path = H.remote_pythonpath()
    entries = {
        "unreachable": H.entry(tag, d, hosts=["10.250.0.99"], **base),
        "refused": H.entry(tag, d, hosts=["h4:2"], **base),
        "wrong_user": H.entry(tag, d, hosts=["h4"], user="nobody", **base),
        "wrong_key": H.entry(tag, d, hosts=["h4"], identity_file=str(keys["stranger"]), **base),
        "unknown_host_key": H.entry(tag, d, hosts=["h4"], known_hosts=str(keys["empty"]), **base),
        "changed_host_key": H.entry(tag, d, hosts=["h4"], known_hosts=str(keys["changed"]), **base),
        "no_python": H.entry(tag, d, hosts=["h4"], python="/nonexistent/bin/python3", **base),
        "no_monarch": H.entry(tag, d, hosts=["h4"], python="/usr/bin/python3", env={}, **base),
        "worker_crash": H.entry(tag, d, hosts=["h4"], env={"PYTHONPATH": code_path,
                                                           "MONARCH_DELIVERY_TIMEOUT": "soon"}, **base),
        "bad_cwd": H.entry(tag, d, hosts=["h4"], cwd="/proc/1/no-such-dir/work", **base),
        "one_bad_host": H.entry(tag, d, hosts=["h4", "h1:2"], **base),
        # every host wrong the same way: each says so (none a bare "AssertionError:" or "connection closed")
        "no_python_everywhere": H.entry(tag, d, hosts=["h1", "h2", "h3"], python="/nonexistent/bin/python3", **base),
        "no_monarch_everywhere": H.entry(tag, d, hosts=["h1", "h2", "h3"], python="/usr/bin/python3", env={}, **base),
    }
    H.write_config(d, entries)
    listener = H.listener_pid("h4")
    baseline = len(H.sshd_sessions(4, listener))
    client = H.Client(PRELUDE, cwd=d, env={"MONARCH_CONFIG": str(d / "monarch.toml")})
    out: dict[str, dict[str, Any]] = {}
    try:
        for case in CASES:
            res = client.run(f"result = attempt({case!r})", timeout=BOUND + 60)
            # nothing left behind: no process of this test on h4/h1, no SSH session still open on h4
            res["leftover_s"] = H.wait_tagged_gone(tag, (1, 2, 3, 4), timeout=15)
            t0 = time.monotonic()
            while len(H.sshd_sessions(4, listener)) > baseline and time.monotonic() - t0 < 15:
                time.sleep(0.05)
            res["sessions_left"] = len(H.sshd_sessions(4, listener)) - baseline
            out[case] = res
    finally:
        client.close()
    return out


def _check(outcomes: dict[str, dict[str, Any]], case: str, *needles: str) -> str:
    res = outcomes[case]
    assert res["type"] == "AllocationError", json.dumps(res, indent=1)
    msg = res["message"]
    for n in needles:
        assert n in msg, f"{case}: {n!r} not in the error:\n{msg}"
    assert res["seconds"] < BOUND, f"{case}: took {res['seconds']:.1f}s"
    assert res["sessions_left"] <= 0, f"{case}: {res['sessions_left']} SSH session(s) still open on h4"
    return msg


def test_unreachable_host(outcomes: dict[str, dict[str, Any]]) -> None:
    msg = _check(outcomes, "unreachable", "host '10.250.0.99'", "10.250.0.99:22")
    assert "within 2s" in msg or "No route to host" in msg or "unreachable" in msg, msg


def test_refused_connection(outcomes: dict[str, dict[str, Any]]) -> None:
    _check(outcomes, "refused", "host 'h4:2'", "connection refused at 10.250.0.14:2", "is sshd running")


def test_wrong_user(outcomes: dict[str, dict[str, Any]]) -> None:
    _check(outcomes, "wrong_user", "host 'h4'", "authentication as user 'nobody' failed", "authorized_keys")


def test_wrong_key(outcomes: dict[str, dict[str, Any]]) -> None:
    _check(outcomes, "wrong_key", "host 'h4'", "authentication as user 'root' failed", "stranger_ed25519")


def test_unknown_host_key_is_never_accepted(outcomes: dict[str, dict[str, Any]]) -> None:
    _check(outcomes, "unknown_host_key", "host 'h4'", "not in known_hosts", "SHA256:",
           "ssh-keyscan -p 22 10.250.0.14 >>")


def test_changed_host_key(outcomes: dict[str, dict[str, Any]]) -> None:
    _check(outcomes, "changed_host_key", "host 'h4'", "HOST KEY CHANGED", "ssh-keygen -R '10.250.0.14'")


def test_remote_python_missing_names_the_path(outcomes: dict[str, dict[str, Any]]) -> None:
    _check(outcomes, "no_python", "host 'h4'", "'/nonexistent/bin/python3' was not found", "Set python = ")


def test_remote_python_without_monarch_core(outcomes: dict[str, dict[str, Any]]) -> None:
    _check(outcomes, "no_monarch", "host 'h4'", "'/usr/bin/python3'", "cannot import monarch_core.worker",
           "monarch-core is not installed", "sys.path")


def test_worker_crashing_at_start_shows_its_stderr(outcomes: dict[str, dict[str, Any]]) -> None:
    _check(outcomes, "worker_crash", "host 'h4'", "exited with status", "stderr ends with",
           "MONARCH_DELIVERY_TIMEOUT")


def test_working_directory_that_cannot_be_made(outcomes: dict[str, dict[str, Any]]) -> None:
    _check(outcomes, "bad_cwd", "host 'h4'", "/proc/1/no-such-dir/work", "cwd = ")


def test_one_bad_host_fails_the_allocation_and_closes_the_others(outcomes: dict[str, dict[str, Any]]) -> None:
    _check(outcomes, "one_bad_host", "host 'h1:2'", "connection refused", "the connections to the other 1 host were closed")


def _every_host_says(msg: str, *needles: str) -> None:
    assert "3 of 3 hosts failed" in msg, msg
    lines = [ln for ln in msg.splitlines() if ln.strip().startswith("host '")]
    assert sorted(ln.split("'")[1] for ln in lines) == ["h1", "h2", "h3"], msg
    for ln in lines:
        assert "AssertionError" not in ln and "connection closed" not in ln, f"a host without the clear message:\n{msg}"
        for n in needles:
            assert n in ln, f"{n!r} not in this host's line: {ln}\n{msg}"


def test_a_wrong_python_on_every_host_gives_every_host_the_clear_message(outcomes: dict[str, dict[str, Any]]) -> None:
    msg = _check(outcomes, "no_python_everywhere")
    _every_host_says(msg, "'/nonexistent/bin/python3' was not found", "Set python = ")


def test_a_python_without_monarch_core_on_every_host_gives_every_host_the_clear_message(
    outcomes: dict[str, dict[str, Any]]
) -> None:
    msg = _check(outcomes, "no_monarch_everywhere")
    _every_host_says(msg, "'/usr/bin/python3'", "cannot import monarch_core.worker", "set python = ")
