"""Small compatibility helpers (Python 3.10 lacks exception groups and tomllib)."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):  # pragma: no cover - version dependent
    BaseExceptionGroup = BaseExceptionGroup  # noqa: A001,PLW0127
else:  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup  # type: ignore[no-redef]

__all__ = ["BaseExceptionGroup", "leaf_exceptions", "first_leaf"]


def leaf_exceptions(exc: BaseException) -> list[BaseException]:
    """Flatten nested exception groups into their leaf exceptions."""
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for e in exc.exceptions:
            out.extend(leaf_exceptions(e))
        return out
    return [exc]


def first_leaf(exc: BaseException, *, skip: tuple[type[BaseException], ...] = ()) -> BaseException:
    """The first leaf of ``exc`` that is not an instance of ``skip`` (or the first leaf)."""
    leaves = leaf_exceptions(exc)
    for e in leaves:
        if not isinstance(e, skip):
            return e
    return leaves[0] if leaves else exc
