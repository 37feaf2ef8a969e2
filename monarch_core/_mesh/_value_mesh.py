"""``ValueMesh``: a mesh of plain values, e.g. the results of ``call()``."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from monarch_core._mesh._checks import _as_int
from monarch_core._mesh._point import _rank_from_coords
from monarch_core._mesh._shape import Extent, MeshTrait, Point, Region

__all__ = ["ValueMesh"]

R = TypeVar("R")

_MISSING: Any = object()


class ValueMesh(MeshTrait, Generic[R]):
    """A mesh holding one value per point.

    ``ValueMesh(shape, values)``: ``values`` are given in row-major order of
    ``shape`` (an :class:`Extent`, or a :class:`Region` of which only the
    labels and sizes are used) and ``len(values)`` must equal its number of
    elements (``ValueError`` otherwise).

    Contract:
      * Construction is O(1) beyond the length check: a ``list`` or
        ``tuple`` of values is kept by reference, not copied, so callers
        must not mutate it afterwards.  Other sequences are copied once.
      * ``slice``/``rename``/``split``/``flatten`` return views sharing the
        same values storage.
      * Equality compares extents and row-major values; value meshes are
        unhashable.
      * Pickling stores the extent and the materialised row-major values, so
        a pickled view does not drag the whole underlying storage along.
      * Iterating a value mesh (``for point, value in vm:``) yields the
        same ``(Point, value)`` pairs as :meth:`items`, in rank order, as in
        the reference; :meth:`values` gives the values alone.
    """

    __slots__ = ("_values", "_vm_region")

    _values: Sequence[R]
    _vm_region: Region

    def __init__(self, shape: Extent | Region, values: Sequence[R]) -> None:
        if isinstance(shape, Region):
            extent = shape.extent
        elif isinstance(shape, Extent):
            extent = shape
        else:
            raise TypeError(
                f"ValueMesh shape must be an Extent or a Region, got "
                f"{type(shape).__name__}"
            )
        if not isinstance(values, (list, tuple)):
            values = list(values)
        if len(values) != extent.nelements:
            raise ValueError(
                f"ValueMesh of extent {extent} needs {extent.nelements} values "
                f"(one per element, row-major), got {len(values)}"
            )
        self._values = values
        self._vm_region = extent.region

    # -- MeshTrait hooks ----------------------------------------------------

    @property
    def _region(self) -> Region:
        return self._vm_region

    def _with_region(self, region: Region) -> ValueMesh[R]:
        view: ValueMesh[R] = object.__new__(type(self))
        view._values = self._values
        view._vm_region = region
        return view

    # -- access -------------------------------------------------------------

    def item(self, **kwargs: int) -> R:
        """The value at the given coordinates.

        ``kwargs`` must name every dimension exactly once with an in-range
        coordinate (``0 .. size - 1``); missing, extra or out-of-range
        coordinates raise ``KeyError``, non-int coordinates ``TypeError``.
        For a zero-dimensional mesh ``item()`` returns its single value.
        """
        region = self._vm_region
        try:
            rank = _rank_from_coords(kwargs, region.extent, "ValueMesh.item")
        except IndexError as e:
            raise KeyError(str(e)) from None
        return self._values[region.root_rank(rank)]

    def get(self, rank: int) -> R:
        """The value at row-major ``rank`` (``IndexError`` unless in range)."""
        region = self._vm_region
        r = _as_int(rank, "ValueMesh.get rank")
        n = region.nelements
        if not 0 <= r < n:
            raise IndexError(
                f"ValueMesh.get: rank {r} is out of range for a mesh of {n} "
                f"elements {region.extent} (valid: 0..{n - 1})"
            )
        return self._values[region.root_rank(r)]

    def values(self) -> list[R]:
        """A new list of all values in row-major order."""
        region = self._vm_region
        vals = self._values
        n = region.nelements
        offset = region.offset
        stride = region._dense_stride
        if stride:  # dense with a step: one slice
            out = vals[offset : offset + n * stride : stride]
            return out if isinstance(out, list) else list(out)
        return [vals[r] for r in region.root_ranks()]

    def items(self) -> Generator[tuple[Point, R], None, None]:
        """Yield ``(Point, value)`` pairs in row-major order.

        Each point's extent is this mesh's extent.
        """
        extent = self._vm_region.extent
        make = Point._make
        for rank, value in enumerate(self.values()):
            yield make(rank, extent), value

    @staticmethod
    def from_indexed(shape: Extent, pairs: Iterable[tuple[int, R]]) -> ValueMesh[R]:
        """Build a mesh from ``(rank, value)`` pairs; the last write wins.

        Every rank ``0 .. nelements - 1`` must be filled (``ValueError``
        naming the missing ranks otherwise); ranks out of range raise
        ``IndexError``.
        """
        if isinstance(shape, Region):
            shape = shape.extent
        if not isinstance(shape, Extent):
            raise TypeError(
                f"ValueMesh.from_indexed shape must be an Extent, got "
                f"{type(shape).__name__}"
            )
        n = shape.nelements
        values: list[Any] = [_MISSING] * n
        for rank, value in pairs:
            r = _as_int(rank, "ValueMesh.from_indexed rank")
            if not 0 <= r < n:
                raise IndexError(
                    f"ValueMesh.from_indexed: rank {r} is out of range for extent "
                    f"{shape} with {n} elements (valid: 0..{n - 1})"
                )
            values[r] = value
        missing = [i for i, v in enumerate(values) if v is _MISSING]
        if missing:
            shown = ", ".join(map(str, missing[:20]))
            if len(missing) > 20:
                shown += f", ... ({len(missing)} in total)"
            raise ValueError(
                f"ValueMesh.from_indexed: no value given for ranks [{shown}] of "
                f"extent {shape}; every rank must be filled"
            )
        return ValueMesh(shape, values)

    # -- protocol -----------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[Point, R]]:
        """``(Point, value)`` pairs in rank (row-major) order, as :meth:`items`."""
        return self.items()

    def __len__(self) -> int:
        """Number of elements."""
        return self._vm_region.nelements

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, ValueMesh):
            return NotImplemented
        return self.extent == other.extent and self.values() == other.values()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ValueMesh({self.extent}, {self.values()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.extent, self.values()))
