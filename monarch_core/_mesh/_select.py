"""The arithmetic of :meth:`Region.slice`, :meth:`Region.rename` and
:meth:`Region.split`: a region's new labels, sizes, strides (and offset)
from its old ones and the caller's keyword arguments, with the errors that
name the mesh type (``owner``) the user called.

A region in, plain tuples out; ``_region`` wraps them into regions (this
module does not import it).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any, cast

from monarch_core._mesh._checks import _as_count, _as_int, _check_label, _dense_strides, _unknown_dim

__all__ = ["renamed", "sliced", "split"]


def sliced(
    region: Any, kwargs: Mapping[str, object], owner: str
) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...], int]:
    """Labels, sizes, strides and offset of ``region.slice(**kwargs)``."""
    for label in kwargs:
        if label not in region.extent:
            _unknown_dim(owner, label, region.labels)
    dims: list[tuple[str, int, int]] = []
    offset = region.offset
    for label, size, stride in zip(region.labels, region.sizes, region.strides):
        if label not in kwargs:
            dims.append((label, size, stride))
            continue
        sel = kwargs[label]
        if isinstance(sel, slice):
            if sel.step is not None:
                step = _as_int(
                    sel.step, f"{owner}.slice: step for dimension {label!r}"
                )
                if step <= 0:
                    raise ValueError(
                        f"{owner}.slice: step for dimension {label!r} must be "
                        f"> 0, got {step}; reversed or zero steps are not "
                        "supported"
                    )
            for part in (sel.start, sel.stop):
                if part is not None:
                    _as_int(
                        part,
                        f"{owner}.slice: slice bound for dimension {label!r}",
                    )
            start, stop, step = sel.indices(size)
            n = len(range(start, stop, step))
            if n == 0:
                raise ValueError(
                    f"{owner}.slice: {label}={sel!r} selects no "
                    f"elements of dimension {label!r} of size {size}; a mesh "
                    "dimension cannot be empty"
                )
            dims.append((label, n, stride * step))
            offset += start * stride
        elif isinstance(sel, bool) or not hasattr(type(sel), "__index__"):
            raise TypeError(
                f"{owner}.slice: value for dimension {label!r} must be an int "
                f"(removes the dimension) or a slice (keeps it), got "
                f"{type(sel).__name__} ({sel!r})"
            )
        else:
            i = operator.index(sel)  # type: ignore[arg-type]  # (an __index__ type: checked above, which mypy cannot narrow by)
            j = i + size if i < 0 else i
            if not 0 <= j < size:
                raise IndexError(
                    f"{owner}.slice: index {i} is out of range for dimension "
                    f"{label!r} of size {size} (valid: {-size}..{size - 1})"
                )
            offset += j * stride
    return (*_columns(dims), offset)


def renamed(region: Any, kwargs: Mapping[str, object], owner: str) -> tuple[str, ...]:
    """Labels of ``region.rename(**kwargs)`` (sizes and strides are kept)."""
    for old, new in kwargs.items():
        if old not in region.extent:
            _unknown_dim(owner, old, region.labels)
        _check_label(new, f"{owner}.rename: new name for dimension {old!r}")
    labels = tuple(cast(str, kwargs.get(label, label)) for label in region.labels)  # (new names: checked above)
    if len(set(labels)) != len(labels):
        dups = sorted({lab for lab in labels if labels.count(lab) > 1})
        raise ValueError(
            f"{owner}.rename: renaming {dict(kwargs)} would give duplicate "
            f"dimension names {dups} (result {list(labels)}); dimension names "
            "must be unique"
        )
    return labels  # type: ignore[return-value]


def split(
    region: Any, kwargs: Mapping[str, object], owner: str
) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """Labels, sizes and strides of ``region.split(**kwargs)`` (the offset is kept)."""
    splits: dict[str, tuple[str, ...]] = {}
    given: dict[str, object] = {}
    for key, value in kwargs.items():
        if isinstance(value, (tuple, list)):
            if key not in region.extent:
                _unknown_dim(owner, key, region.labels)
            if not value:
                raise ValueError(
                    f"{owner}.split: dimension {key!r} must be split into at "
                    "least one new dimension, got an empty sequence"
                )
            for new in value:
                _check_label(new, f"{owner}.split: new dimension name in {key}=")
            splits[key] = tuple(value)
        else:
            given[key] = value
    new_of: dict[str, str] = {}
    for old, news in splits.items():
        for new in news:
            if new in new_of:
                raise ValueError(
                    f"{owner}.split: new dimension {new!r} appears more than "
                    "once; new dimension names must be unique"
                )
            new_of[new] = old
    sizes_of: dict[str, int] = {}
    for key, value in given.items():
        if key not in new_of:
            raise TypeError(
                f"{owner}.split: {key}={value!r} gives a size, but {key!r} is "
                "not one of the new dimensions being created "
                f"{list(new_of)}; to split a dimension pass a tuple of new "
                "names and sizes for them, e.g. split(host=('dp', 'pp'), pp=2)"
            )
        sizes_of[key] = _as_count(value, f"{owner}.split: size of new dimension {key!r}", 1)

    dims: list[tuple[str, int, int]] = []
    for label, size, stride in zip(region.labels, region.sizes, region.strides):
        if label not in splits:
            dims.append((label, size, stride))
            continue
        news = splits[label]
        unsized = [n for n in news if n not in sizes_of]
        known = math.prod([sizes_of[n] for n in news if n in sizes_of])
        desc = f"{label}={news!r}"
        if len(unsized) > 1:
            raise ValueError(
                f"{owner}.split: {desc} needs sizes for all but one of the new "
                f"dimensions, but none given for {unsized}; pass e.g. "
                f"{unsized[-1]}=<size>"
            )
        if unsized and size % known:
            raise ValueError(
                f"{owner}.split: cannot split dimension {label!r} of size "
                f"{size} as {desc}: the given sizes multiply to {known}, "
                f"which does not divide {size}"
            )
        if not unsized and known != size:
            raise ValueError(
                f"{owner}.split: cannot split dimension {label!r} of size "
                f"{size} as {desc}: the given sizes multiply to {known}, "
                f"not {size}"
            )
        new_sizes = [sizes_of.get(n, size // known) for n in news]  # (at most one is derived)
        dims.extend(zip(news, new_sizes, [stride * s for s in _dense_strides(new_sizes)]))
    labels, sizes, strides = _columns(dims)
    if len(set(labels)) != len(labels):
        dups = sorted({lab for lab in labels if labels.count(lab) > 1})
        raise ValueError(
            f"{owner}.split: the result would have duplicate dimension names "
            f"{dups} (result {list(labels)}); dimension names must be unique"
        )
    return labels, sizes, strides


def _columns(dims: list[tuple[str, int, int]]) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """``[(label, size, stride), ...]`` as the tuples of the labels, the sizes and the strides."""
    labels, sizes, strides = zip(*dims) if dims else ((), (), ())
    return labels, sizes, strides
