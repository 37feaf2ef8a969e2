"""Tests for monarch_core._mesh._shape: Extent, Point, Region, MeshTrait."""

from __future__ import annotations

import itertools
import pickle

import pytest

from monarch_core._mesh._shape import Extent, MeshTrait, Point, Region

pytestmark = pytest.mark.unit


def hg() -> Extent:
    return Extent(["hosts", "gpus"], [2, 4])


# ---------------------------------------------------------------- Extent


class TestExtent:
    def test_basic_attributes(self) -> None:
        e = hg()
        assert e.labels == ("hosts", "gpus")
        assert e.sizes == (2, 4)
        assert e.nelements == 8
        assert len(e) == 2
        assert list(e) == ["hosts", "gpus"]
        assert e.keys() == ["hosts", "gpus"]
        assert e.items() == [("hosts", 2), ("gpus", 4)]
        assert e.as_dict() == {"hosts": 2, "gpus": 4}
        assert e["hosts"] == 2
        assert e["gpus"] == 4
        assert "gpus" in e
        assert "x" not in e
        assert 3 not in e

    def test_accepts_tuples_and_generators(self) -> None:
        e = Extent(("a", "b"), (x for x in (3, 5)))
        assert e.labels == ("a", "b")
        assert e.sizes == (3, 5)
        assert isinstance(e.labels, tuple) and isinstance(e.sizes, tuple)

    def test_zero_dims(self) -> None:
        e = Extent([], [])
        assert e.nelements == 1
        assert len(e) == 0
        assert e.keys() == []
        assert e.as_dict() == {}
        assert repr(e) == "Extent({})"
        assert str(e) == "{}"
        assert e.region == Region([], [], [], 0)
        assert e.region.root_ranks() == [0]

    def test_repr_str(self) -> None:
        assert repr(hg()) == "Extent({'hosts': 2, 'gpus': 4})"
        assert str(hg()) == "{'hosts': 2, 'gpus': 4}"

    def test_region(self) -> None:
        r = Extent(["a", "b", "c"], [2, 3, 4]).region
        assert r.labels == ("a", "b", "c")
        assert r.sizes == (2, 3, 4)
        assert r.strides == (12, 4, 1)
        assert r.offset == 0
        assert r.root_ranks() == list(range(24))

    def test_eq_hash(self) -> None:
        assert hg() == hg()
        assert hash(hg()) == hash(hg())
        assert hg() != Extent(["gpus", "hosts"], [4, 2])
        assert hg() != Extent(["hosts", "gpus"], [2, 3])
        assert hg() != {"hosts": 2, "gpus": 4}
        assert len({hg(), hg(), Extent(["x"], [1])}) == 2

    def test_immutable(self) -> None:
        e = hg()
        with pytest.raises(AttributeError, match="immutable"):
            e._labels = ("x",)  # type: ignore[misc]
        with pytest.raises(AttributeError):
            e.labels = ("x",)  # type: ignore[misc]
        with pytest.raises(AttributeError, match="immutable"):
            del e._sizes

    def test_pickle(self) -> None:
        e = hg()
        e2 = pickle.loads(pickle.dumps(e))
        assert e2 == e
        assert e2.region == e.region  # caches work after unpickling

    def test_getitem_unknown(self) -> None:
        with pytest.raises(KeyError) as ei:
            hg()["x"]
        assert "'x'" in str(ei.value)
        assert "['hosts', 'gpus']" in str(ei.value)
        with pytest.raises(KeyError):
            hg()[0]  # type: ignore[index]

    def test_length_mismatch(self) -> None:
        with pytest.raises(ValueError, match="2 labels .* but 1 sizes"):
            Extent(["a", "b"], [1])

    def test_labels_as_str_rejected(self) -> None:
        with pytest.raises(TypeError, match="not a str"):
            Extent("ab", [1, 2])

    def test_label_not_str(self) -> None:
        with pytest.raises(TypeError, match="label must be a str, got int"):
            Extent([1], [2])  # type: ignore[list-item]

    def test_label_empty(self) -> None:
        with pytest.raises(ValueError, match="non-empty"):
            Extent([""], [2])

    def test_label_duplicate(self) -> None:
        with pytest.raises(ValueError, match="unique; 'a' appears more than once"):
            Extent(["a", "b", "a"], [1, 2, 3])

    def test_size_not_int(self) -> None:
        with pytest.raises(TypeError, match="size of dimension 'a' must be an int, got float"):
            Extent(["a"], [2.0])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="got bool"):
            Extent(["a"], [True])

    def test_size_too_small(self) -> None:
        with pytest.raises(ValueError, match="'a' must be >= 1, got 0"):
            Extent(["a"], [0])
        with pytest.raises(ValueError, match="got -3"):
            Extent(["a"], [-3])

    def test_index_like_sizes_accepted(self) -> None:
        class Idx:
            def __index__(self) -> int:
                return 3

        e = Extent(["a"], [Idx()])  # type: ignore[list-item]
        assert e.sizes == (3,)
        assert type(e.sizes[0]) is int


# ---------------------------------------------------------------- Point


class TestPoint:
    def test_coords_row_major(self) -> None:
        e = hg()
        p = Point(5, e)
        assert p.rank == 5
        assert p.extent is e
        assert p.coords == (1, 1)
        assert p["hosts"] == 1
        assert p["gpus"] == 1
        assert dict(p) == {"hosts": 1, "gpus": 1}
        assert list(p) == ["hosts", "gpus"]
        assert len(p) == 2
        assert "hosts" in p and "x" not in p
        assert list(p.keys()) == ["hosts", "gpus"]
        assert list(p.values()) == [1, 1]
        assert list(p.items()) == [("hosts", 1), ("gpus", 1)]
        assert p.get("x") is None
        assert [Point(r, e).coords for r in range(8)] == list(
            itertools.product(range(2), range(4))
        )

    def test_is_mapping(self) -> None:
        from collections.abc import Mapping

        assert isinstance(Point(0, hg()), Mapping)

    def test_size(self) -> None:
        p = Point(3, hg())
        assert p.size("hosts") == 2
        assert p.size("gpus") == 4
        with pytest.raises(KeyError, match="no dimension 'x'"):
            p.size("x")

    def test_getitem_unknown(self) -> None:
        with pytest.raises(KeyError) as ei:
            Point(3, hg())["x"]
        assert "no dimension 'x'" in str(ei.value)
        assert "['hosts', 'gpus']" in str(ei.value)

    def test_str_repr(self) -> None:
        p = Point(5, hg())
        assert str(p) == "{'hosts': 1/2, 'gpus': 1/4}"
        assert repr(p) == (
            "Point(rank=5, coords={'hosts': 1, 'gpus': 1}, "
            "extent={'hosts': 2, 'gpus': 4})"
        )

    def test_zero_dim(self) -> None:
        p = Point(0, Extent([], []))
        assert p.coords == ()
        assert dict(p) == {}
        assert str(p) == "{}"

    def test_eq_hash(self) -> None:
        assert Point(5, hg()) == Point(5, hg())
        assert hash(Point(5, hg())) == hash(Point(5, hg()))
        assert Point(5, hg()) != Point(4, hg())
        assert Point(1, hg()) != Point(1, Extent(["hosts", "gpus"], [4, 2]))
        assert Point(5, hg()) != {"hosts": 1, "gpus": 1}
        assert len({Point(5, hg()), Point(5, hg()), Point(0, hg())}) == 2

    def test_rank_out_of_range(self) -> None:
        with pytest.raises(IndexError, match="rank 8 is out of range .* 8 elements"):
            Point(8, hg())
        with pytest.raises(IndexError, match="rank -1"):
            Point(-1, hg())

    def test_bad_types(self) -> None:
        with pytest.raises(TypeError, match="Point rank must be an int, got str"):
            Point("1", hg())  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be an Extent, got dict"):
            Point(0, {"a": 1})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be an Extent"):
            Point.from_coords({}, {"a": 1})  # type: ignore[arg-type]

    def test_immutable(self) -> None:
        with pytest.raises(AttributeError):
            Point(0, hg())._rank = 1  # type: ignore[misc]

    def test_pickle(self) -> None:
        p = Point(6, hg())
        p2 = pickle.loads(pickle.dumps(p))
        assert p2 == p
        assert p2.coords == (1, 2)

    def test_from_coords(self) -> None:
        e = hg()
        p = Point.from_coords({"gpus": 3, "hosts": 1}, e)
        assert p == Point(7, e)
        for r in range(8):
            assert Point.from_coords(dict(Point(r, e)), e).rank == r
        assert Point.from_coords({}, Extent([], [])).rank == 0

    def test_from_coords_errors(self) -> None:
        e = hg()
        with pytest.raises(KeyError) as ei:
            Point.from_coords({"hosts": 1}, e)
        assert "missing ['gpus']" in str(ei.value)
        with pytest.raises(KeyError) as ei:
            Point.from_coords({"hosts": 1, "gpus": 0, "x": 0}, e)
        assert "unknown ['x']" in str(ei.value)
        with pytest.raises(IndexError, match="coordinate 4 is out of range for dimension 'gpus' of size 4"):
            Point.from_coords({"hosts": 1, "gpus": 4}, e)
        with pytest.raises(IndexError, match="coordinate -1"):
            Point.from_coords({"hosts": -1, "gpus": 0}, e)
        with pytest.raises(TypeError, match="coordinate for dimension 'gpus' must be an int"):
            Point.from_coords({"hosts": 1, "gpus": "0"}, e)  # type: ignore[dict-item]


# ---------------------------------------------------------------- Region


def brute_roots(r: Region) -> list[int]:
    """Reference implementation of root_ranks()."""
    out = []
    for coords in itertools.product(*(range(s) for s in r.sizes)):
        out.append(r.offset + sum(c * s for c, s in zip(coords, r.strides)))
    return out


class TestRegionBasics:
    def test_attributes(self) -> None:
        r = Region(["a", "b"], [2, 3], [10, 2], 5)
        assert r.labels == ("a", "b")
        assert r.sizes == (2, 3)
        assert r.strides == (10, 2)
        assert r.offset == 5
        assert r.extent == Extent(["a", "b"], [2, 3])
        assert r.nelements == 6
        assert r.root_ranks() == [5, 7, 9, 15, 17, 19]
        assert [r.root_rank(i) for i in range(6)] == r.root_ranks()
        assert repr(r) == "Region(labels=['a', 'b'], sizes=[2, 3], strides=[10, 2], offset=5)"

    def test_default_offset(self) -> None:
        assert Region(["a"], [3], [1]).offset == 0

    def test_eq_hash_pickle(self) -> None:
        r = Region(["a", "b"], [2, 3], [10, 2], 5)
        assert r == Region(("a", "b"), (2, 3), (10, 2), 5)
        assert hash(r) == hash(Region(("a", "b"), (2, 3), (10, 2), 5))
        assert r != Region(["a", "b"], [2, 3], [10, 2], 4)
        assert r != Region(["a", "b"], [2, 3], [10, 1], 5)
        assert r != r.extent
        r2 = pickle.loads(pickle.dumps(r))
        assert r2 == r
        assert r2.root_ranks() == r.root_ranks()
        with pytest.raises(AttributeError):
            r._offset = 3  # type: ignore[misc]

    def test_validation(self) -> None:
        with pytest.raises(ValueError, match="2 dimensions .* but 1 strides"):
            Region(["a", "b"], [2, 3], [1])
        with pytest.raises(ValueError, match="2 labels .* but 1 sizes"):
            Region(["a", "b"], [2], [1, 1])
        with pytest.raises(TypeError, match="stride of dimension 'a' must be an int"):
            Region(["a"], [2], [1.5])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="stride of dimension 'a' must be >= 0"):
            Region(["a"], [2], [-1])
        with pytest.raises(TypeError, match="offset must be an int"):
            Region(["a"], [2], [1], "0")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="offset must be >= 0"):
            Region(["a"], [2], [1], -1)
        with pytest.raises(ValueError, match="unique"):
            Region(["a", "a"], [2, 2], [2, 1])

    def test_root_rank_errors(self) -> None:
        r = hg().region
        with pytest.raises(IndexError, match="rank 8 is out of range .* 8 elements"):
            r.root_rank(8)
        with pytest.raises(IndexError, match="rank -1"):
            r.root_rank(-1)
        with pytest.raises(TypeError, match="must be an int"):
            r.root_rank("1")  # type: ignore[arg-type]

    def test_zero_dim(self) -> None:
        r = Region([], [], [], 7)
        assert r.nelements == 1
        assert r.root_ranks() == [7]
        assert r.root_rank(0) == 7
        assert r.index_of_root(7) == 0
        assert r.index_of_root(6) is None
        assert r.is_dense()
        assert r.slice() is r

    def test_index_of_root(self) -> None:
        r = Region(["a", "b"], [2, 3], [10, 2], 5)
        for i, root in enumerate(r.root_ranks()):
            assert r.index_of_root(root) == i
            assert r.contains_root(root)
        for root in [0, 4, 6, 8, 11, 14, 21, 25, 100]:
            assert r.index_of_root(root) is None
            assert not r.contains_root(root)
        with pytest.raises(TypeError):
            r.index_of_root("5")  # type: ignore[arg-type]

    def test_index_of_root_transposed(self) -> None:
        # Column-major layout: the inverse must not assume descending strides.
        r = Region(["a", "b"], [3, 2], [1, 3], 0)
        assert r.root_ranks() == [0, 3, 1, 4, 2, 5]
        for i, root in enumerate(r.root_ranks()):
            assert r.index_of_root(root) == i
        assert r.index_of_root(6) is None

    def test_index_of_root_overlapping_layout(self) -> None:
        # Strides that are not a mixed radix: falls back to a lookup table.
        r = Region(["a", "b"], [3, 3], [2, 3], 0)
        roots = r.root_ranks()
        assert roots == [0, 3, 6, 2, 5, 8, 4, 7, 10]
        for i, root in enumerate(roots):
            assert r.index_of_root(root) == i
        assert r.index_of_root(1) is None
        assert r.index_of_root(9) is None

    def test_stride_zero(self) -> None:
        r = Region(["a"], [3], [0], 4)
        assert r.root_ranks() == [4, 4, 4]
        assert r.index_of_root(4) == 0
        assert r.index_of_root(5) is None

    def test_is_dense(self) -> None:
        assert hg().region.is_dense()
        assert Region(["a"], [5], [7], 3).is_dense()
        assert Region(["a", "b"], [2, 2], [4, 2], 0).is_dense()
        assert not Region(["a", "b"], [2, 3], [4, 1], 0).is_dense()
        assert not Region(["a", "b"], [3, 2], [1, 3], 0).is_dense()
        # size-1 dimensions do not matter.
        assert Region(["a", "b"], [2, 1], [4, 1], 0).is_dense()
        assert Region(["a", "b", "c"], [1, 2, 1], [99, 3, 7], 0).is_dense()

    def test_root_ranks_matches_reference(self) -> None:
        for r in [
            hg().region,
            Region(["a", "b", "c"], [2, 3, 2], [20, 5, 1], 3),
            Region(["a", "b"], [3, 2], [1, 3], 0),
            Region(["a", "b", "c"], [2, 1, 3], [9, 4, 2], 1),
        ]:
            assert r.root_ranks() == brute_roots(r)
            assert [r.root_rank(i) for i in range(r.nelements)] == brute_roots(r)


class TestRegionSlice:
    def test_int_removes_dim(self) -> None:
        r = hg().region.slice(hosts=1)
        assert r.labels == ("gpus",)
        assert r.sizes == (4,)
        assert r.strides == (1,)
        assert r.offset == 4
        assert r.root_ranks() == [4, 5, 6, 7]

    def test_int_removes_both(self) -> None:
        r = hg().region.slice(hosts=1, gpus=2)
        assert r.labels == ()
        assert r.nelements == 1
        assert r.root_ranks() == [6]

    def test_negative_int(self) -> None:
        r = hg().region
        assert r.slice(gpus=-1).root_ranks() == [3, 7]
        assert r.slice(gpus=-4).root_ranks() == [0, 4]
        assert r.slice(hosts=-2, gpus=-3).root_ranks() == [1]

    def test_slice_keeps_dim(self) -> None:
        r = hg().region.slice(gpus=slice(1, 3))
        assert r.labels == ("hosts", "gpus")
        assert r.sizes == (2, 2)
        assert r.strides == (4, 1)
        assert r.offset == 1
        assert r.root_ranks() == [1, 2, 5, 6]

    def test_slice_of_size_one_keeps_dim(self) -> None:
        r = hg().region.slice(hosts=slice(1, 2))
        assert r.labels == ("hosts", "gpus")
        assert r.sizes == (1, 4)
        assert r.root_ranks() == [4, 5, 6, 7]

    def test_slice_steps(self) -> None:
        r = hg().region.slice(gpus=slice(None, None, 2))
        assert r.sizes == (2, 2)
        assert r.strides == (4, 2)
        assert r.root_ranks() == [0, 2, 4, 6]
        assert hg().region.slice(gpus=slice(1, None, 2)).root_ranks() == [1, 3, 5, 7]
        assert hg().region.slice(gpus=slice(0, 4, 3)).root_ranks() == [0, 3, 4, 7]

    def test_slice_negative_and_clamped(self) -> None:
        r = hg().region
        assert r.slice(gpus=slice(-2, None)).root_ranks() == [2, 3, 6, 7]
        assert r.slice(gpus=slice(None, -1)).root_ranks() == [0, 1, 2, 4, 5, 6]
        assert r.slice(gpus=slice(2, 100)).root_ranks() == [2, 3, 6, 7]
        assert r.slice(gpus=slice(-100, 1)).root_ranks() == [0, 4]
        assert r.slice(gpus=slice(None)) == r
        assert r.slice(gpus=slice(0, 100, 10)).root_ranks() == [0, 4]

    def test_mixed(self) -> None:
        r = hg().region.slice(hosts=0, gpus=slice(1, None))
        assert r.labels == ("gpus",)
        assert r.root_ranks() == [1, 2, 3]

    def test_no_kwargs_returns_self(self) -> None:
        r = hg().region
        assert r.slice() is r

    def test_composition(self) -> None:
        r = Extent(["a", "b", "c"], [3, 4, 5]).region
        s1 = r.slice(b=slice(1, None, 2), c=slice(1, 5))
        assert s1.sizes == (3, 2, 4)
        s2 = s1.slice(a=slice(1, None), c=slice(None, None, 2))
        s3 = s2.slice(b=-1)
        expected = [
            a * 20 + b * 5 + c
            for a in range(3)[1:]
            for b in [range(4)[1::2][-1]]
            for c in range(5)[1:5][::2]
        ]
        assert s3.labels == ("a", "c")
        assert s3.root_ranks() == expected
        assert s3.root_ranks() == brute_roots(s3)
        for i, root in enumerate(s3.root_ranks()):
            assert s3.index_of_root(root) == i
        assert not s3.contains_root(0)

    def test_unknown_dim(self) -> None:
        with pytest.raises(TypeError) as ei:
            hg().region.slice(x=0)
        assert str(ei.value) == (
            "Region has no dimension 'x'; its dimensions are ['hosts', 'gpus']"
        )

    def test_int_out_of_range(self) -> None:
        with pytest.raises(IndexError) as ei:
            hg().region.slice(gpus=4)
        msg = str(ei.value)
        assert "index 4 is out of range" in msg
        assert "'gpus' of size 4" in msg
        assert "-4..3" in msg
        with pytest.raises(IndexError, match="index -5"):
            hg().region.slice(gpus=-5)

    def test_empty_slice(self) -> None:
        with pytest.raises(ValueError, match="selects no elements of dimension 'gpus' of size 4"):
            hg().region.slice(gpus=slice(2, 2))
        with pytest.raises(ValueError, match="cannot be empty"):
            hg().region.slice(gpus=slice(10, None))

    def test_bad_step(self) -> None:
        with pytest.raises(ValueError, match="step for dimension 'gpus' must be > 0, got -1"):
            hg().region.slice(gpus=slice(None, None, -1))
        with pytest.raises(ValueError, match="got 0"):
            hg().region.slice(gpus=slice(None, None, 0))
        with pytest.raises(TypeError, match="step for dimension 'gpus' must be an int"):
            hg().region.slice(gpus=slice(None, None, 1.0))

    def test_bad_slice_bounds(self) -> None:
        with pytest.raises(TypeError, match="slice bound for dimension 'gpus' must be an int, got str"):
            hg().region.slice(gpus=slice("a", None))

    def test_bad_value_type(self) -> None:
        for bad in ["1", 1.0, None, [1], True]:
            with pytest.raises(TypeError, match="must be an int .* or a slice"):
                hg().region.slice(gpus=bad)  # type: ignore[arg-type]


class TestRegionRename:
    def test_rename(self) -> None:
        r = hg().region.rename(hosts="dp")
        assert r.labels == ("dp", "gpus")
        assert r.sizes == (2, 4)
        assert r.strides == (4, 1)
        assert r.root_ranks() == list(range(8))

    def test_swap(self) -> None:
        r = hg().region.rename(hosts="gpus", gpus="hosts")
        assert r.labels == ("gpus", "hosts")
        assert r.sizes == (2, 4)

    def test_round_trip_and_noop(self) -> None:
        r = hg().region
        assert r.rename(hosts="h").rename(h="hosts") == r
        assert r.rename() is r
        assert r.rename(hosts="hosts") == r

    def test_unknown(self) -> None:
        with pytest.raises(TypeError, match="has no dimension 'x'; its dimensions are \\['hosts', 'gpus'\\]"):
            hg().region.rename(x="y")

    def test_duplicate(self) -> None:
        with pytest.raises(ValueError, match="duplicate dimension names \\['gpus'\\]"):
            hg().region.rename(hosts="gpus")

    def test_bad_new_name(self) -> None:
        with pytest.raises(TypeError, match="new name for dimension 'hosts' must be a str"):
            hg().region.rename(hosts=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="non-empty"):
            hg().region.rename(hosts="")


class TestRegionSplit:
    def test_monarch_example(self) -> None:
        r = Extent(["host", "gpu"], [64, 8]).region
        s = r.split(host=("dp", "pp"), gpu=("tp", "cp"), pp=16, cp=2)
        assert s.labels == ("dp", "pp", "tp", "cp")
        assert s.sizes == (4, 16, 4, 2)
        assert s.strides == (128, 8, 2, 1)
        assert s.root_ranks() == r.root_ranks()

    def test_derived_first(self) -> None:
        s = hg().region.split(gpus=("a", "b"), a=2)
        assert s.labels == ("hosts", "a", "b")
        assert s.sizes == (2, 2, 2)
        assert s.strides == (4, 2, 1)

    def test_all_sizes_given(self) -> None:
        s = hg().region.split(gpus=["a", "b"], a=2, b=2)
        assert s.sizes == (2, 2, 2)

    def test_single_new_label_and_size_one(self) -> None:
        r = hg().region
        assert r.split(gpus=("g",)).labels == ("hosts", "g")
        s = r.split(gpus=("one", "g"), one=1)
        assert s.sizes == (2, 1, 4)
        assert s.root_ranks() == list(range(8))

    def test_reuse_old_name(self) -> None:
        s = hg().region.split(gpus=("gpus", "tp"), tp=2)
        assert s.labels == ("hosts", "gpus", "tp")
        assert s.sizes == (2, 2, 2)

    def test_no_kwargs(self) -> None:
        r = hg().region
        assert r.split() is r

    def test_split_of_strided_region_preserves_roots(self) -> None:
        r = Extent(["a", "b"], [3, 12]).region.slice(b=slice(1, None, 2))
        assert r.sizes == (3, 6)
        s = r.split(b=("x", "y", "z"), x=1, z=2)
        assert s.sizes == (3, 1, 3, 2)
        assert s.root_ranks() == r.root_ranks()
        for i, root in enumerate(s.root_ranks()):
            assert s.index_of_root(root) == i

    def test_split_flatten_round_trip(self) -> None:
        r = Extent(["h", "g"], [4, 6]).region
        s = r.split(h=("dp", "pp"), g=("tp", "cp"), pp=2, cp=3)
        assert s.root_ranks() == list(range(24))
        f = s.flatten("all")
        assert f == Extent(["all"], [24]).region
        back = f.split(all=("h", "g"), g=6)
        assert back == r

    def test_unknown_dim(self) -> None:
        with pytest.raises(TypeError, match="Region has no dimension 'x'; its dimensions are"):
            hg().region.split(x=("a", "b"), a=1)

    def test_size_for_non_new_label(self) -> None:
        with pytest.raises(TypeError) as ei:
            hg().region.split(gpus=("a", "b"), b=2, hosts=2)
        msg = str(ei.value)
        assert "hosts=2 gives a size" in msg
        assert "not one of the new dimensions" in msg
        assert "['a', 'b']" in msg
        with pytest.raises(TypeError, match="not one of the new dimensions"):
            hg().region.split(q=3)

    def test_too_many_unsized(self) -> None:
        with pytest.raises(ValueError, match="all but one .* \\['a', 'b'\\]"):
            hg().region.split(gpus=("a", "b"))

    def test_not_divisible(self) -> None:
        with pytest.raises(ValueError, match="size 4 .* multiply to 3, which does not divide 4"):
            hg().region.split(gpus=("a", "b"), a=3)

    def test_product_mismatch(self) -> None:
        with pytest.raises(ValueError, match="multiply to 6, not 4"):
            hg().region.split(gpus=("a", "b"), a=2, b=3)

    def test_bad_size_values(self) -> None:
        with pytest.raises(ValueError, match="size of new dimension 'a' must be >= 1, got 0"):
            hg().region.split(gpus=("a", "b"), a=0)
        with pytest.raises(TypeError, match="size of new dimension 'a' must be an int"):
            hg().region.split(gpus=("a", "b"), a="2")

    def test_bad_new_names(self) -> None:
        with pytest.raises(ValueError, match="at least one new dimension"):
            hg().region.split(gpus=())
        with pytest.raises(TypeError, match="new dimension name .* must be a str"):
            hg().region.split(gpus=("a", 2))
        with pytest.raises(ValueError, match="non-empty"):
            hg().region.split(gpus=("a", ""), a=4)

    def test_duplicate_new_names(self) -> None:
        with pytest.raises(ValueError, match="'a' appears more than once"):
            hg().region.split(gpus=("a", "a"))
        with pytest.raises(ValueError, match="'a' appears more than once"):
            hg().region.split(hosts=("a", "b"), gpus=("a", "c"), b=1, c=1)
        with pytest.raises(ValueError, match="duplicate dimension names \\['hosts'\\]"):
            hg().region.split(gpus=("hosts", "b"), b=2)


class TestRegionFlatten:
    def test_flatten_dense(self) -> None:
        f = hg().region.flatten("all")
        assert f.labels == ("all",)
        assert f.sizes == (8,)
        assert f.strides == (1,)
        assert f.offset == 0

    def test_flatten_strided_but_dense(self) -> None:
        r = hg().region.slice(gpus=slice(None, None, 2))
        f = r.flatten("x")
        assert f.strides == (2,)
        assert f.root_ranks() == r.root_ranks() == [0, 2, 4, 6]

    def test_flatten_sub_region(self) -> None:
        r = hg().region.slice(hosts=1)
        f = r.flatten("x")
        assert f == Region(["x"], [4], [1], 4)

    def test_flatten_size_one_dims(self) -> None:
        r = hg().region.slice(gpus=slice(2, 3))
        assert r.sizes == (2, 1)
        f = r.flatten("x")
        assert f.root_ranks() == [2, 6]
        assert f.strides == (4,)

    def test_flatten_zero_dims(self) -> None:
        f = Region([], [], [], 3).flatten("x")
        assert f == Region(["x"], [1], [1], 3)

    def test_flatten_not_dense(self) -> None:
        r = hg().region.slice(gpus=slice(0, 3))
        with pytest.raises(ValueError) as ei:
            r.flatten("x")
        msg = str(ei.value)
        assert "contiguous" in msg
        assert "slice" in msg
        assert "strides [4, 1]" in msg

    def test_flatten_bad_name(self) -> None:
        with pytest.raises(TypeError, match="name must be a str"):
            hg().region.flatten(1)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="non-empty"):
            hg().region.flatten("")


# ---------------------------------------------------------------- MeshTrait


class FakeMesh(MeshTrait):
    """Minimal MeshTrait implementation over a Region."""

    def __init__(self, region: Region) -> None:
        self.r = region

    @property
    def _region(self) -> Region:
        return self.r

    def _with_region(self, region: Region) -> FakeMesh:
        return FakeMesh(region)


class TestMeshTrait:
    def test_abstract(self) -> None:
        with pytest.raises(TypeError):
            MeshTrait()  # type: ignore[abstract]

        class Half(MeshTrait):
            @property
            def _region(self) -> Region:
                return hg().region

        with pytest.raises(TypeError):
            Half()  # type: ignore[abstract]

    def test_sizes_extent_size(self) -> None:
        m = FakeMesh(hg().region)
        assert m.sizes == {"hosts": 2, "gpus": 4}
        assert m.extent == hg()
        assert m.size() == 8
        assert m.size("gpus") == 4
        assert m.size(["hosts", "gpus"]) == 8
        assert m.size(("gpus",)) == 4
        assert m.size([]) == 1

    def test_size_unknown_is_a_key_error(self) -> None:
        """``size(dim)`` is a lookup: an unknown dimension is a ``KeyError``
        (as in the reference), with the message naming the known ones."""
        m = FakeMesh(hg().region)
        with pytest.raises(KeyError) as ei:
            m.size("x")
        assert not isinstance(ei.value, TypeError)
        assert ei.value.args[0] == (
            "FakeMesh has no dimension 'x'; its dimensions are ['hosts', 'gpus']"
        )
        with pytest.raises(KeyError, match="FakeMesh has no dimension 'y'"):
            m.size(["hosts", "y"])
        with pytest.raises(KeyError, match="FakeMesh has no dimension 3"):
            m.size([3])  # type: ignore[list-item]
        assert m.size(m.sizes.keys()) == 8  # any iterable of names
        with pytest.raises(TypeError, match=r"dim must be None, a dimension name or a sequence of names, got int"):
            m.size(3)  # type: ignore[arg-type]

    def test_slice_unknown_stays_a_type_error(self) -> None:
        m = FakeMesh(hg().region)
        with pytest.raises(TypeError, match="FakeMesh has no dimension 'x'") as ei:
            m.slice(x=0)
        assert not isinstance(ei.value, KeyError)

    def test_slice(self) -> None:
        m = FakeMesh(hg().region)
        s = m.slice(hosts=1, gpus=slice(0, 2))
        assert isinstance(s, FakeMesh)
        assert s.sizes == {"gpus": 2}
        assert s._region.root_ranks() == [4, 5]
        assert m.slice() is m

    def test_rename_split_flatten(self) -> None:
        m = FakeMesh(hg().region)
        assert m.rename(hosts="h").sizes == {"h": 2, "gpus": 4}
        assert m.rename() is m
        s = m.split(gpus=("a", "b"), b=2)
        assert s.sizes == {"hosts": 2, "a": 2, "b": 2}
        assert m.split() is m
        f = m.flatten("x")
        assert f.sizes == {"x": 8}
        assert f._region.root_ranks() == list(range(8))

    def test_errors_name_the_mesh_type(self) -> None:
        m = FakeMesh(hg().region)
        with pytest.raises(TypeError, match="^FakeMesh has no dimension 'x'"):
            m.slice(x=1)
        with pytest.raises(IndexError, match="FakeMesh.slice: index 9"):
            m.slice(gpus=9)
        with pytest.raises(ValueError, match="FakeMesh.slice: "):
            m.slice(gpus=slice(3, 1))
        with pytest.raises(TypeError, match="^FakeMesh has no dimension 'x'"):
            m.rename(x="y")
        with pytest.raises(ValueError, match="FakeMesh.rename: "):
            m.rename(gpus="hosts")
        with pytest.raises(TypeError, match="^FakeMesh has no dimension 'x'"):
            m.split(x=("a", "b"))
        with pytest.raises(ValueError, match="FakeMesh.split: "):
            m.split(gpus=("a", "b"), a=3)
        with pytest.raises(ValueError, match="FakeMesh.flatten: .*contiguous.*FakeMesh"):
            m.slice(gpus=slice(0, 3)).flatten("x")

    def test_docstrings(self) -> None:
        assert "Integer values remove dimensions" in (MeshTrait.slice.__doc__ or "")
        assert "mesh.slice(batch=3, gpu=slice(2, 6))" in (MeshTrait.slice.__doc__ or "")
        assert "split(host=('dp', 'pp')" in (MeshTrait.split.__doc__ or "")
        assert "dense" in (MeshTrait.flatten.__doc__ or "")
