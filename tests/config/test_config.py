"""Tests for monarch_core._config: discovery, parsing, defaults and errors."""

from __future__ import annotations

import os
import pathlib
import textwrap

import pytest

from monarch_core._plugins import KNOWN_SCHEDULER_PACKAGES, install_hint
from monarch_core._config import (
    ConfigError,
    HostMeshConfig,
    find_config_file,
    load_config,
    lookup_host_mesh,
)

pytestmark = pytest.mark.unit

INSTALLED = ("local",)


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """No MONARCH_CONFIG from the outer environment; cwd inside tmp_path."""
    monkeypatch.delenv("MONARCH_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)


def _nothing_above(tmp_path: pathlib.Path) -> None:
    """Skip if a config file outside the test's tmp dir would be discovered."""
    if find_config_file(tmp_path) is not None:
        pytest.skip("a Monarch config exists above the test's tmp_path")


# ---------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------


def test_monarch_toml_in_cwd(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    assert find_config_file() == cfg
    assert find_config_file().is_absolute()


def test_monarch_toml_beats_pyproject_in_same_dir(tmp_path: pathlib.Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.monarch.hosts.a]\nscheduler = "p"\n')
    cfg = write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    assert find_config_file() == cfg
    assert lookup_host_mesh("a", installed_schedulers=INSTALLED).scheduler == "local"


def test_pyproject_with_tool_monarch_used(tmp_path: pathlib.Path) -> None:
    cfg = write(
        tmp_path / "pyproject.toml",
        """
        [project]
        name = "x"

        [tool.monarch.hosts.a]
        scheduler = "local"
        hosts = 3
        """,
    )
    assert find_config_file() == cfg
    m = lookup_host_mesh("a", installed_schedulers=INSTALLED)
    assert m == HostMeshConfig(
        name="a",
        scheduler="local",
        params={"hosts": 3},
        source=f"{cfg} [tool.monarch.hosts.a]",
    )


def test_pyproject_dotted_tool_monarch_key_counts(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "pyproject.toml", '[tool]\nmonarch.hosts.a.scheduler = "local"\n')
    assert find_config_file() == cfg


def test_pyproject_without_tool_monarch_is_skipped(tmp_path: pathlib.Path) -> None:
    upper = write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    sub = tmp_path / "proj"
    write(sub / "pyproject.toml", '[project]\nname = "x"\n[tool.other]\nk = 1\n')
    assert find_config_file(sub) == upper


def test_upward_search_from_nested_cwd(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert find_config_file() == cfg
    assert lookup_host_mesh("a", installed_schedulers=INSTALLED).source.startswith(str(cfg))


def test_nearest_directory_wins(tmp_path: pathlib.Path) -> None:
    write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "outer"\n')
    inner = write(tmp_path / "sub" / "pyproject.toml", '[tool.monarch.hosts.a]\nscheduler = "inner"\n')
    assert find_config_file(tmp_path / "sub" / "deeper") == inner


def test_start_argument_and_file_start(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "x" / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    f = write(tmp_path / "x" / "y" / "script.py", "")
    assert find_config_file(tmp_path / "x" / "y") == cfg
    assert find_config_file(str(f)) == cfg


def test_monarch_toml_directory_is_not_a_config(tmp_path: pathlib.Path) -> None:
    (tmp_path / "sub" / "monarch.toml").mkdir(parents=True)
    cfg = write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    assert find_config_file(tmp_path / "sub") == cfg


def test_malformed_pyproject_during_search_is_error(tmp_path: pathlib.Path) -> None:
    bad = write(tmp_path / "pyproject.toml", "[tool.monarch\n")
    with pytest.raises(ConfigError) as ei:
        find_config_file()
    assert str(bad) in str(ei.value)
    assert "line 1" in str(ei.value)


def test_env_override_beats_local_files(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "cwd"\n')
    other = write(tmp_path / "elsewhere" / "custom.toml", '[hosts.a]\nscheduler = "local"\n')
    monkeypatch.setenv("MONARCH_CONFIG", str(other))
    assert find_config_file() == other
    assert find_config_file(tmp_path) == other  # overrides explicit start too
    m = lookup_host_mesh("a", installed_schedulers=INSTALLED)
    assert m.scheduler == "local"
    assert m.source == f"{other} [hosts.a]"


def test_env_override_relative_path(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write(tmp_path / "conf" / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    monkeypatch.setenv("MONARCH_CONFIG", os.path.join("conf", "monarch.toml"))
    assert find_config_file() == cfg


def test_env_override_pyproject(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(tmp_path / "p" / "pyproject.toml", '[tool.monarch.hosts.a]\nscheduler = "local"\n')
    monkeypatch.setenv("MONARCH_CONFIG", str(cfg))
    assert lookup_host_mesh("a", installed_schedulers=INSTALLED).source == (
        f"{cfg} [tool.monarch.hosts.a]"
    )


def test_env_empty_is_unset(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    monkeypatch.setenv("MONARCH_CONFIG", "")
    assert find_config_file() == cfg


def test_env_override_missing_file(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    missing = tmp_path / "nope" / "monarch.toml"
    monkeypatch.setenv("MONARCH_CONFIG", str(missing))
    with pytest.raises(ConfigError) as ei:
        find_config_file()
    msg = str(ei.value)
    assert "MONARCH_CONFIG" in msg
    assert str(missing) in msg
    assert "does not exist" in msg
    with pytest.raises(ConfigError, match="MONARCH_CONFIG"):
        lookup_host_mesh("a", installed_schedulers=INSTALLED)


def test_env_override_directory(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONARCH_CONFIG", str(tmp_path))
    with pytest.raises(ConfigError) as ei:
        find_config_file()
    assert "MONARCH_CONFIG" in str(ei.value)
    assert "not a file" in str(ei.value)


def test_find_returns_none_when_nothing(tmp_path: pathlib.Path) -> None:
    _nothing_above(tmp_path)
    write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n')
    assert find_config_file() is None


# ---------------------------------------------------------------------------
# Parsing and defaults
# ---------------------------------------------------------------------------


def test_load_config_all_entries_in_order(tmp_path: pathlib.Path) -> None:
    cfg = write(
        tmp_path / "monarch.toml",
        """
        [hosts.dev]
        scheduler = "local"
        hosts = 2

        [hosts.cluster]
        scheduler = "slurm"
        partition = "gpu"
        nodes = 4
        time = "01:00:00"

        [hosts.lab]
        scheduler = "ssh"
        hosts = ["a", "b"]

        [hosts."my.mesh"]
        scheduler = "local"

        [unrelated]
        ignored = true
        """,
    )
    entries = load_config(cfg)
    assert list(entries) == ["dev", "cluster", "lab", "my.mesh"]
    assert entries["dev"].params == {"hosts": 2}
    assert entries["cluster"].params == {"partition": "gpu", "nodes": 4, "time": "01:00:00"}
    assert entries["lab"].params == {"hosts": ["a", "b"]}
    assert entries["lab"].source == f"{cfg} [hosts.lab]"
    assert entries["my.mesh"].source == f'{cfg} [hosts."my.mesh"]'
    for e in entries.values():
        assert "scheduler" not in e.params


def test_load_config_no_hosts_is_empty(tmp_path: pathlib.Path) -> None:
    assert load_config(write(tmp_path / "monarch.toml", "")) == {}
    assert load_config(write(tmp_path / "pyproject.toml", '[project]\nname="x"\n')) == {}
    assert load_config(write(tmp_path / "a" / "pyproject.toml", "[tool.monarch]\n")) == {}


def test_defaults_merged_entry_wins(tmp_path: pathlib.Path) -> None:
    cfg = write(
        tmp_path / "monarch.toml",
        """
        [defaults]
        time = "00:30:00"
        partition = "cpu"
        env = { A = "1" }

        [hosts.x]
        scheduler = "slurm"
        partition = "gpu"

        [hosts.y]
        scheduler = "slurm"
        env = { B = "2" }
        """,
    )
    entries = load_config(cfg)
    assert entries["x"].params == {"time": "00:30:00", "partition": "gpu", "env": {"A": "1"}}
    # shallow merge: a table in the entry replaces the default table
    assert entries["y"].params == {"time": "00:30:00", "partition": "cpu", "env": {"B": "2"}}
    # params are independent copies
    entries["x"].params["env"]["A"] = "changed"
    assert load_config(cfg)["x"].params["env"] == {"A": "1"}


def test_defaults_can_supply_scheduler(tmp_path: pathlib.Path) -> None:
    write(
        tmp_path / "monarch.toml",
        """
        [defaults]
        scheduler = "local"
        hosts = 1

        [hosts.a]
        [hosts.b]
        scheduler = "ssh"
        hosts = ["h1"]
        """,
    )
    a = lookup_host_mesh("a", installed_schedulers=["local", "ssh"])
    assert (a.scheduler, a.params) == ("local", {"hosts": 1})
    b = lookup_host_mesh("b", installed_schedulers=["local", "ssh"])
    assert (b.scheduler, b.params) == ("ssh", {"hosts": ["h1"]})


def test_pyproject_defaults(tmp_path: pathlib.Path) -> None:
    write(
        tmp_path / "pyproject.toml",
        """
        [tool.monarch.defaults]
        nodes = 2
        [tool.monarch.hosts.c]
        scheduler = "local"
        """,
    )
    assert lookup_host_mesh("c", installed_schedulers=INSTALLED).params == {"nodes": 2}


def test_host_mesh_config_is_frozen(tmp_path: pathlib.Path) -> None:
    write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    m = lookup_host_mesh("a", installed_schedulers=INSTALLED)
    with pytest.raises(AttributeError):
        m.scheduler = "other"  # type: ignore[misc]


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_error_no_config_found(tmp_path: pathlib.Path) -> None:
    _nothing_above(tmp_path)
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("trainers", installed_schedulers=INSTALLED)
    msg = str(ei.value)
    assert isinstance(ei.value, ValueError)
    assert "No Monarch config file found" in msg
    assert str(tmp_path) in msg
    assert "every parent directory" in msg
    assert "MONARCH_CONFIG" in msg
    assert "monarch.toml" in msg and "[tool.monarch]" in msg
    assert "[hosts.trainers]" in msg
    assert 'scheduler = "local"' in msg
    assert "hosts = 2" in msg
    assert "[tool.monarch.hosts.trainers]" in msg


def test_error_malformed_toml(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\nhosts = \n')
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("a", installed_schedulers=INSTALLED)
    msg = str(ei.value)
    assert str(cfg) in msg
    assert "not valid TOML" in msg
    assert "line 3" in msg and "column" in msg


def test_error_not_utf8(tmp_path: pathlib.Path) -> None:
    cfg = tmp_path / "monarch.toml"
    cfg.write_bytes(b'[hosts.a]\nscheduler = "\xff"\n')
    with pytest.raises(ConfigError) as ei:
        load_config(cfg)
    assert str(cfg) in str(ei.value)


def test_error_load_missing_file(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "monarch.toml"
    with pytest.raises(ConfigError) as ei:
        load_config(missing)
    assert str(missing) in str(ei.value)
    assert "does not exist" in str(ei.value)


def test_error_hosts_not_table(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "monarch.toml", 'hosts = "a,b"\n')
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("a", installed_schedulers=INSTALLED)
    msg = str(ei.value)
    assert str(cfg) in msg
    assert "[hosts] must be a table" in msg
    assert "got str" in msg


def test_error_pyproject_hosts_not_table(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "pyproject.toml", "[tool.monarch]\nhosts = 3\n")
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("a", installed_schedulers=INSTALLED)
    assert str(cfg) in str(ei.value)
    assert "[tool.monarch.hosts] must be a table" in str(ei.value)


def test_error_tool_monarch_not_table(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "pyproject.toml", "[tool]\nmonarch = 1\n")
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("a", installed_schedulers=INSTALLED)
    assert str(cfg) in str(ei.value)
    assert "[tool.monarch] must be a table" in str(ei.value)


def test_error_defaults_not_table(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "monarch.toml", 'defaults = 1\n[hosts.a]\nscheduler = "local"\n')
    with pytest.raises(ConfigError) as ei:
        load_config(cfg)
    assert str(cfg) in str(ei.value)
    assert "[defaults] must be a table" in str(ei.value)


def test_error_entry_not_table(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "monarch.toml", '[hosts]\nbad = "local"\n')
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("bad", installed_schedulers=INSTALLED)
    msg = str(ei.value)
    assert str(cfg) in msg
    assert "'bad'" in msg and "[hosts.bad]" in msg
    assert "must be a table" in msg
    assert 'scheduler = "local"' in msg


def test_error_scheduler_missing(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "pyproject.toml", "[tool.monarch.hosts.a]\nhosts = 2\n")
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("a", installed_schedulers=INSTALLED)
    msg = str(ei.value)
    assert str(cfg) in msg
    assert "[tool.monarch.hosts.a]" in msg
    assert "missing the required 'scheduler' key" in msg
    assert "[tool.monarch.defaults]" in msg


@pytest.mark.parametrize("value, got", [("3", "int"), ('""', "''"), ('["local"]', "list")])
def test_error_scheduler_wrong_type(tmp_path: pathlib.Path, value: str, got: str) -> None:
    cfg = write(tmp_path / "monarch.toml", f"[hosts.a]\nscheduler = {value}\n")
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("a", installed_schedulers=INSTALLED)
    msg = str(ei.value)
    assert str(cfg) in msg
    assert "[hosts.a]" in msg
    assert "invalid 'scheduler'" in msg and "non-empty str" in msg
    assert f"got {got}" in msg


def test_error_other_entry_invalid_is_reported(tmp_path: pathlib.Path) -> None:
    cfg = write(
        tmp_path / "monarch.toml",
        '[hosts.good]\nscheduler = "local"\n[hosts.broken]\nhosts = 1\n',
    )
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("good", installed_schedulers=INSTALLED)
    assert str(cfg) in str(ei.value)
    assert "[hosts.broken]" in str(ei.value)


@pytest.mark.parametrize("bad", [3, None, ""])
def test_error_name_not_str(tmp_path: pathlib.Path, bad: object) -> None:
    write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    with pytest.raises(ConfigError, match="Host mesh name must be a non-empty str"):
        lookup_host_mesh(bad, installed_schedulers=INSTALLED)  # type: ignore[arg-type]


def test_installed_schedulers_as_str_is_type_error(tmp_path: pathlib.Path) -> None:
    write(tmp_path / "monarch.toml", '[hosts.a]\nscheduler = "local"\n')
    with pytest.raises(TypeError):
        lookup_host_mesh("a", installed_schedulers="local")


def test_error_name_not_configured(tmp_path: pathlib.Path) -> None:
    cfg = write(
        tmp_path / "monarch.toml",
        '[hosts.zeta]\nscheduler = "local"\n[hosts.alpha]\nscheduler = "local"\n',
    )
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("alpah", installed_schedulers=["slurm", "local"])
    msg = str(ei.value)
    assert "'alpah' is not configured" in msg
    assert str(cfg) in msg
    assert "Configured host meshes: 'alpha', 'zeta'." in msg
    assert "Installed schedulers: 'local', 'slurm'." in msg
    assert "Did you mean 'alpha'?" in msg
    assert "[hosts.alpah]" in msg


def test_error_name_not_configured_empty_pyproject(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = write(tmp_path / "pyproject.toml", '[project]\nname = "x"\n')
    monkeypatch.setenv("MONARCH_CONFIG", str(cfg))
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("a", installed_schedulers=INSTALLED)
    msg = str(ei.value)
    assert str(cfg) in msg
    assert "Configured host meshes: (none)." in msg
    assert "[tool.monarch.hosts.a]" in msg


@pytest.mark.parametrize("scheduler", ["slurm", "ssh"])
def test_error_known_plugin_scheduler_not_installed(tmp_path: pathlib.Path, scheduler: str) -> None:
    cfg = write(tmp_path / "monarch.toml", f'[hosts.c]\nscheduler = "{scheduler}"\n')
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("c", installed_schedulers=INSTALLED)
    msg = str(ei.value)
    assert str(cfg) in msg
    assert "[hosts.c]" in msg
    assert f"'{scheduler}', which is not installed" in msg
    assert "Installed schedulers: 'local'." in msg
    pkg = f"monarch-scheduler-{scheduler}"
    assert f"provided by the plugin {pkg}: {install_hint(pkg)}" in msg


def test_known_scheduler_packages_constant() -> None:
    assert KNOWN_SCHEDULER_PACKAGES == {
        "ssh": "monarch-scheduler-ssh",
        "slurm": "monarch-scheduler-slurm",
    }
    assert install_hint("monarch-transport-tcp") == "pip install . ./plugins/transport_tcp (in a monarch-core checkout)"
    assert install_hint("monarch-scheduler-ssh") == (
        "pip install . ./plugins/transport_tcp ./plugins/scheduler_ssh (in a monarch-core checkout)")


def test_error_unknown_scheduler_not_installed(tmp_path: pathlib.Path) -> None:
    cfg = write(tmp_path / "pyproject.toml", '[tool.monarch.hosts.c]\nscheduler = "k8s"\n')
    with pytest.raises(ConfigError) as ei:
        lookup_host_mesh("c", installed_schedulers=["local", "ssh"])
    msg = str(ei.value)
    assert str(cfg) in msg
    assert "[tool.monarch.hosts.c]" in msg
    assert "'k8s', which is not installed" in msg
    assert "Installed schedulers: 'local', 'ssh'." in msg
    assert "pip install" not in msg
    assert "Install the package that provides" in msg


def test_error_scheduler_typo_suggests(tmp_path: pathlib.Path) -> None:
    write(tmp_path / "monarch.toml", '[hosts.c]\nscheduler = "locl"\n')
    with pytest.raises(ConfigError, match='Did you mean scheduler = "local"'):
        lookup_host_mesh("c", installed_schedulers=INSTALLED)


def test_error_no_schedulers_installed(tmp_path: pathlib.Path) -> None:
    write(tmp_path / "monarch.toml", '[hosts.c]\nscheduler = "local"\n')
    with pytest.raises(ConfigError, match=r"Installed schedulers: \(none\)"):
        lookup_host_mesh("c", installed_schedulers=[])
