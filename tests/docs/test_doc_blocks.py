"""Every Python and shell block of README.md and docs/ is run by a test or
marked as a fragment, by name (``_helpers/docblocks.py`` describes the
markers).  An unmarked block, a fence without a language, a fragment without
a reason, or a ``run:`` marker that no test file names fails here."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from _helpers.docblocks import CHECKED, REPO, Block, blocks, only_pip_install, pages

pytestmark = pytest.mark.unit


@functools.lru_cache(maxsize=1)
def _test_sources() -> dict[str, str]:
    files = [*(REPO / "tests").rglob("*.py"), *(REPO / "plugins").glob("*/tests/**/*.py")]
    me = Path(__file__).resolve()
    return {p.relative_to(REPO).as_posix(): p.read_text(errors="replace") for p in files if p.resolve() != me}


def problems(b: Block) -> list[str]:
    """What is wrong with block ``b`` (nothing: [])."""
    page = Path(b.page).name
    if not b.lang:
        return [f"{b}: a fence without a language; give it one (`text` for output or a diagram, `python`, `bash`)"]
    if b.kind == "fragment":
        return [] if b.value else [f"{b}: <!-- fragment: --> needs a reason (what the block needs to run)"]
    if b.kind in ("run", "cluster"):
        value = b.value.split()[0] if b.value else ""
        if not value:
            return [f"{b}: <!-- {b.kind}: --> needs a name (or the test file that runs the block)"]
        if value.endswith(".py"):
            src = _test_sources().get(value)
            if src is None:
                return [f"{b}: <!-- {b.kind}: {value} -->: no such test file"]
            if b.kind == "cluster":  # a testbed's test, which takes the block by its own means
                return []
            return [] if page in src else [f"{b}: {value} does not name {page}: it cannot be running this block"]
        if b.kind == "cluster":
            return [f"{b}: <!-- cluster: --> names the test file that runs the block"]
        named = [f for f, src in _test_sources().items() if page in src and
                 any(s in src for s in (f'"{value}"', f"'{value}'", f"run: {value}"))]
        return [] if named else [f"{b}: <!-- run: {value} -->, but no test file names {page} and {value!r}"]
    if b.lang in CHECKED and not only_pip_install(b):
        return [f"{b}: a {b.lang} block that no test runs: run it from a test and mark it <!-- run: NAME -->, "
                f"or mark it <!-- fragment: REASON --> (tests/_helpers/docblocks.py)"]
    return []


@pytest.mark.parametrize("page", [p.relative_to(REPO).as_posix() for p in pages()])
def test_every_block_is_run_or_marked_a_fragment(page: str) -> None:
    found = [p for b in blocks(page) for p in problems(b)]
    names = [b.value for b in blocks(page) if b.kind == "run" and not b.value.endswith(".py")]
    found += [f"{page}: two blocks marked <!-- run: {n} -->" for n in sorted({n for n in names if names.count(n) > 1})]
    assert found == [], "\n".join(found)


def test_the_check_catches_each_kind(tmp_path: Path) -> None:
    bad = [
        Block("docs/x.md", 1, "python", "print(1)\n", None, ""),
        Block("docs/x.md", 2, "", "$ monarch status\n", None, ""),
        Block("docs/x.md", 3, "bash", "monarch status\n", "fragment", ""),
        Block("docs/x.md", 4, "python", "print(1)\n", "run", "no-test-names-this-block"),
        Block("docs/x.md", 5, "python", "print(1)\n", "run", "tests/no/such_test.py"),
    ]
    assert [len(problems(b)) for b in bad] == [1, 1, 1, 1, 1]
    good = [
        Block("docs/x.md", 1, "bash", "pip install .\n# comment\npip install ./plugins/spmd\n", None, ""),
        Block("docs/x.md", 2, "text", "output\n", None, ""),
        Block("docs/x.md", 3, "python", "x\n", "fragment", "needs a GPU"),
        Block("docs/workspace.md", 4, "python", "x\n", "run", "tests/docs/test_doc_examples.py"),
    ]
    assert [problems(b) for b in good] == [[], [], [], []]
