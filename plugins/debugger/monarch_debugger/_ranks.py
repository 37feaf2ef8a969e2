"""The argument grammar of ``monarch debug``'s ``attach`` and ``cast``, and
what a ``ranks(...)`` selection picks.

Parsed with lark (LALR, contextual lexer; imported by the CLI only)::

    attach <actor> <rank>
    cast <actor> ranks(<selection>) <pdb command>

    selection :=  item ("," item)*          ranks(3)  ranks(1,2,3)  ranks(2:7:2)  ranks(0,4:8)
               |  dim "=" item ("," ...)*    ranks(host=2:4, gpu=1:3)  ranks(host=1)
    item      :=  N  |  [N] ":" [N] [":" [N]]   (Python's slice: start, stop, step)

A linear selection indexes the actor mesh's ranks; a selection by dimension
keeps the ranks whose coordinate along each named dimension is selected
(dimensions not named: all).  Errors are :class:`RankSpecError` with one
line that says what was expected where, or which names exist.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Sequence

from monarch_debugger._errors import DebuggerError

__all__ = ["RankSpecError", "Selection", "Span", "parse_attach", "parse_cast"]

GRAMMAR = r"""
attach_args: ACTOR RANK
cast_args: ACTOR RANKS_OPEN selection ")" COMMAND

selection: item ("," item)*     -> linear
         | dim ("," dim)*       -> by_dim
?item: RANK | span
dim: NAME "=" item
span: [RANK] ":" [RANK] [":" [RANK]]

RANKS_OPEN: "ranks("
ACTOR: /[^\s()]+/
RANK: /\d+/
NAME: /[A-Za-z_][A-Za-z0-9_]*/
COMMAND: /\S.*/
%ignore /[ \t]+/
"""

#: How lark's terminal names read in an error.
_NAMES = {
    "ACTOR": "an actor name",
    "RANK": "a rank (a number)",
    "RANKS_OPEN": "ranks(",
    "NAME": "a dimension name",
    "COMMAND": "a pdb command",
    "RPAR": "')'",
    "COLON": "':'",
    "COMMA": "','",
    "EQUAL": "'='",
    "$END": "the end",
}


class RankSpecError(DebuggerError, ValueError):
    """A bad ``attach``/``cast`` argument; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Span:
    """``start:stop:step`` (``None``: the slice default)."""

    start: int | None
    stop: int | None
    step: int | None

    def indices(self, size: int) -> range:
        return range(*slice(self.start, self.stop, self.step).indices(size))

    def __str__(self) -> str:
        s = f"{'' if self.start is None else self.start}:{'' if self.stop is None else self.stop}"
        return s if self.step is None else f"{s}:{self.step}"


Item = int | Span  # type: ignore[operator,misc]  # (3.10 union of classes)


@dataclasses.dataclass(frozen=True)
class Selection:
    """What ``ranks(...)`` says: ``items`` (linear), or ``dims`` (by dimension)."""

    items: tuple[Any, ...] = ()
    dims: tuple[tuple[str, Any], ...] = ()
    text: str = ""

    def ranks(self, actor: str, labels: Sequence[str], sizes: Sequence[int]) -> list[int]:
        """The ranks of a mesh with ``labels``/``sizes`` it selects, in order.
        :class:`RankSpecError` for a rank out of range or an unknown dimension."""
        total = math.prod(sizes) if sizes else 1
        if not self.dims:
            out: list[int] = []
            for it in self.items:
                if isinstance(it, Span):
                    out.extend(it.indices(total))
                elif it >= total:
                    raise RankSpecError(f"{self.text}: rank {it} is out of range: {actor} has {total} "
                                        f"rank{'s' if total != 1 else ''} (0-{total - 1})")
                else:
                    out.append(it)
            return list(dict.fromkeys(out))
        index = {label: i for i, label in enumerate(labels)}
        chosen: list[Sequence[int]] = [range(s) for s in sizes]
        for name, it in self.dims:
            if name not in index:
                known = ", ".join(labels) if labels else "none (it is a single actor)"
                hint = _near(name, labels)
                raise RankSpecError(f"{self.text}: {actor} has no dimension {name!r}"
                                    f"{f' (did you mean {hint!r}?)' if hint else ''}; its dimensions: {known}")
            size = sizes[index[name]]
            if isinstance(it, Span):
                chosen[index[name]] = it.indices(size)
            elif it >= size:
                raise RankSpecError(f"{self.text}: {name}={it} is out of range: {name} has size {size} "
                                    f"(0-{size - 1})")
            else:
                chosen[index[name]] = [it]
        out = []
        for coords in itertools.product(*chosen):
            r = 0
            for c, s in zip(coords, sizes):
                r = r * s + c
            out.append(r)
        return sorted(out)


_parsers: dict[str, Any] = {}


def _parser(start: str) -> Any:
    p = _parsers.get(start)
    if p is None:
        try:
            import lark
        except ImportError:  # pragma: no cover - a declared dependency
            raise RankSpecError("monarch debug needs the 'lark' package for its command arguments: "
                                "pip install lark") from None
        p = _parsers[start] = lark.Lark(GRAMMAR, start=start, parser="lalr", lexer="contextual",
                                        maybe_placeholders=True)
    return p


def _parse(start: str, text: str, usage: str) -> Any:
    import lark

    try:
        return _parser(start).parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise RankSpecError(_explain(e, text, usage)) from None


def _explain(e: Any, text: str, usage: str) -> str:
    import lark

    expected = getattr(e, "expected", None) or getattr(e, "allowed", None) or set()
    names = sorted({"nothing more" if "END" in t else _NAMES.get(t, repr(t)) for t in expected})
    want = " or ".join(names) if names else "something else"
    if isinstance(e, lark.exceptions.UnexpectedEOF) or getattr(getattr(e, "token", None), "type", "") == "$END":
        return f"{text.strip()!r} ends too early: expected {want} (usage: {usage})"
    col = getattr(e, "column", None)
    pos = getattr(e, "pos_in_stream", None)
    got = text[pos:pos + 12] if isinstance(pos, int) and pos >= 0 else ""
    at = f" at column {col}" if isinstance(col, int) and col > 0 else ""
    return f"{text.strip()!r}: expected {want}{at}{f', got {got!r}' if got else ''} (usage: {usage})"


ATTACH_USAGE = "attach <actor> <rank>"
CAST_USAGE = "cast <actor> ranks(<ranks>) <pdb command>"


def parse_attach(text: str) -> tuple[str, int]:
    """``<actor> <rank>`` -> ``(actor, rank)``."""
    if not text.strip():
        raise RankSpecError(f"usage: {ATTACH_USAGE}, e.g. attach debugee 13 ('list' shows the stopped ranks)")
    tree = _parse("attach_args", text, ATTACH_USAGE)
    actor, rank = tree.children
    return str(actor), int(rank)


def parse_cast(text: str) -> tuple[str, Selection, str]:
    """``<actor> ranks(<selection>) <command>`` -> ``(actor, selection, command)``."""
    if not text.strip():
        raise RankSpecError(f"usage: {CAST_USAGE}, e.g. cast debugee ranks(0,1) n")
    tree = _parse("cast_args", text, CAST_USAGE)
    actor, _open, sel, command = tree.children
    spec = text[text.index("ranks("):].split(")", 1)[0] + ")"
    if sel.data == "linear":
        items = tuple(_item(c, spec) for c in sel.children)
        selection = Selection(items=items, text=spec)
    else:
        dims: list[tuple[str, Any]] = []
        for d in sel.children:
            name, value = str(d.children[0]), _item(d.children[1], spec)
            if any(n == name for n, _ in dims):
                raise RankSpecError(f"{spec}: dimension {name!r} is given twice")
            dims.append((name, value))
        selection = Selection(dims=tuple(dims), text=spec)
    return str(actor), selection, str(command).strip()


def _item(node: Any, spec: str) -> Any:
    if not hasattr(node, "data"):  # a RANK token
        return int(node)
    start, stop, step = (None if c is None else int(c) for c in node.children)
    if step == 0:
        raise RankSpecError(f"{spec}: a slice step cannot be zero")
    return Span(start, stop, step)


def _near(name: str, labels: Sequence[str]) -> str | None:
    import difflib

    m = difflib.get_close_matches(name, list(labels), n=1, cutoff=0.6)
    return m[0] if m else None


def compact(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(out)
