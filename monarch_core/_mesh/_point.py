"""One rank of an extent: :class:`Point`, and the row-major rank of a
coordinate mapping (``_rank_from_coords``, also ``ValueMesh.item``'s)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from monarch_core._mesh._checks import _as_int, _format_dict, _Frozen, _unravel
from monarch_core._mesh._region import Extent

__all__ = ["Point"]


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
        parts = [f"{what} {names}" for what, names in (("missing", missing), ("unknown", extra)) if names]
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
            c = tuple(_unravel(self._rank, self._extent.sizes))
            _point_set_coords(self, c)
        return c

    def size(self, label: str) -> int:
        """Size of dimension ``label`` in the extent (``KeyError`` if unknown)."""
        return self._extent[label]

    def __getitem__(self, label: str) -> int:
        return self.coords[self._extent._position(label, "Point")]

    def __contains__(self, label: object) -> bool:
        return label in self._extent

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent.labels)

    def __len__(self) -> int:
        return len(self._extent.labels)

    def _key(self) -> tuple[Any, ...]:
        return (self._rank, self._extent)

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


# Direct slot setters: bypass the immutability guard on the hot path
# (ValueMesh.items() builds one Point per element).
_point_set_rank = Point.__dict__["_rank"].__set__
_point_set_extent = Point.__dict__["_extent"].__set__
_point_set_coords = Point.__dict__["_coords"].__set__
