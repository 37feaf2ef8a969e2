"""The SSH documentation is true: every ``scheduler = "ssh"`` TOML example of
docs/ssh.md, docs/configuration.md and the plugin's README passes the
scheduler's own validation (the files it names replaced by real ones), the
full example lists exactly the keys the scheduler accepts, and the quick
start's Python runs against the testbed's hosts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


import ssh_helpers as H
from _helpers import clients as _clients

REPO = Path(__file__).resolve().parents[3]
DOCS = [REPO / "docs" / "ssh.md", REPO / "docs" / "configuration.md", REPO / "plugins" / "scheduler_ssh" / "README.md"]


def _ssh_entries() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for doc in DOCS:
        for block in re.findall(r"```toml\n(.*?)```", doc.read_text(), re.S):
            for name, entry in tomllib.loads(block).get("hosts", {}).items():
                if entry.get("scheduler") == "ssh":
                    out.append((doc.name, name, entry))
    return out


def test_every_ssh_toml_example_is_valid(tmp_path: Path) -> None:
    from monarch_core.hookspecs import AllocationRequest
    from monarch_scheduler_ssh._scheduler import SSHScheduler

    entries = _ssh_entries()
    assert len(entries) >= 4, entries
    real = tmp_path / "a-file"
    real.write_text("node1\n")
    for doc, name, entry in entries:
        params = {k: v for k, v in entry.items() if k != "scheduler"}
        for key in ("identity_file", "known_hosts", "ssh_config"):  # files of the reader's machine
            if isinstance(params.get(key), str):
                params[key] = str(real)
            elif isinstance(params.get(key), list):
                params[key] = [str(real)] * len(params[key])
        if isinstance(params.get("hosts"), str):
            params["hosts"] = str(real)
        SSHScheduler().validate(AllocationRequest(name, params, f"{doc} [hosts.{name}]"))


def test_the_full_example_lists_every_key() -> None:
    from monarch_scheduler_ssh._params import PARAMS

    text = (REPO / "docs" / "ssh.md").read_text()
    full = text[text.index("## Configuration"):]
    block = re.search(r"```toml\n(.*?)```", full, re.S).group(1)
    keys = set(tomllib.loads(block)["hosts"]["lab"]) - {"scheduler"}
    assert keys == set(PARAMS), f"documented but not accepted: {keys - PARAMS}; accepted, undocumented: {PARAMS - keys}"


def test_the_quick_start_runs_on_the_testbed(sshd: Any, tmp_path: Path) -> None:
    text = (REPO / "docs" / "ssh.md").read_text()
    quick = text[text.index("## Quick start"):text.index("## Configuration")]
    code = re.search(r"```python\n(.*?)```", quick, re.S).group(1)
    tag = H.new_tag()
    H.write_config(tmp_path, {"lab": H.entry(tag, tmp_path, hosts=["h1", "h2"], cwd=str(tmp_path / "r" / "{host}"))})
    (tmp_path / "src" / "mypkg").mkdir(parents=True)
    (tmp_path / "src" / "mypkg" / "__init__.py").write_text("")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd=str(tmp_path),
                         env=_clients.child_env({"MONARCH_CONFIG": str(tmp_path / "monarch.toml")},
                                                drop=("MONARCH_",)), check=False)
    assert res.returncode == 0, _clients.describe(res)
    assert re.search(r"\bh1\b.*hostname=h1", res.stdout) and re.search(r"\bh2\b.*hostname=h2", res.stdout), res.stdout
    assert "['h1', 'h1', 'h2', 'h2']" in res.stdout, res.stdout
    for h in ("h1", "h2"):
        assert (tmp_path / "r" / h / "src" / "mypkg" / "__init__.py").exists()  # src: a root of code
    H.wait_tagged_gone(tag, (1, 2), timeout=15)
