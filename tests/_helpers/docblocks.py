"""The fenced code blocks of ``README.md`` and ``docs/*.md``, and their markers.

Every Python or shell block of the docs is either run by a test or marked as
a fragment that no test runs, by an HTML comment on the line just before its
opening fence (invisible on the rendered page):

* ``<!-- run: NAME -->``: a test runs this block.  ``NAME`` is unique in its
  page, and some test file (under ``tests/`` or ``plugins/*/tests/``) names
  both the page (``workspace.md``) and the block (``"NAME"``, ``'NAME'`` or
  ``run: NAME``); :func:`block` gets it by that name.  ``NAME`` may also be
  the path of the test file that runs it (``run: plugins/debugger/tests/test_debug_guide.py``):
  that file must exist and name the page.
* ``<!-- cluster: TEST_FILE ... -->``: run by ``TEST_FILE`` on a testbed's
  cluster (the file must exist).
* ``<!-- fragment: REASON -->``: not run, for the REASON given (it needs
  hardware, a cluster or your own code; it is part of a larger example...).

A shell block whose every command is a ``pip install`` needs no marker:
``tests/docs/test_install_lines.py`` runs every such line.  Every fence
has a language (``text`` for output and diagrams), so that no Python or
shell block goes unchecked for lack of one.  ``tests/docs/test_doc_blocks.py``
checks all of this over every page.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
#: Languages whose blocks must be run or marked.
CHECKED = {"python", "py", "pycon", "bash", "sh", "shell", "console", "zsh"}
SHELL = {"bash", "sh", "shell", "console", "zsh"}

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
_MARKER = re.compile(r"^\s*<!--\s*(run|fragment|cluster):\s*(.*?)\s*-->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: its page (relative to the checkout), the line of its
    opening fence, its language, its text, and its marker (``kind``: run,
    fragment, cluster or None; ``value``: the name, reason or test file)."""

    page: str
    line: int
    lang: str
    text: str
    kind: Optional[str]
    value: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang or 'no language'})"


def pages() -> list[Path]:
    """README.md and every page of docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(page: Path | str) -> list[Block]:
    """The fenced blocks of ``page`` (a path, or a name relative to the checkout), in order."""
    path = REPO / page if isinstance(page, str) else page
    rel = path.relative_to(REPO).as_posix()
    lines = path.read_text().splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        start = i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        prev = lines[start - 1] if start else ""
        mk = _MARKER.match(prev)
        out.append(Block(rel, start + 1, lang.lower(), "\n".join(body) + "\n", mk.group(1) if mk else None,
                         mk.group(2) if mk else ""))
        i += 1
    return out


def block(page: str, name: str) -> str:
    """The text of the block of ``page`` marked ``<!-- run: NAME -->``."""
    found = [b for b in blocks(page) if b.kind == "run" and b.value == name]
    assert len(found) == 1, f"{page} has {len(found)} blocks marked <!-- run: {name} -->, expected one"
    return found[0].text


def only_pip_install(b: Block) -> bool:
    """A shell block whose every command is a ``pip install`` (test_install_lines runs them)."""
    if b.lang not in SHELL:
        return False
    cmds = [ln.strip() for ln in b.text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    return bool(cmds) and all(re.match(r"^(\$ )?(python -m )?pip install\b", c) for c in cmds)
