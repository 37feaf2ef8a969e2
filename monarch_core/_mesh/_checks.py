"""Argument checks and small helpers shared by the mesh shape modules, and
``_Frozen``, the base of their immutable value objects."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, NoReturn


def _as_int(value: object, what: str) -> int:
    """Return ``value`` as a Python ``int``.

    Accepts ints and objects implementing ``__index__`` (e.g. numpy
    integers); rejects ``bool`` and everything else with ``TypeError``
    mentioning ``what``.
    """
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got bool ({value!r})")
    if type(value) is int:
        return value
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{what} must be an int, got {type(value).__name__} ({value!r})"
        ) from None


def _as_count(value: object, what: str, minimum: int) -> int:
    """``value`` as an ``int`` (see :func:`_as_int`); ``ValueError`` below ``minimum``."""
    n = _as_int(value, what)
    if n < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {n}")
    return n


def _check_label(label: object, what: str) -> str:
    """Validate that ``label`` is a non-empty ``str`` and return it."""
    if not isinstance(label, str):
        raise TypeError(
            f"{what} must be a str, got {type(label).__name__} ({label!r})"
        )
    if not label:
        raise ValueError(f"{what} must be a non-empty str")
    return label


def _dense_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides for ``sizes`` (the last dimension has stride 1)."""
    strides = [1] * len(sizes)
    acc = 1
    for i in range(len(sizes) - 1, -1, -1):
        strides[i] = acc
        acc *= sizes[i]
    return tuple(strides)


def _unravel(rank: int, sizes: Sequence[int]) -> list[int]:
    """The row-major coordinates of ``rank`` over ``sizes``."""
    coords = [0] * len(sizes)
    for i in range(len(sizes) - 1, -1, -1):
        rank, coords[i] = divmod(rank, sizes[i])
    return coords


def _unknown_dim(owner: str, label: object, labels: Sequence[str]) -> NoReturn:
    raise TypeError(
        f"{owner} has no dimension {label!r}; its dimensions are {list(labels)}"
    )


def _format_dict(labels: Sequence[str], values: Sequence[object]) -> str:
    return "{" + ", ".join(f"{lab!r}: {v}" for lab, v in zip(labels, values)) + "}"


class _Frozen:
    """Base for immutable slotted value objects: equal (to objects of their
    own type), hashed and pickled by ``_key()``, the arguments that rebuild them."""

    __slots__ = ()

    def _key(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, type(self)):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._key())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")
