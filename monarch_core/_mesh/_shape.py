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

Where they live: :class:`Extent` and :class:`Region` in ``_region`` (the
arithmetic of ``Region.slice``/``rename``/``split`` in ``_select``),
:class:`Point` in ``_point``, the argument checks in ``_checks``, and
:class:`MeshTrait` here; import all four from this module.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TypeVar

from monarch_core._mesh._point import Point
from monarch_core._mesh._region import Extent, Region

__all__ = ["Extent", "Point", "Region", "MeshTrait"]

_builtin_slice = slice

_M = TypeVar("_M", bound="MeshTrait")


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
            n *= extent.sizes[extent._position(name, type(self).__name__)]
        return n

    @property
    def sizes(self) -> dict[str, int]:
        """``{label: size}`` for every dimension, in order."""
        return self._region.extent.as_dict()

    @property
    def extent(self) -> Extent:
        """The :class:`Extent` (labels and sizes) of this mesh."""
        return self._region.extent
