"""Shapes of meshes: :class:`Extent`, :class:`Point`, :class:`Region`, :class:`MeshTrait`.

Terminology
-----------
* An **extent** is an ordered list of named dimensions with sizes, e.g.
  ``{'hosts': 2, 'gpus': 4}``.  Its elements are numbered by *rank* in
  row-major order (the last dimension varies fastest).
* A **point** is one rank of an extent, seen as a mapping from each label to
  its coordinate.
* A **region** is a strided view onto a flat list of *root* ranks (like an
  ``ndslice``): element ``rank`` of the region (row-major over its own
  extent) lives at root index ``offset + sum(coord_i * stride_i)``.  Slicing,
  renaming, splitting and flattening a region produce new regions that refer
  to the same root ranks, so views compose without copying.
* :class:`MeshTrait` is the mixin that gives every mesh (value meshes, actor
  meshes, proc meshes, ...) the same ``slice``/``rename``/``split``/``flatten``/
  ``size`` API on top of a :class:`Region`.

All classes here are immutable, hashable (except :class:`MeshTrait`
subclasses, which decide for themselves) and picklable.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

__all__ = ["Extent", "Point", "Region", "MeshTrait"]

_builtin_slice = slice

_M = TypeVar("_M", bound="MeshTrait")


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


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


def _check_label(label: object, what: str) -> str:
    """Validate that ``label`` is a non-empty ``str`` and return it."""
    if not isinstance(label, str):
        raise TypeError(
            f"{what} must be a str, got {type(label).__name__} ({label!r})"
        )
    if not label:
        raise ValueError(f"{what} must be a non-empty str")
    return label


def _product(values: Sequence[int]) -> int:
    n = 1
    for v in values:
        n *= v
    return n


def _dense_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides for ``sizes`` (the last dimension has stride 1)."""
    strides = [1] * len(sizes)
    acc = 1
    for i in range(len(sizes) - 1, -1, -1):
        strides[i] = acc
        acc *= sizes[i]
    return tuple(strides)


def _unknown_dim(owner: str, label: object, labels: Sequence[str]) -> NoReturn:
    raise TypeError(
        f"{owner} has no dimension {label!r}; its dimensions are {list(labels)}"
    )


def _format_dict(labels: Sequence[str], values: Sequence[object]) -> str:
    return "{" + ", ".join(f"{lab!r}: {v}" for lab, v in zip(labels, values)) + "}"


class _Frozen:
    """Base for immutable slotted value objects."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")


# --------------------------------------------------------------------------
# Extent
# --------------------------------------------------------------------------


class Extent(_Frozen):
    """An ordered set of named dimensions with sizes.

    Contract:
      * ``labels`` are unique, non-empty strings; ``sizes`` are ints >= 1 and
        there is exactly one size per label (``TypeError``/``ValueError``
        otherwise).
      * Immutable, hashable, picklable; equal iff labels and sizes are equal
        (order matters).
      * Ranks ``0 .. nelements - 1`` enumerate the elements in row-major
        order.  A zero-dimensional extent has exactly one element.
    """

    __slots__ = ("_labels", "_sizes", "_nelements", "_region", "_index")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]
    _nelements: int
    _region: Region | None
    _index: dict[str, int] | None

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        if isinstance(labels, str):
            raise TypeError(
                f"Extent labels must be a sequence of str, not a str ({labels!r});"
                f" did you mean [{labels!r}]?"
            )
        labels_t = tuple(labels)
        sizes_t = tuple(sizes)
        if len(labels_t) != len(sizes_t):
            raise ValueError(
                f"Extent has {len(labels_t)} labels {list(labels_t)} but "
                f"{len(sizes_t)} sizes {list(sizes_t)}; they must match one to one"
            )
        seen: set[str] = set()
        for label in labels_t:
            _check_label(label, "Extent label")
            if label in seen:
                raise ValueError(
                    f"Extent labels must be unique; {label!r} appears more than "
                    f"once in {list(labels_t)}"
                )
            seen.add(label)
        checked = []
        for label, size in zip(labels_t, sizes_t):
            s = _as_int(size, f"Extent size of dimension {label!r}")
            if s < 1:
                raise ValueError(
                    f"Extent size of dimension {label!r} must be >= 1, got {s}"
                )
            checked.append(s)
        self._init(labels_t, tuple(checked))

    def _init(self, labels: tuple[str, ...], sizes: tuple[int, ...]) -> None:
        object.__setattr__(self, "_labels", labels)
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_nelements", _product(sizes))
        object.__setattr__(self, "_region", None)
        object.__setattr__(self, "_index", None)

    @classmethod
    def _make(cls, labels: tuple[str, ...], sizes: tuple[int, ...]) -> Extent:
        """Build without validation (inputs are known to be valid)."""
        self = object.__new__(cls)
        self._init(labels, sizes)
        return self

    # -- attributes ---------------------------------------------------------

    @property
    def labels(self) -> tuple[str, ...]:
        """The dimension names, in order."""
        return self._labels

    @property
    def sizes(self) -> tuple[int, ...]:
        """The dimension sizes, in order."""
        return self._sizes

    @property
    def nelements(self) -> int:
        """Product of the sizes (1 for a zero-dimensional extent)."""
        return self._nelements

    @property
    def region(self) -> Region:
        """The dense row-major :class:`Region` of this extent (offset 0)."""
        r = self._region
        if r is None:
            r = Region._make(
                self._labels, self._sizes, _dense_strides(self._sizes), 0, self
            )
            object.__setattr__(self, "_region", r)
        return r

    def _label_index(self) -> dict[str, int]:
        idx = self._index
        if idx is None:
            idx = {label: i for i, label in enumerate(self._labels)}
            object.__setattr__(self, "_index", idx)
        return idx

    # -- mapping-like API ---------------------------------------------------

    def keys(self) -> list[str]:
        """The labels as a list."""
        return list(self._labels)

    def items(self) -> list[tuple[str, int]]:
        """``(label, size)`` pairs, in order."""
        return list(zip(self._labels, self._sizes))

    def as_dict(self) -> dict[str, int]:
        """A new ``{label: size}`` dict, in order."""
        return dict(zip(self._labels, self._sizes))

    def __getitem__(self, label: str) -> int:
        """Size of dimension ``label``; ``KeyError`` naming the known labels."""
        i = self._label_index().get(label) if isinstance(label, str) else None
        if i is None:
            raise KeyError(
                f"Extent has no dimension {label!r}; its dimensions are "
                f"{list(self._labels)}"
            )
        return self._sizes[i]

    def __contains__(self, label: object) -> bool:
        return isinstance(label, str) and label in self._label_index()

    def __len__(self) -> int:
        """Number of dimensions."""
        return len(self._labels)

    def __iter__(self) -> Iterator[str]:
        """Iterate over the labels."""
        return iter(self._labels)

    # -- value semantics ----------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Extent):
            return NotImplemented
        return self._labels == other._labels and self._sizes == other._sizes

    def __hash__(self) -> int:
        return hash((self._labels, self._sizes))

    def __repr__(self) -> str:
        return f"Extent({self})"

    def __str__(self) -> str:
        return _format_dict(self._labels, self._sizes)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Extent, (self._labels, self._sizes))


# --------------------------------------------------------------------------
# Point
# --------------------------------------------------------------------------


def _rank_from_coords(
    coords: Mapping[str, object], extent: Extent, owner: str
) -> int:
    """Row-major rank of ``coords`` in ``extent``.

    Raises ``KeyError`` if ``coords`` does not name exactly the dimensions of
    ``extent``, ``TypeError`` for non-int coordinates and ``IndexError`` for
    coordinates outside ``0 .. size - 1``.
    """
    labels = extent.labels
    if len(coords) != len(labels) or any(label not in coords for label in labels):
        missing = [label for label in labels if label not in coords]
        extra = [k for k in coords if k not in extent]
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"unknown {extra}")
        raise KeyError(
            f"{owner} needs exactly one coordinate per dimension {list(labels)}; "
            + " and ".join(parts)
        )
    rank = 0
    for label, size in zip(labels, extent.sizes):
        c = _as_int(coords[label], f"{owner} coordinate for dimension {label!r}")
        if not 0 <= c < size:
            raise IndexError(
                f"{owner}: coordinate {c} is out of range for dimension "
                f"{label!r} of size {size} (valid: 0..{size - 1})"
            )
        rank = rank * size + c
    return rank


class Point(_Frozen, Mapping[str, int]):
    """One rank of an :class:`Extent`, as a mapping ``label -> coordinate``.

    Contract:
      * ``0 <= rank < extent.nelements`` (``IndexError`` otherwise).
      * Coordinates are the row-major decomposition of ``rank``.
      * Equal/hash by ``(rank, extent)``; only equal to other ``Point``\\ s.
      * ``str(point)`` is ``{'hosts': 1/2, 'gpus': 1/4}`` (coordinate/size),
        the format used in error messages.
    """

    __slots__ = ("_rank", "_extent", "_coords")

    _rank: int
    _extent: Extent
    _coords: tuple[int, ...] | None

    def __init__(self, rank: int, extent: Extent) -> None:
        if not isinstance(extent, Extent):
            raise TypeError(
                f"Point extent must be an Extent, got {type(extent).__name__}"
            )
        r = _as_int(rank, "Point rank")
        if not 0 <= r < extent.nelements:
            raise IndexError(
                f"Point rank {r} is out of range for extent {extent} with "
                f"{extent.nelements} elements (valid: 0..{extent.nelements - 1})"
            )
        object.__setattr__(self, "_rank", r)
        object.__setattr__(self, "_extent", extent)
        object.__setattr__(self, "_coords", None)

    @classmethod
    def _make(cls, rank: int, extent: Extent) -> Point:
        """Build without validation (``rank`` is known to be in range)."""
        self = object.__new__(cls)
        _point_set_rank(self, rank)
        _point_set_extent(self, extent)
        _point_set_coords(self, None)
        return self

    @classmethod
    def from_coords(cls, coords: Mapping[str, int], extent: Extent) -> Point:
        """The point of ``extent`` with the given coordinates.

        ``coords`` must name every dimension of ``extent`` exactly once
        (``KeyError`` otherwise); coordinates must be ints (``TypeError``)
        in ``0 .. size - 1`` (``IndexError``).
        """
        if not isinstance(extent, Extent):
            raise TypeError(
                f"Point extent must be an Extent, got {type(extent).__name__}"
            )
        return cls._make(_rank_from_coords(coords, extent, "Point.from_coords"), extent)

    @property
    def rank(self) -> int:
        """Row-major rank of this point in its extent."""
        return self._rank

    @property
    def extent(self) -> Extent:
        """The extent this point belongs to."""
        return self._extent

    @property
    def coords(self) -> tuple[int, ...]:
        """Coordinates, one per dimension, in label order."""
        c = self._coords
        if c is None:
            sizes = self._extent.sizes
            out = [0] * len(sizes)
            r = self._rank
            for i in range(len(sizes) - 1, -1, -1):
                r, out[i] = divmod(r, sizes[i])
            c = tuple(out)
            object.__setattr__(self, "_coords", c)
        return c

    def size(self, label: str) -> int:
        """Size of dimension ``label`` in the extent (``KeyError`` if unknown)."""
        return self._extent[label]

    def __getitem__(self, label: str) -> int:
        i = self._extent._label_index().get(label) if isinstance(label, str) else None
        if i is None:
            raise KeyError(
                f"Point has no dimension {label!r}; its dimensions are "
                f"{list(self._extent.labels)}"
            )
        return self.coords[i]

    def __contains__(self, label: object) -> bool:
        return label in self._extent

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent.labels)

    def __len__(self) -> int:
        return len(self._extent.labels)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Point):
            return NotImplemented
        return self._rank == other._rank and self._extent == other._extent

    def __hash__(self) -> int:
        return hash((self._rank, self._extent))

    def __repr__(self) -> str:
        return (
            f"Point(rank={self._rank}, "
            f"coords={_format_dict(self._extent.labels, self.coords)}, "
            f"extent={self._extent})"
        )

    def __str__(self) -> str:
        e = self._extent
        return _format_dict(
            e.labels, [f"{c}/{s}" for c, s in zip(self.coords, e.sizes)]
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (Point, (self._rank, self._extent))


# Direct slot setters: bypass the immutability guard on the hot path
# (ValueMesh.items() builds one Point per element).
_point_set_rank = Point.__dict__["_rank"].__set__
_point_set_extent = Point.__dict__["_extent"].__set__
_point_set_coords = Point.__dict__["_coords"].__set__


# --------------------------------------------------------------------------
# Region
# --------------------------------------------------------------------------


class Region(_Frozen):
    """A strided view onto a flat list of root ranks (an ``ndslice``).

    Element ``rank`` of the region (row-major over ``extent``) is root index
    ``offset + sum(coord_i * stride_i)``.

    Contract:
      * ``labels``/``sizes`` obey the :class:`Extent` rules; ``strides`` are
        ints >= 0, one per dimension; ``offset`` is an int >= 0.
      * Immutable, hashable, picklable; equal iff labels, sizes, strides and
        offset are all equal.
      * ``slice``/``rename``/``split``/``flatten`` return new regions and
        never change which root ranks are reachable except as documented
        (``slice`` restricts them; the others preserve them in order).
    """

    __slots__ = (
        "_labels",
        "_sizes",
        "_strides",
        "_offset",
        "_extent",
        "_dense_stride",
        "_inverse",
    )

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]
    _strides: tuple[int, ...]
    _offset: int
    _extent: Extent | None
    _dense_stride: int | None
    _inverse: Any

    def __init__(
        self,
        labels: Sequence[str],
        sizes: Sequence[int],
        strides: Sequence[int],
        offset: int = 0,
    ) -> None:
        extent = Extent(labels, sizes)
        strides_t = tuple(strides)
        if len(strides_t) != len(extent.labels):
            raise ValueError(
                f"Region has {len(extent.labels)} dimensions {list(extent.labels)} "
                f"but {len(strides_t)} strides {list(strides_t)}; they must match "
                "one to one"
            )
        checked = []
        for label, stride in zip(extent.labels, strides_t):
            s = _as_int(stride, f"Region stride of dimension {label!r}")
            if s < 0:
                raise ValueError(
                    f"Region stride of dimension {label!r} must be >= 0, got {s}"
                )
            checked.append(s)
        off = _as_int(offset, "Region offset")
        if off < 0:
            raise ValueError(f"Region offset must be >= 0, got {off}")
        self._init(extent.labels, extent.sizes, tuple(checked), off, extent)

    def _init(
        self,
        labels: tuple[str, ...],
        sizes: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int,
        extent: Extent | None,
    ) -> None:
        osa = object.__setattr__
        osa(self, "_labels", labels)
        osa(self, "_sizes", sizes)
        osa(self, "_strides", strides)
        osa(self, "_offset", offset)
        osa(self, "_extent", extent)
        # Dense means the root ranks form the arithmetic progression
        # offset, offset + s, offset + 2s, ...; dimensions of size 1 don't
        # take part (their stride is irrelevant).
        dense: int | None = None
        expected: int | None = None
        for size, stride in zip(reversed(sizes), reversed(strides)):
            if size == 1:
                continue
            if expected is None:
                dense = stride
            elif stride != expected:
                dense = None
                break
            expected = stride * size
        else:
            if dense is None:
                dense = 1
        osa(self, "_dense_stride", dense)
        osa(self, "_inverse", None)

    @classmethod
    def _make(
        cls,
        labels: tuple[str, ...],
        sizes: tuple[int, ...],
        strides: tuple[int, ...],
        offset: int,
        extent: Extent | None = None,
    ) -> Region:
        """Build without validation (inputs are known to be valid)."""
        self = object.__new__(cls)
        self._init(labels, sizes, strides, offset, extent)
        return self

    # -- attributes ---------------------------------------------------------

    @property
    def labels(self) -> tuple[str, ...]:
        """Dimension names, in order."""
        return self._labels

    @property
    def sizes(self) -> tuple[int, ...]:
        """Dimension sizes, in order."""
        return self._sizes

    @property
    def strides(self) -> tuple[int, ...]:
        """Root-index stride of each dimension."""
        return self._strides

    @property
    def offset(self) -> int:
        """Root index of the element at rank 0."""
        return self._offset

    @property
    def extent(self) -> Extent:
        """``Extent(labels, sizes)``."""
        e = self._extent
        if e is None:
            e = Extent._make(self._labels, self._sizes)
            object.__setattr__(self, "_extent", e)
        return e

    @property
    def nelements(self) -> int:
        """Number of elements (product of sizes; 1 for zero dimensions)."""
        return self.extent.nelements

    # -- rank mapping -------------------------------------------------------

    def root_rank(self, rank: int) -> int:
        """Root index of element ``rank`` (row-major) of this region.

        ``IndexError`` unless ``0 <= rank < nelements``.
        """
        r = _as_int(rank, "Region.root_rank rank")
        n = self.nelements
        if not 0 <= r < n:
            raise IndexError(
                f"rank {r} is out of range for region {self.extent} with {n} "
                f"elements (valid: 0..{n - 1})"
            )
        root = self._offset
        sizes = self._sizes
        strides = self._strides
        for i in range(len(sizes) - 1, -1, -1):
            r, c = divmod(r, sizes[i])
            root += c * strides[i]
        return root

    def root_ranks(self) -> list[int]:
        """Root indices of all elements, in row-major order."""
        ds = self._dense_stride
        if ds is not None:
            n = self.nelements
            return list(range(self._offset, self._offset + n * ds, ds)) if ds else [
                self._offset
            ] * n
        roots = [self._offset]
        for size, stride in zip(self._sizes, self._strides):
            steps = [i * stride for i in range(size)]
            roots = [b + s for b in roots for s in steps]
        return roots

    def _build_inverse(self) -> Any:
        # Either ("greedy", [(dim, stride, size), ...] sorted by stride
        # descending) when the layout is a mixed radix (each stride exceeds
        # the span of all smaller-stride dimensions), or ("table", dict).
        dims = [
            (i, st, sz)
            for i, (sz, st) in enumerate(zip(self._sizes, self._strides))
            if sz > 1
        ]
        dims.sort(key=lambda d: d[1])
        span = 0
        nested = True
        for _, st, sz in dims:
            if st <= span:
                nested = False
                break
            span += st * (sz - 1)
        if nested:
            dims.reverse()
            inv: Any = ("greedy", dims)
        else:
            table: dict[int, int] = {}
            for idx, root in enumerate(self.root_ranks()):
                table.setdefault(root, idx)
            inv = ("table", table)
        object.__setattr__(self, "_inverse", inv)
        return inv

    def index_of_root(self, root: int) -> int | None:
        """Rank in this region of root index ``root``, or ``None`` if absent."""
        root = _as_int(root, "Region.index_of_root root")
        inv = self._inverse or self._build_inverse()
        if inv[0] == "table":
            return inv[1].get(root)
        r = root - self._offset
        if r < 0:
            return None
        coords = [0] * len(self._sizes)
        for i, stride, size in inv[1]:
            c = r // stride
            if c >= size:
                return None
            coords[i] = c
            r -= c * stride
        if r != 0:
            return None
        rank = 0
        for c, size in zip(coords, self._sizes):
            rank = rank * size + c
        return rank

    def contains_root(self, root: int) -> bool:
        """Whether root index ``root`` is an element of this region."""
        return self.index_of_root(root) is not None

    def is_dense(self) -> bool:
        """Whether the root ranks form one arithmetic progression.

        That is ``strides[i] == strides[i+1] * sizes[i+1]`` for all
        consecutive dimensions, ignoring dimensions of size 1 (whose stride
        never matters).  Zero- and one-dimensional regions are always dense.
        """
        return self._dense_stride is not None

    # -- transformations ----------------------------------------------------

    def slice(self, **kwargs: int | _builtin_slice) -> Region:
        """Select along named dimensions.

        Integer values remove dimensions (negative values count from the
        end), slice objects (``step > 0``) keep dimensions but restrict them.
        Example: ``region.slice(hosts=1, gpus=slice(0, 4, 2))``.
        """
        return self._slice(kwargs, "Region")

    def _slice(self, kwargs: Mapping[str, object], owner: str) -> Region:
        if not kwargs:
            return self
        idx = self.extent._label_index()
        for label in kwargs:
            if label not in idx:
                _unknown_dim(owner, label, self._labels)
        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        offset = self._offset
        for label, size, stride in zip(self._labels, self._sizes, self._strides):
            if label not in kwargs:
                labels.append(label)
                sizes.append(size)
                strides.append(stride)
                continue
            sel = kwargs[label]
            if isinstance(sel, _builtin_slice):
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
                labels.append(label)
                sizes.append(n)
                strides.append(stride * step)
                offset += start * stride
            elif isinstance(sel, bool) or not hasattr(type(sel), "__index__"):
                raise TypeError(
                    f"{owner}.slice: value for dimension {label!r} must be an int "
                    f"(removes the dimension) or a slice (keeps it), got "
                    f"{type(sel).__name__} ({sel!r})"
                )
            else:
                i = operator.index(sel)  # type: ignore[call-overload]
                j = i + size if i < 0 else i
                if not 0 <= j < size:
                    raise IndexError(
                        f"{owner}.slice: index {i} is out of range for dimension "
                        f"{label!r} of size {size} (valid: {-size}..{size - 1})"
                    )
                offset += j * stride
        return Region._make(tuple(labels), tuple(sizes), tuple(strides), offset)

    def rename(self, **kwargs: str) -> Region:
        """Rename dimensions (``old='new'``); others are kept unchanged."""
        return self._rename(kwargs, "Region")

    def _rename(self, kwargs: Mapping[str, object], owner: str) -> Region:
        if not kwargs:
            return self
        idx = self.extent._label_index()
        for old, new in kwargs.items():
            if old not in idx:
                _unknown_dim(owner, old, self._labels)
            _check_label(new, f"{owner}.rename: new name for dimension {old!r}")
        labels = tuple(kwargs.get(label, label) for label in self._labels)
        if len(set(labels)) != len(labels):
            dups = sorted({lab for lab in labels if labels.count(lab) > 1})
            raise ValueError(
                f"{owner}.rename: renaming {dict(kwargs)} would give duplicate "
                f"dimension names {dups} (result {list(labels)}); dimension names "
                "must be unique"
            )
        return Region._make(labels, self._sizes, self._strides, self._offset)  # type: ignore[arg-type]

    def split(self, **kwargs: Sequence[str] | int) -> Region:
        """Split dimensions into several; root ranks are unchanged.

        ``split(host=('dp', 'pp'), gpu=('tp', 'cp'), pp=16, cp=2)``: a
        tuple/list value splits that dimension into the named new
        dimensions (row-major); an int value gives the size of a new
        dimension.  Within each split at most one new dimension may omit its
        size, which is then derived.
        """
        return self._split(kwargs, "Region")

    def _split(self, kwargs: Mapping[str, object], owner: str) -> Region:
        if not kwargs:
            return self
        idx = self.extent._label_index()
        splits: dict[str, tuple[str, ...]] = {}
        given: dict[str, object] = {}
        for key, value in kwargs.items():
            if isinstance(value, (tuple, list)):
                if key not in idx:
                    _unknown_dim(owner, key, self._labels)
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
            s = _as_int(value, f"{owner}.split: size of new dimension {key!r}")
            if s < 1:
                raise ValueError(
                    f"{owner}.split: size of new dimension {key!r} must be >= 1, "
                    f"got {s}"
                )
            sizes_of[key] = s

        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        for label, size, stride in zip(self._labels, self._sizes, self._strides):
            if label not in splits:
                labels.append(label)
                sizes.append(size)
                strides.append(stride)
                continue
            news = splits[label]
            unsized = [n for n in news if n not in sizes_of]
            known = _product([sizes_of[n] for n in news if n in sizes_of])
            desc = f"{label}={news!r}"
            if len(unsized) > 1:
                raise ValueError(
                    f"{owner}.split: {desc} needs sizes for all but one of the new "
                    f"dimensions, but none given for {unsized}; pass e.g. "
                    f"{unsized[-1]}=<size>"
                )
            if unsized:
                if size % known:
                    raise ValueError(
                        f"{owner}.split: cannot split dimension {label!r} of size "
                        f"{size} as {desc}: the given sizes multiply to {known}, "
                        f"which does not divide {size}"
                    )
                new_sizes = [
                    sizes_of[n] if n in sizes_of else size // known for n in news
                ]
            else:
                if known != size:
                    raise ValueError(
                        f"{owner}.split: cannot split dimension {label!r} of size "
                        f"{size} as {desc}: the given sizes multiply to {known}, "
                        f"not {size}"
                    )
                new_sizes = [sizes_of[n] for n in news]
            sub = [stride * s for s in _dense_strides(new_sizes)]
            labels.extend(news)
            sizes.extend(new_sizes)
            strides.extend(sub)
        if len(set(labels)) != len(labels):
            dups = sorted({lab for lab in labels if labels.count(lab) > 1})
            raise ValueError(
                f"{owner}.split: the result would have duplicate dimension names "
                f"{dups} (result {labels}); dimension names must be unique"
            )
        return Region._make(tuple(labels), tuple(sizes), tuple(strides), self._offset)

    def flatten(self, name: str) -> Region:
        """Flatten all dimensions into one dimension ``name``.

        Only dense regions (see :meth:`is_dense`) can be flattened.
        """
        return self._flatten(name, "Region")

    def _flatten(self, name: str, owner: str) -> Region:
        _check_label(name, f"{owner}.flatten: name")
        ds = self._dense_stride
        if ds is None:
            raise ValueError(
                f"{owner}.flatten: flatten needs contiguous ranks (a dense region), "
                f"but {owner} {self.extent} has sizes {list(self._sizes)} with "
                f"strides {list(self._strides)}; slice to a dense subregion first "
                "(e.g. select a single index along the outer dimensions)"
            )
        return Region._make((name,), (self.nelements,), (ds,), self._offset)

    # -- value semantics ----------------------------------------------------

    def _key(self) -> tuple[Any, ...]:
        return (self._labels, self._sizes, self._strides, self._offset)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Region):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"Region(labels={list(self._labels)}, sizes={list(self._sizes)}, "
            f"strides={list(self._strides)}, offset={self._offset})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (Region, self._key())


# --------------------------------------------------------------------------
# MeshTrait
# --------------------------------------------------------------------------


class MeshTrait(abc.ABC):
    """Mixin giving a mesh the named-dimension API over a :class:`Region`.

    Subclasses implement two hooks:
      * ``_region`` (property): the :class:`Region` this mesh covers;
      * ``_with_region(region)``: a new view of the same kind over
        ``region`` (which refers to the same root ranks).

    Error messages name the concrete mesh type (``type(self).__name__``).
    """

    __slots__ = ()

    @property
    @abc.abstractmethod
    def _region(self) -> Region:
        """The region of root ranks this mesh covers."""

    @abc.abstractmethod
    def _with_region(self: _M, region: Region) -> _M:
        """A new mesh of the same kind covering ``region``."""

    def slice(self: _M, **kwargs: int | _builtin_slice) -> _M:
        """Select along named dimensions.

        Integer values remove dimensions, slice objects keep dimensions but
        restrict them.  Negative integers count from the end; slices must
        have ``step > 0`` and are clamped like Python slices, but must not
        select nothing.

        Examples: ``mesh.slice(batch=3, gpu=slice(2, 6))``

        Raises ``TypeError`` for an unknown dimension or a value that is
        neither int nor slice, ``IndexError`` for an out-of-range int and
        ``ValueError`` for an empty or non-positive-step slice.
        """
        if not kwargs:
            return self
        return self._with_region(self._region._slice(kwargs, type(self).__name__))

    def rename(self: _M, **kwargs: str) -> _M:
        """Returns a new mesh with some dimensions renamed.

        Dimensions not mentioned are retained:
        ``new_mesh = mesh.rename(host='dp', gpu='tp')``

        Raises ``TypeError`` for an unknown dimension and ``ValueError`` if
        the result would have duplicate dimension names.
        """
        if not kwargs:
            return self
        return self._with_region(self._region._rename(kwargs, type(self).__name__))

    def split(self: _M, **kwargs: Sequence[str] | int) -> _M:
        """Returns a new mesh with some dimensions of this mesh split.

        For instance, this call splits the host dimension into dp and pp
        dimensions.  The size of 'pp' is specified and the dimension size is
        derived from it:
        ``new_mesh = mesh.split(host=('dp', 'pp'), gpu=('tp', 'cp'), pp=16, cp=2)``

        Dimensions not specified will remain unchanged.  Ranks keep their
        row-major order.  Raises ``TypeError`` for an unknown dimension or a
        size given for a name that is not a new dimension, and
        ``ValueError`` when sizes are missing or do not divide.
        """
        if not kwargs:
            return self
        return self._with_region(self._region._split(kwargs, type(self).__name__))

    def flatten(self: _M, name: str) -> _M:
        """Returns a new mesh with all dimensions flattened into a single
        dimension with the given name.

        Currently this supports only dense meshes: that is, all ranks must be
        contiguous in the mesh (``ValueError`` otherwise; slice to a dense
        subregion first).
        """
        return self._with_region(self._region._flatten(name, type(self).__name__))

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """Returns the number of elements (total) of the subset of mesh asked for.

        If ``dim`` is None, returns the total number of elements in the mesh;
        a str gives that dimension's size; a sequence of names gives the
        product of their sizes.  An unknown dimension is a failed lookup, as
        in the reference: ``KeyError`` naming the mesh's dimensions (unlike
        :meth:`slice`, whose unknown dimensions are a ``TypeError``).
        """
        region = self._region
        if dim is None:
            return region.nelements
        extent = region.extent
        idx = extent._label_index()
        if isinstance(dim, str):
            names: Sequence[str] = (dim,)
        else:
            try:
                names = tuple(dim)
            except TypeError:
                raise TypeError(
                    f"{type(self).__name__}.size(dim): dim must be None, a dimension name or a "
                    f"sequence of names, got {type(dim).__name__} ({dim!r}); its dimensions are "
                    f"{list(extent.labels)}"
                ) from None
        n = 1
        for name in names:
            i = idx.get(name) if isinstance(name, str) else None
            if i is None:
                raise KeyError(
                    f"{type(self).__name__} has no dimension {name!r}; its dimensions are {list(extent.labels)}"
                )
            n *= extent.sizes[i]
        return n

    @property
    def sizes(self) -> dict[str, int]:
        """``{label: size}`` for every dimension, in order."""
        return self._region.extent.as_dict()

    @property
    def extent(self) -> Extent:
        """The :class:`Extent` (labels and sizes) of this mesh."""
        return self._region.extent
