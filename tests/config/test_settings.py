"""monarch_core.settings: one declaration per MONARCH_* variable, one parse,
one error style, and the README tables generated from the declarations."""

from __future__ import annotations

import pathlib
import re

import pytest

from monarch_core import settings
from monarch_core._plugins import registry
from monarch_core.errors import ConfigError

registry()  # the installed plugins declare their settings: the tables cover an installation

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
SOURCES = [p for p in (REPO / "monarch_core").rglob("*.py")] + [
    p for p in (REPO / "plugins").glob("*/monarch_*/**/*.py")
]


def _block(text: str, tag: str) -> str:
    m = re.search(rf"<!-- settings:{tag} -->\n(.*?)<!-- /settings:{tag} -->", text, re.S)
    assert m, f"README.md has no <!-- settings:{tag} --> block"
    return m.group(1)


def write_readme_tables() -> None:
    """Regenerate the README blocks (run this module: python tests/config/test_settings.py)."""
    path = REPO / "README.md"
    text = path.read_text()
    for tag, public in (("user", True), ("internal", False)):
        text = re.sub(rf"(<!-- settings:{tag} -->\n).*?(<!-- /settings:{tag} -->)",
                      lambda m: m.group(1) + settings.markdown_table(public) + m.group(2), text, flags=re.S)
    path.write_text(text)


def test_readme_tables_are_generated_from_the_declarations() -> None:
    text = (REPO / "README.md").read_text()
    assert _block(text, "user") == settings.markdown_table(True), (
        "README.md's settings table drifted from monarch_core/settings.py: run python tests/config/test_settings.py"
    )
    assert _block(text, "internal") == settings.markdown_table(False)


def test_the_tables_do_not_depend_on_the_order_plugins_declared_their_settings(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # (a process that imported a plugin's module before the registry loaded the others, as a
    # test collection does, declared that plugin's settings first)
    before = settings.markdown_table(True), settings.markdown_table(False)
    owners = list(dict.fromkeys(s.owner for s in settings._declared.values()))
    assert len(owners) >= 2, owners
    reordered = {n: s for owner in reversed(owners) for n, s in settings._declared.items() if s.owner == owner}
    assert list(reordered) != list(settings._declared)
    monkeypatch.setattr(settings, "_declared", reordered)
    assert (settings.markdown_table(True), settings.markdown_table(False)) == before


def test_every_variable_the_code_names_is_declared() -> None:
    declared = {s.name for s in settings.all_settings()}
    named = set()
    for p in SOURCES:
        named |= set(re.findall(r"MONARCH_[A-Z][A-Z0-9_]*[A-Z0-9]", p.read_text()))
    undeclared = sorted(
        n for n in named
        if n not in declared
        and n != "MONARCH_TOML"  # a constant's name, not a variable
        and n != "MONARCH_ZLIB_LEVEL"  # the hookspec's example plugin
        and not any(s.startswith(n + "_") for s in declared)  # a family in prose: MONARCH_TLS_*
    )
    assert undeclared == [], f"declare these in monarch_core/settings.py or the plugin's _settings.py: {undeclared}"


def test_no_module_but_settings_reads_a_monarch_variable_itself() -> None:
    reads = re.compile(r"""(?:environ\.get|getenv|environ\[)\(?\s*["']MONARCH_""")
    offenders = [
        f"{p.relative_to(REPO)}:{i}"
        for p in SOURCES
        if p.name != "settings.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if reads.search(line) and "=" not in line.split("environ[", 1)[-1].split("]", 1)[-1][:3]
    ]
    assert offenders == [], f"read these through monarch_core.settings.get: {offenders}"


@pytest.mark.parametrize(
    "name,raw,message",
    [
        ("MONARCH_DELIVERY_TIMEOUT", "abc", "MONARCH_DELIVERY_TIMEOUT must be a number of seconds >= 0.001, got 'abc'"),
        ("MONARCH_DELIVERY_TIMEOUT", "-1", "MONARCH_DELIVERY_TIMEOUT must be a number of seconds >= 0.001, got '-1'"),
        ("MONARCH_DELIVERY_TIMEOUT", "nan", "MONARCH_DELIVERY_TIMEOUT must be a number of seconds >= 0.001, got 'nan'"),
        ("MONARCH_CAST_FANOUT", "1", "MONARCH_CAST_FANOUT must be an integer >= 2, got '1'"),
        ("MONARCH_CAST_FANOUT", "2.5", "MONARCH_CAST_FANOUT must be an integer >= 2, got '2.5'"),
        ("MONARCH_FORK_SERVER", "maybe", "MONARCH_FORK_SERVER must be 0 or 1 (or true/false, yes/no, on/off), got 'maybe'"),
    ],
)
def test_a_malformed_value_is_a_config_error_naming_the_variable_and_the_fix(name: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as ei:
        settings.get(name, {name: raw})
    assert str(ei.value).startswith(message)
    assert "unset it or fix its value" in str(ei.value)


def test_values_parse_by_kind_and_blank_means_the_default() -> None:
    assert settings.get("MONARCH_DELIVERY_TIMEOUT", {}) == 30.0
    assert settings.get("MONARCH_DELIVERY_TIMEOUT", {"MONARCH_DELIVERY_TIMEOUT": " "}) == 30.0
    assert settings.get("MONARCH_DELIVERY_TIMEOUT", {"MONARCH_DELIVERY_TIMEOUT": "2.5"}) == 2.5
    assert settings.get("MONARCH_CAST_FANOUT", {"MONARCH_CAST_FANOUT": "4"}) == 4
    assert settings.get("MONARCH_FORK_SERVER", {"MONARCH_FORK_SERVER": "off"}) is False
    assert settings.get("MONARCH_FORK_SERVER", {"MONARCH_FORK_SERVER": "1"}) is True
    assert settings.get("MONARCH_DISABLED_PLUGINS", {"MONARCH_DISABLED_PLUGINS": " a, ,b "}) == ("a", "b")
    assert settings.is_set("MONARCH_CONFIG", {"MONARCH_CONFIG": "x"})
    assert not settings.is_set("MONARCH_CONFIG", {"MONARCH_CONFIG": ""})
    with pytest.raises(KeyError):
        settings.get("MONARCH_NO_SUCH_THING", {})


def test_every_declaration_is_complete() -> None:
    for s in settings.all_settings():
        assert s.name.startswith("MONARCH_") and s.meaning and s.kind in settings._KINDS, s
        assert s.parse(None) == s.default


def test_the_project_plugins_declare_their_own_settings_and_own_them() -> None:
    owners = {s.name: s.owner for s in settings.all_settings()}
    for name, owner in [("MONARCH_TLS_CA", "monarch-transport-tcp"), ("MONARCH_SLURM_JOB_ID", "monarch-scheduler-slurm"),
                        ("MONARCH_DEBUG_SERVER_PORT", "monarch-debugger"), ("MONARCH_DASHBOARD", "monarch-dashboard"),
                        ("MONARCH_RDMA_DEVICE", "monarch-transport-rdma")]:
        if owner.split("-", 1)[1].replace("-", "_") in {i.distribution.split("-", 1)[1].replace("-", "_")
                                                         for i in registry().infos}:
            assert owners.get(name) == owner and name not in settings.SETTINGS, name


def test_a_third_party_declaration_parses_and_a_clash_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settings, "_declared", dict(settings._declared))  # this test's declarations go with it
    mine = settings.Setting("MONARCH_TEST_THIRD_PARTY_LEVEL", "int", 6, "a test plugin's level", minimum=0)
    settings.declare([mine], "monarch-test-plugin")
    settings.declare([mine], "monarch-test-plugin")  # idempotent
    assert settings.get("MONARCH_TEST_THIRD_PARTY_LEVEL", {}) == 6
    assert settings.get("MONARCH_TEST_THIRD_PARTY_LEVEL", {"MONARCH_TEST_THIRD_PARTY_LEVEL": "3"}) == 3
    with pytest.raises(ConfigError, match="MONARCH_TEST_THIRD_PARTY_LEVEL must be an integer >= 0"):
        settings.get("MONARCH_TEST_THIRD_PARTY_LEVEL", {"MONARCH_TEST_THIRD_PARTY_LEVEL": "-1"})
    with pytest.raises(ConfigError, match="which monarch-core declares already"):
        settings.declare([settings.Setting("MONARCH_DELIVERY_TIMEOUT", "int", 1, "x")], "monarch-thief")
    with pytest.raises(ConfigError, match="a setting is named MONARCH_"):
        settings.declare([settings.Setting("ZLIB_LEVEL", "int", 1, "x")], "monarch-thief")
    with pytest.raises(KeyError, match="monarch_settings hook"):
        settings.get("MONARCH_NOBODY_DECLARES_THIS", {})


if __name__ == "__main__":
    write_readme_tables()
