"""The two halves of the shape data model, which refer to each other
(:attr:`Extent.region`, :attr:`Region.extent`): :class:`Extent`, named
dimensions with sizes, and :class:`Region`, a strided view onto a flat list
of root ranks.  The arithmetic of ``Region.slice``/``rename``/``split`` is
``_select``'s; see ``_shape`` for the terminology.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from monarch_core._mesh import _select
from monarch_core._mesh._checks import _as_count, _as_int, _check_label, _dense_strides, _format_dict, _Frozen, _unravel

__all__ = ["Extent", "Region"]

_builtin_slice = slice


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

    __slots__ = ("_labels", "_sizes", "_nelements", "_region")

    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]
    _nelements: int
    _region: Region | None

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
        checked = tuple(
            _as_count(size, f"Extent size of dimension {label!r}", 1)
            for label, size in zip(labels_t, sizes_t)
        )
        self._init(labels_t, checked)

    def _init(self, labels: tuple[str, ...], sizes: tuple[int, ...]) -> None:
        object.__setattr__(self, "_labels", labels)
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_nelements", math.prod(sizes))
        object.__setattr__(self, "_region", None)

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

    def _position(self, label: object, owner: str) -> int:
        """Index of dimension ``label``; ``KeyError`` naming ``owner`` and the dimensions."""
        if label not in self:
            raise KeyError(f"{owner} has no dimension {label!r}; its dimensions are {list(self._labels)}")
        return self._labels.index(label)

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
        return self._sizes[self._position(label, "Extent")]

    def __contains__(self, label: object) -> bool:
        return isinstance(label, str) and label in self._labels

    def __len__(self) -> int:
        """Number of dimensions."""
        return len(self._labels)

    def __iter__(self) -> Iterator[str]:
        """Iterate over the labels."""
        return iter(self._labels)

    # -- value semantics ----------------------------------------------------

    def _key(self) -> tuple[Any, ...]:
        return (self._labels, self._sizes)

    def __repr__(self) -> str:
        return f"Extent({self})"

    def __str__(self) -> str:
        return _format_dict(self._labels, self._sizes)


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
    _extent: Extent
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
        checked = tuple(
            _as_count(stride, f"Region stride of dimension {label!r}", 0)
            for label, stride in zip(extent.labels, strides_t)
        )
        off = _as_count(offset, "Region offset", 0)
        self._init(extent.labels, extent.sizes, checked, off, extent)

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
        osa(self, "_extent", Extent._make(labels, sizes) if extent is None else extent)
        # Dense means the root ranks form the arithmetic progression
        # offset, offset + s, offset + 2s, ...; dimensions of size 1 don't
        # take part (their stride is irrelevant).
        dims = [(size, stride) for size, stride in zip(sizes, strides) if size > 1]
        dense: int | None = dims[-1][1] if dims else 1
        if any(outer[1] != inner[1] * inner[0] for outer, inner in zip(dims, dims[1:])):
            dense = None
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
        return self._extent

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
        return self._offset + sum(c * s for c, s in zip(_unravel(r, self._sizes), self._strides))

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
        # The greedy decoding, [(stride, size, rank stride), ...] by stride
        # descending, when the layout is a mixed radix (each stride exceeds
        # the span of all smaller-stride dimensions); else a root -> rank dict.
        dims = sorted(
            (stride, size, rank_stride)
            for size, stride, rank_stride in zip(self._sizes, self._strides, _dense_strides(self._sizes))
            if size > 1
        )
        inv: Any = dims[::-1]
        span = 0
        for stride, size, _ in dims:
            if stride <= span:
                inv = {}
                for rank, root in enumerate(self.root_ranks()):
                    inv.setdefault(root, rank)
                break
            span += stride * (size - 1)
        object.__setattr__(self, "_inverse", inv)
        return inv

    def index_of_root(self, root: int) -> int | None:
        """Rank in this region of root index ``root``, or ``None`` if absent."""
        root = _as_int(root, "Region.index_of_root root")
        inv = self._inverse if self._inverse is not None else self._build_inverse()
        if isinstance(inv, dict):
            return inv.get(root)
        r = root - self._offset
        if r < 0:
            return None
        rank = 0
        for stride, size, rank_stride in inv:
            c = r // stride
            if c >= size:
                return None
            rank += c * rank_stride
            r -= c * stride
        return rank if r == 0 else None

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
        return Region._make(*_select.sliced(self, kwargs, owner))

    def rename(self, **kwargs: str) -> Region:
        """Rename dimensions (``old='new'``); others are kept unchanged."""
        return self._rename(kwargs, "Region")

    def _rename(self, kwargs: Mapping[str, object], owner: str) -> Region:
        if not kwargs:
            return self
        labels = _select.renamed(self, kwargs, owner)
        return Region._make(labels, self._sizes, self._strides, self._offset)

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
        return Region._make(*_select.split(self, kwargs, owner), self._offset)

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

    def __repr__(self) -> str:
        return (
            f"Region(labels={list(self._labels)}, sizes={list(self._sizes)}, "
            f"strides={list(self._strides)}, offset={self._offset})"
        )
