"""The code type-checks: mypy (``[tool.mypy]`` in pyproject.toml) over
monarch-core and every plugin package, in one run (so that the imports
between them resolve), finds no error.

A package that is not yet clean is listed, with its error count, in
:data:`REMAINING` -- the one place exemptions live.  Its count may only go
down: lower it as errors are fixed, and remove the entry at 0.  Every other
package (a new one included: plugins are found, not listed) must have none.
mypy keeps its cache in ``.mypy_cache`` (git-ignored): a run after a small
change takes seconds, a cold run a minute or two.
"""

from __future__ import annotations

import collections
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: Packages with type errors still to fix: package -> how many mypy finds now
#: (a package: ``monarch_core/<subpackage>``, ``monarch_core/<module>.py``, or
#: ``plugins/<plugin>``).  Only ever lower these numbers.
REMAINING: dict[str, int] = {}

_ERROR = re.compile(r"^(?P<path>[^:\s]+\.pyi?):(?P<line>\d+): error: ", re.M)
_CHECKED = re.compile(r"(?:Success: no issues found in|checked) (?P<n>\d+) source files?")


def _packages() -> list[str]:
    """monarch_core and the top-level packages of every plugin distribution
    under plugins/ (a directory with ``__init__.py``; not tests or benchmarks)."""
    found = ["monarch_core"]
    for dist in sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml")):
        for pkg in sorted(dist.iterdir()):
            if (pkg / "__init__.py").is_file() and pkg.name not in ("tests", "bench"):
                found.append(str(pkg.relative_to(ROOT)))
    return found


def _bucket(path: str) -> str:
    """The package an error's file belongs to (see :data:`REMAINING`)."""
    parts = pathlib.PurePosixPath(path).parts
    if parts[0] == "plugins":
        return "/".join(parts[:2])
    return "/".join(parts[:2]) if len(parts) > 1 else parts[0]


@pytest.mark.timeout(900)
def test_mypy_finds_no_error_outside_the_remaining_list() -> None:
    pytest.importorskip("mypy")
    packages = _packages()
    assert "plugins/transport_tcp/monarch_transport_tcp" in packages, packages
    out = subprocess.run(
        [sys.executable, "-m", "mypy", *packages],
        capture_output=True, text=True, timeout=840, cwd=ROOT,
    )
    text = out.stdout + out.stderr
    assert out.returncode in (0, 1), f"mypy did not run (exit status {out.returncode}):\n{text}"
    checked = _CHECKED.search(text)
    assert checked is not None and int(checked.group("n")) > 100, f"mypy checked too little:\n{text}"

    errors: dict[str, list[str]] = collections.defaultdict(list)
    for m in _ERROR.finditer(text):
        line = text[m.start():text.find("\n", m.start())]
        errors[_bucket(m.group("path").replace("\\", "/"))].append(line)
    unexpected = {pkg: lines for pkg, lines in errors.items() if len(lines) > REMAINING.get(pkg, 0)}
    report = "\n\n".join(
        f"{pkg}: {len(lines)} errors (allowed: {REMAINING.get(pkg, 0)}; REMAINING in {pathlib.Path(__file__).name})\n"
        + "\n".join(lines)
        for pkg, lines in sorted(unexpected.items())
    )
    assert not unexpected, (
        "mypy finds type errors; fix them (a `# type: ignore[code]` only where mypy is wrong, with the "
        f"reason on the line):\n\n{report}"
    )


def test_the_remaining_list_names_real_packages() -> None:
    """An entry of :data:`REMAINING` is a package that exists (a renamed or
    removed one leaves no silent exemption behind)."""
    for pkg in REMAINING:
        assert (ROOT / pkg).exists(), f"REMAINING names {pkg}, which does not exist: remove the entry"


#: Module-level ``Name = Any`` aliases that are not back-references (file -> names), with why.
_ANY_ALIASES_ALLOWED = {
    # what ``@endpoint(propagate=...)`` takes is the tensor engine's to interpret (a mode or a function)
    "monarch_core/_actor/_endpoint.py": {"Propagator"},
}
_ANY_ALIAS = re.compile(r"^(?P<name>[A-Za-z_]\w*)[ \t]*(?::[ \t]*\w+[ \t]*)?=[ \t]*(?:typing\.)?Any[ \t]*(?:#.*)?$",
                        re.M)


def test_no_back_reference_is_erased_to_any() -> None:
    """A type from a module that cannot be imported here (it imports this
    one) is a ``typing.Protocol`` of what this module uses of it, not
    ``Name = Any``: mypy then checks both sides."""
    found = []
    for root in ("monarch_core", "plugins"):
        for path in sorted((ROOT / root).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if "/tests/" in rel or ".egg-info" in rel:
                continue
            for m in _ANY_ALIAS.finditer(path.read_text(encoding="utf-8")):
                if m.group("name") not in _ANY_ALIASES_ALLOWED.get(rel, set()):
                    found.append(f"{rel}: {m.group(0).strip()}")
    assert not found, "aliases of Any where a Protocol belongs:\n" + "\n".join(found)
