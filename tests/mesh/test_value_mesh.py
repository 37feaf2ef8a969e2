"""Tests for monarch_core._mesh._value_mesh.ValueMesh."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest

from monarch_core._mesh._shape import Extent, MeshTrait, Point, Region
from monarch_core._mesh._value_mesh import ValueMesh

pytestmark = pytest.mark.unit


def hg() -> Extent:
    return Extent(["hosts", "gpus"], [2, 4])


def vm8() -> ValueMesh[int]:
    return ValueMesh(hg(), list(range(8)))


class TestConstruction:
    def test_from_extent(self) -> None:
        m = vm8()
        assert isinstance(m, MeshTrait)
        assert m.extent == hg()
        assert m.sizes == {"hosts": 2, "gpus": 4}
        assert len(m) == 8
        assert m.size() == 8
        assert m.size("gpus") == 4
        assert m.values() == list(range(8))

    def test_from_region_uses_only_its_shape(self) -> None:
        r = Region(["a", "b"], [2, 2], [10, 3], 5)
        m = ValueMesh(r, ["w", "x", "y", "z"])
        assert m.extent == Extent(["a", "b"], [2, 2])
        assert m.values() == ["w", "x", "y", "z"]
        assert m.item(a=1, b=0) == "y"

    def test_list_is_not_copied(self) -> None:
        vals = list(range(8))
        m = ValueMesh(hg(), vals)
        assert m._values is vals
        out = m.values()
        assert out == vals and out is not vals

    def test_tuple_and_other_sequences(self) -> None:
        assert ValueMesh(hg(), tuple(range(8))).values() == list(range(8))
        assert ValueMesh(hg(), range(8)).values() == list(range(8))
        assert ValueMesh(hg(), tuple(range(8))).slice(hosts=1).values() == [4, 5, 6, 7]

    def test_wrong_length(self) -> None:
        with pytest.raises(ValueError, match="needs 8 values .* got 7"):
            ValueMesh(hg(), list(range(7)))
        with pytest.raises(ValueError, match="got 9"):
            ValueMesh(hg(), list(range(9)))

    def test_bad_shape(self) -> None:
        with pytest.raises(TypeError, match="must be an Extent or a Region, got dict"):
            ValueMesh({"a": 2}, [1, 2])  # type: ignore[arg-type]

    def test_zero_dim(self) -> None:
        m = ValueMesh(Extent([], []), ["only"])
        assert len(m) == 1
        assert m.item() == "only"
        assert m.get(0) == "only"
        assert m.values() == ["only"]
        assert [(p.rank, v) for p, v in m.items()] == [(0, "only")]
        assert repr(m) == "ValueMesh({}, ['only'])"

    def test_iterates_point_value_pairs_in_rank_order(self) -> None:
        """``for point, value in vm`` works as in the reference: the pairs
        of ``items()``, in rank order; ``items()``/``values()`` stay."""
        m = vm8()
        pairs = list(m)
        assert pairs == list(m.items())
        assert [p.rank for p, _ in pairs] == list(range(8))
        assert [v for _, v in pairs] == m.values()
        for point, value in m:
            assert isinstance(point, Point)
            assert value == m.item(**point)
        view = m.slice(gpus=slice(1, 3))
        assert [(dict(p), v) for p, v in view] == [
            ({"hosts": 0, "gpus": 0}, 1), ({"hosts": 0, "gpus": 1}, 2),
            ({"hosts": 1, "gpus": 0}, 5), ({"hosts": 1, "gpus": 1}, 6),
        ]
        assert dict((p.rank, v) for p, v in ValueMesh(Extent([], []), ["x"])) == {0: "x"}


class TestAccess:
    def test_item(self) -> None:
        m = vm8()
        assert m.item(hosts=0, gpus=0) == 0
        assert m.item(hosts=1, gpus=2) == 6
        assert m.item(gpus=3, hosts=1) == 7

    def test_item_missing(self) -> None:
        with pytest.raises(KeyError) as ei:
            vm8().item(hosts=1)
        assert "missing ['gpus']" in str(ei.value)
        with pytest.raises(KeyError, match="missing \\['hosts', 'gpus'\\]"):
            vm8().item()

    def test_item_extra(self) -> None:
        with pytest.raises(KeyError) as ei:
            vm8().item(hosts=1, gpus=0, x=2)
        assert "unknown ['x']" in str(ei.value)
        with pytest.raises(KeyError, match="unknown \\['x'\\]"):
            ValueMesh(Extent([], []), [1]).item(x=0)

    def test_item_out_of_range(self) -> None:
        with pytest.raises(KeyError) as ei:
            vm8().item(hosts=2, gpus=0)
        assert "coordinate 2 is out of range for dimension 'hosts' of size 2" in str(
            ei.value
        )
        with pytest.raises(KeyError, match="coordinate -1"):
            vm8().item(hosts=0, gpus=-1)

    def test_item_bad_type(self) -> None:
        with pytest.raises(TypeError, match="must be an int"):
            vm8().item(hosts=0, gpus="1")  # type: ignore[arg-type]

    def test_get(self) -> None:
        m = vm8()
        assert [m.get(r) for r in range(8)] == list(range(8))
        s = m.slice(gpus=slice(1, None, 2))
        assert [s.get(r) for r in range(4)] == [1, 3, 5, 7]

    def test_get_out_of_range(self) -> None:
        with pytest.raises(IndexError, match="rank 8 is out of range .* 8 elements"):
            vm8().get(8)
        with pytest.raises(IndexError, match="rank -1"):
            vm8().get(-1)
        with pytest.raises(IndexError, match="rank 2 .* 2 elements"):
            vm8().slice(gpus=0).get(2)
        with pytest.raises(TypeError, match="must be an int"):
            vm8().get("0")  # type: ignore[arg-type]

    def test_items(self) -> None:
        m = ValueMesh(hg(), [c * 10 for c in range(8)])
        it = m.items()
        assert isinstance(it, Iterator)
        pairs = list(it)
        assert [v for _, v in pairs] == [c * 10 for c in range(8)]
        assert [p for p, _ in pairs] == [Point(r, hg()) for r in range(8)]
        p, v = pairs[6]
        assert dict(p) == {"hosts": 1, "gpus": 2}
        assert v == 60
        assert str(p) == "{'hosts': 1/2, 'gpus': 2/4}"

    def test_items_of_slice_use_slice_extent(self) -> None:
        s = vm8().slice(hosts=1, gpus=slice(2, None))
        pairs = list(s.items())
        ext = Extent(["gpus"], [2])
        assert pairs == [(Point(0, ext), 6), (Point(1, ext), 7)]
        assert all(p.extent == ext for p, _ in pairs)


class TestViews:
    def test_slice_int_removes_dim(self) -> None:
        s = vm8().slice(hosts=1)
        assert isinstance(s, ValueMesh)
        assert s.sizes == {"gpus": 4}
        assert s.values() == [4, 5, 6, 7]
        assert s.item(gpus=1) == 5

    def test_slice_keeps_dim(self) -> None:
        s = vm8().slice(gpus=slice(1, 3))
        assert s.sizes == {"hosts": 2, "gpus": 2}
        assert s.values() == [1, 2, 5, 6]
        assert s.item(hosts=1, gpus=0) == 5

    def test_slice_negative_steps_clamp(self) -> None:
        m = vm8()
        assert m.slice(gpus=-1).values() == [3, 7]
        assert m.slice(gpus=slice(None, None, 2)).values() == [0, 2, 4, 6]
        assert m.slice(gpus=slice(-3, 100, 2)).values() == [1, 3, 5, 7]
        assert m.slice(hosts=slice(-1, None), gpus=slice(None, 2)).values() == [4, 5]

    def test_slice_to_scalar(self) -> None:
        s = vm8().slice(hosts=1, gpus=3)
        assert s.sizes == {}
        assert len(s) == 1
        assert s.item() == 7
        assert s.values() == [7]

    def test_slice_of_slice(self) -> None:
        m = ValueMesh(Extent(["a", "b", "c"], [3, 4, 5]), list(range(60)))
        s = m.slice(b=slice(1, None, 2)).slice(c=slice(1, 5)).slice(a=2, c=slice(None, None, 2))
        assert s.sizes == {"b": 2, "c": 2}
        assert s.values() == [46, 48, 56, 58]
        assert s.item(b=1, c=1) == 58

    def test_slice_shares_storage(self) -> None:
        m = vm8()
        s = m.slice(hosts=1)
        assert s._values is m._values

    def test_rename_split_flatten(self) -> None:
        m = vm8()
        r = m.rename(hosts="h")
        assert r.item(h=1, gpus=0) == 4
        sp = m.split(gpus=("a", "b"), b=2)
        assert sp.sizes == {"hosts": 2, "a": 2, "b": 2}
        assert sp.values() == list(range(8))
        assert sp.item(hosts=1, a=1, b=0) == 6
        f = m.slice(gpus=slice(None, None, 2)).flatten("x")
        assert f.values() == [0, 2, 4, 6]
        assert f.item(x=3) == 6

    def test_non_dense_values(self) -> None:
        s = vm8().slice(gpus=slice(0, 3))
        assert s.values() == [0, 1, 2, 4, 5, 6]
        assert [v for _, v in s.items()] == [0, 1, 2, 4, 5, 6]

    def test_errors_name_value_mesh(self) -> None:
        with pytest.raises(TypeError) as ei:
            vm8().slice(x=0)
        assert str(ei.value) == (
            "ValueMesh has no dimension 'x'; its dimensions are ['hosts', 'gpus']"
        )
        with pytest.raises(ValueError, match="ValueMesh.flatten: .*contiguous"):
            vm8().slice(gpus=slice(0, 3)).flatten("x")
        with pytest.raises(KeyError, match="ValueMesh has no dimension 'x'"):
            vm8().size("x")


class TestFromIndexed:
    def test_basic(self) -> None:
        m = ValueMesh.from_indexed(hg(), [(r, r * r) for r in reversed(range(8))])
        assert m.values() == [r * r for r in range(8)]
        assert m.extent == hg()

    def test_last_write_wins(self) -> None:
        pairs = [(r, "a") for r in range(8)] + [(3, "b"), (3, "c")]
        m = ValueMesh.from_indexed(hg(), iter(pairs))
        assert m.get(3) == "c"
        assert m.values().count("a") == 7

    def test_none_is_a_value(self) -> None:
        m = ValueMesh.from_indexed(Extent(["a"], [2]), [(0, None), (1, None)])
        assert m.values() == [None, None]

    def test_missing(self) -> None:
        with pytest.raises(ValueError) as ei:
            ValueMesh.from_indexed(hg(), [(0, 0), (2, 2), (4, 4), (5, 5), (6, 6), (7, 7)])
        msg = str(ei.value)
        assert "ranks [1, 3]" in msg
        assert "every rank must be filled" in msg

    def test_many_missing_truncated(self) -> None:
        with pytest.raises(ValueError, match="\\.\\.\\. \\(100 in total\\)"):
            ValueMesh.from_indexed(Extent(["a"], [100]), [])

    def test_out_of_range(self) -> None:
        with pytest.raises(IndexError, match="rank 8 is out of range"):
            ValueMesh.from_indexed(hg(), [(8, 0)])
        with pytest.raises(IndexError, match="rank -1"):
            ValueMesh.from_indexed(hg(), [(-1, 0)])
        with pytest.raises(TypeError, match="rank must be an int"):
            ValueMesh.from_indexed(hg(), [("0", 0)])  # type: ignore[list-item]

    def test_bad_shape(self) -> None:
        with pytest.raises(TypeError, match="must be an Extent, got dict"):
            ValueMesh.from_indexed({"a": 1}, [])  # type: ignore[arg-type]

    def test_elements_with_odd_eq(self) -> None:
        class NoEq:
            def __eq__(self, other: object) -> bool:
                raise AssertionError("must not compare")

            __hash__ = object.__hash__

        objs = [NoEq(), NoEq()]
        m = ValueMesh.from_indexed(Extent(["a"], [2]), enumerate(objs))
        assert m.get(0) is objs[0] and m.get(1) is objs[1]


class TestProtocol:
    def test_eq(self) -> None:
        assert vm8() == vm8()
        assert vm8() != ValueMesh(hg(), list(range(1, 9)))
        assert vm8() != ValueMesh(Extent(["a", "b"], [2, 4]), list(range(8)))
        assert vm8().slice(hosts=1) == ValueMesh(Extent(["gpus"], [4]), [4, 5, 6, 7])
        assert vm8() != list(range(8))

    def test_unhashable(self) -> None:
        with pytest.raises(TypeError):
            hash(vm8())

    def test_repr(self) -> None:
        assert repr(ValueMesh(Extent(["gpus"], [4]), [0, 1, 2, 3])) == (
            "ValueMesh({'gpus': 4}, [0, 1, 2, 3])"
        )
        assert repr(vm8().slice(hosts=0, gpus=slice(1, 3))) == (
            "ValueMesh({'gpus': 2}, [1, 2])"
        )

    def test_pickle(self) -> None:
        m = vm8()
        m2 = pickle.loads(pickle.dumps(m))
        assert m2 == m
        assert m2._region == hg().region

    def test_pickle_view_materialises(self) -> None:
        big = ValueMesh(Extent(["a"], [1000]), ["x" * 100] * 1000)
        s = big.slice(a=slice(0, 2))
        s2 = pickle.loads(pickle.dumps(s))
        assert s2 == s
        assert s2.values() == ["x" * 100] * 2
        assert len(s2._values) == 2
        assert s2._region == Extent(["a"], [2]).region

    def test_generic_subscript(self) -> None:
        m = ValueMesh[int](Extent(["a"], [1]), [1])
        assert m.values() == [1]
