"""default_collate, collate, the registry, default_convert, StackedSamples, collate_into.

Torch parity lives in test_torch.py; these tests need numpy only.
"""

from __future__ import annotations

import ast
import collections
import importlib
import subprocess
import sys
from collections import OrderedDict, namedtuple
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pytest

from collate.allocators import Pool
from stoker._errors import CollateError
from stoker._stacked import StackedSamples
from stoker.collate import (
    collate,
    collate_into,
    default_collate,
    default_collate_fn_map,
    default_convert,
    register_collate,
)

# ``stoker.collate`` the attribute is the re-exported function; this is the module
collate_module = importlib.import_module("stoker.collate")

Point = namedtuple("Point", ["x", "y"])


def test_all_is_sorted_and_complete():
    assert collate_module.__all__ == sorted(collate_module.__all__)
    for name in collate_module.__all__:
        assert hasattr(collate_module, name)


def test_import_does_not_import_torch():
    code = "import sys, stoker.collate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _collate_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    found |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return {name for name in found if name.startswith("stoker.collate")}


def test_the_collate_modules_import_the_registry_and_never_the_package():
    package = Path(collate_module.__file__).parent
    for path in sorted(package.glob("*.py")):
        if path.name == "__init__.py":
            continue
        allowed = {"stoker.collate._registry", "stoker.collate._fields"} - {
            f"stoker.collate.{path.stem}"
        }
        if path.stem == "_registry":
            allowed = set()
        assert _collate_imports(path) <= allowed, (
            f"{path.name} imports {_collate_imports(path) - allowed}"
        )


# ----------------------------------------------------------------- leaf types


def test_ints_become_int64_array():
    out = default_collate([0, 1, 2, 3])
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.int64
    assert out.tolist() == [0, 1, 2, 3]


def test_floats_become_float64_array():
    out = default_collate([0.5, 1.5])
    assert out.dtype == np.float64
    assert out.tolist() == [0.5, 1.5]


def test_bools_become_bool_array_and_mixed_with_ints_int64():
    assert default_collate([True, False]).dtype == np.bool_
    mixed = default_collate([True, 2])
    assert mixed.dtype == np.int64
    assert mixed.tolist() == [1, 2]


def test_ints_mixed_with_floats_become_float64():
    out = default_collate([1, 2.5])
    assert out.dtype == np.float64
    assert out.tolist() == [1.0, 2.5]


def test_int_too_large_for_int64_names_the_field():
    with pytest.raises(
        CollateError, match=r"field sample\['n'\] \(batch of 2\): a value does not fit"
    ):
        default_collate([{"n": 1}, {"n": 2**70}])


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float16, np.int8, np.uint16, np.int32, np.bool_, np.complex64]
)
def test_numpy_scalars_keep_their_dtype(dtype):
    out = default_collate([dtype(1), dtype(0)])
    assert out.dtype == np.dtype(dtype)
    assert out.shape == (2,)


def test_numpy_arrays_are_stacked():
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    out = default_collate([a, b])
    assert type(out) is np.ndarray
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.stack([a, b]))


def test_numpy_arrays_of_different_dtypes_are_promoted():
    out = default_collate([np.zeros(2, np.float32), np.zeros(2, np.float64)])
    assert out.dtype == np.float64


def test_memmap_is_stacked_into_plain_ndarray(tmp_path):
    m = np.memmap(tmp_path / "m.dat", dtype=np.int16, mode="w+", shape=(3,))
    m[:] = [1, 2, 3]
    out = default_collate([m, m])
    assert type(out) is np.ndarray
    assert out.tolist() == [[1, 2, 3], [1, 2, 3]]


def test_strings_and_bytes_are_kept_as_lists():
    assert default_collate(["a", "b"]) == ["a", "b"]
    assert default_collate([b"a", b"b"]) == [b"a", b"b"]
    nested = default_collate([("a", 1), ("b", 2)])
    assert nested[0] == ["a", "b"]
    assert isinstance(nested[0], list)


# ----------------------------------------------------------------- containers


def test_dict_of_fields():
    out = default_collate([{"A": 0, "B": np.zeros(2)}, {"A": 100, "B": np.ones(2)}])
    assert list(out) == ["A", "B"]
    assert out["A"].tolist() == [0, 100]
    assert out["B"].tolist() == [[0, 0], [1, 1]]


def test_mapping_type_is_kept_and_rebuilt():
    out = default_collate([OrderedDict(a=1), OrderedDict(a=2)])
    assert type(out) is OrderedDict
    assert out["a"].tolist() == [1, 2]
    dd = collections.defaultdict(list, a=1)
    out_dd = default_collate([dd, collections.defaultdict(list, a=2)])
    assert type(out_dd) is collections.defaultdict
    assert out_dd.default_factory is list
    out_proxy = default_collate([MappingProxyType({"a": 1}), MappingProxyType({"a": 2})])
    assert type(out_proxy) is MappingProxyType
    assert out_proxy["a"].tolist() == [1, 2]


class FixedMapping(collections.abc.Mapping):
    """An immutable mapping whose constructor takes no mapping."""

    def __init__(self, *, value):
        self._data = {"a": value}

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return 1


def test_mapping_that_cannot_be_rebuilt_becomes_dict():
    out = default_collate([FixedMapping(value=np.zeros(2)), FixedMapping(value=np.ones(2))])
    assert type(out) is dict
    assert out["a"].tolist() == [[0, 0], [1, 1]]


def test_namedtuple_keeps_its_type():
    out = default_collate([Point(0, 0.5), Point(1, 1.5)])
    assert type(out) is Point
    assert out.x.tolist() == [0, 1]
    assert out.y.dtype == np.float64


def test_tuple_samples_become_list_of_columns():
    out = default_collate([(0, 1), (2, 3)])
    assert isinstance(out, list)
    assert [c.tolist() for c in out] == [[0, 2], [1, 3]]


def test_list_samples_are_transposed_like_torch():
    out = default_collate([[0, 1], [2, 3]])
    assert isinstance(out, list)
    assert [c.tolist() for c in out] == [[0, 2], [1, 3]]


def test_custom_sequence_type_that_cannot_be_rebuilt_gives_list():
    out = default_collate([range(2), range(2)])
    assert isinstance(out, list)
    assert [c.tolist() for c in out] == [[0, 0], [1, 1]]


def test_nested_structures():
    batch = [
        {"meta": {"boxes": np.full((2, 4), i), "id": i}, "pair": (i, [i, i + 1])} for i in range(3)
    ]
    out = default_collate(batch)
    assert out["meta"]["boxes"].shape == (3, 2, 4)
    assert out["meta"]["id"].tolist() == [0, 1, 2]
    assert out["pair"][0].tolist() == [0, 1, 2]
    assert [c.tolist() for c in out["pair"][1]] == [[0, 1, 2], [1, 2, 3]]


# ----------------------------------------------------------------- errors


def test_shape_mismatch_names_field_and_samples():
    batch = [{"image": np.zeros((3, 32, 32))} for _ in range(4)]
    batch[2] = {"image": np.zeros((3, 28, 28))}
    with pytest.raises(CollateError) as info:
        default_collate(batch)
    assert str(info.value) == (
        "cannot stack field sample['image'] (batch of 4): sample 0 has shape (3, 32, 32) but "
        "sample 2 has shape (3, 28, 28). Resize in the transform, or use pad_collate to pad "
        "variable-length fields."
    )
    assert isinstance(info.value, TypeError)


def test_nested_path_and_index_path_in_errors():
    batch = [{"meta": {"boxes": np.zeros((i + 1, 4))}} for i in range(2)]
    with pytest.raises(CollateError, match=r"field sample\['meta'\]\['boxes'\] \(batch of 2\)"):
        default_collate(batch)
    with pytest.raises(CollateError, match=r"field sample\[1\] \(batch of 2\): sample 0 has shape"):
        default_collate([(0, np.zeros(2)), (1, np.zeros(3))])
    with pytest.raises(CollateError, match=r"field sample\.y \(batch of 2\)"):
        default_collate([Point(0, np.zeros(2)), Point(1, np.zeros(3))])


def test_top_level_shape_mismatch_says_the_samples():
    with pytest.raises(CollateError, match=r"^cannot stack the samples \(batch of 2\): sample 0"):
        default_collate([np.zeros(2), np.zeros(3)])


def test_mixed_types_within_a_field_are_named():
    with pytest.raises(CollateError) as info:
        default_collate([{"label": 1}, {"label": 2}, {"label": "x"}])
    assert str(info.value) == (
        "cannot collate field sample['label'] (batch of 3): sample 0 is int but sample 2 is "
        "str, where a number was expected. Make every sample return the same type for this "
        "field."
    )
    with pytest.raises(CollateError, match=r"sample 0 is numpy.ndarray but sample 1 is dict"):
        default_collate([np.zeros(2), {"a": 1}])
    with pytest.raises(CollateError, match=r"sample 0 is dict but sample 1 is list"):
        default_collate([{"a": 1}, [1]])
    with pytest.raises(CollateError, match=r"sample 0 is str but sample 1 is int"):
        default_collate(["a", 1])


def test_none_is_an_error_like_torch():
    with pytest.raises(CollateError) as info:
        default_collate([(None, 1), (None, 2)])
    assert str(info.value).startswith(
        "cannot collate field sample[0] (batch of 2): it is None in sample 0, and None cannot "
        "be batched. Return a placeholder value instead"
    )
    with pytest.raises(CollateError, match=r"sample 0 is int but sample 1 is NoneType"):
        default_collate([1, None])


def test_unsupported_type_names_type_and_how_to_fix():
    class Thing:
        pass

    with pytest.raises(CollateError) as info:
        default_collate([{"t": Thing()}, {"t": Thing()}])
    text = str(info.value)
    assert "cannot collate field sample['t'] (batch of 2)" in text
    assert "does not know how to batch objects of type" in text and "Thing" in text
    assert "Pass collate_fn= to the DataLoader" in text
    assert "register_collate(" in text


@pytest.mark.parametrize("dtype", ["U3", "S3", object])
def test_string_and_object_arrays_are_refused(dtype):
    batch = [{"s": np.array(["ab", "c"], dtype=dtype)}, {"s": np.array(["d", "e"], dtype=dtype)}]
    with pytest.raises(
        CollateError, match=r"sample\['s'\] \(batch of 2\): sample 0 is a numpy array of dtype"
    ):
        default_collate(batch)


def test_sequences_of_different_length():
    with pytest.raises(CollateError) as info:
        default_collate([{"ids": [1, 2, 3]}, {"ids": [1, 2]}])
    assert str(info.value).startswith(
        "cannot collate field sample['ids'] (batch of 2): sample 0 has 3 elements but sample 1 "
        "has 2."
    )
    assert "use pad_collate" in str(info.value)


def test_missing_key_is_named():
    with pytest.raises(
        CollateError, match=r"sample 1 has no key 'b' \(sample 0 has keys \['a', 'b'\]\)"
    ):
        default_collate([{"a": 1, "b": 2}, {"a": 1}])


def test_empty_batch():
    with pytest.raises(CollateError, match="the batch is empty"):
        default_collate([])


def test_exceptions_from_user_functions_get_a_note():
    def broken(batch, *, collate_fn_map):
        raise ZeroDivisionError("boom")

    with pytest.raises(ZeroDivisionError) as info:
        collate([{"f": Fraction(1)}, {"f": Fraction(2)}], collate_fn_map={Fraction: broken})
    if sys.version_info >= (3, 11):
        assert info.value.__notes__ == [
            "stoker: raised while collating field sample['f'] (batch of 2)"
        ]


# ----------------------------------------------------------------- registry


def test_collate_with_custom_map_and_exact_then_isinstance_order():
    calls = []

    def base_fn(batch, *, collate_fn_map):
        calls.append("base")
        return "base"

    def exact_fn(batch, *, collate_fn_map):
        calls.append("exact")
        return "exact"

    class Base:
        pass

    class Child(Base):
        pass

    fmap = {Base: base_fn, Child: exact_fn}
    assert collate([Child(), Child()], collate_fn_map=fmap) == "exact"
    assert collate([Base()], collate_fn_map=fmap) == "base"
    # isinstance order: first matching key wins
    assert collate([Child()], collate_fn_map={Base: base_fn, object: exact_fn}) == "base"
    # containers are handled without entries; the map is passed down
    out = collate([{"c": Child()}, {"c": Child()}], collate_fn_map=fmap)
    assert out == {"c": "exact"}


def test_collate_without_map_refuses_leaves_and_strings():
    with pytest.raises(CollateError, match="does not know how to batch objects of type int"):
        collate([1, 2])
    with pytest.raises(CollateError, match="type str"):
        collate(["ab", "cd"])


def test_register_collate_is_used_and_takes_precedence():
    def sum_fn(batch, *, collate_fn_map):
        return sum(batch)

    try:
        returned = register_collate(Fraction, sum_fn)
        assert returned is sum_fn
        assert next(iter(default_collate_fn_map)) is Fraction
        assert default_collate([{"f": Fraction(1, 2)}, {"f": Fraction(1, 3)}]) == {
            "f": Fraction(5, 6)
        }
    finally:
        del default_collate_fn_map[Fraction]
    with pytest.raises(CollateError, match="Fraction"):
        default_collate([Fraction(1, 2)])


def test_register_collate_overrides_builtin_rule_for_subclasses():
    def as_list(batch, *, collate_fn_map):
        return [int(x) for x in batch]

    try:
        register_collate(np.integer, as_list)
        assert default_collate([np.int32(1), np.int32(2)]) == [1, 2]
        assert default_collate([np.float32(1)]).dtype == np.float32  # others unchanged
    finally:
        del default_collate_fn_map[np.integer]
    assert isinstance(default_collate([np.int32(1)]), np.ndarray)


def test_register_collate_validates_arguments():
    with pytest.raises(TypeError, match=r"needs a class or a tuple of classes, got 'int'"):
        register_collate("int", lambda b, **_: b)
    with pytest.raises(TypeError, match=r"needs a callable fn\(batch, \*, collate_fn_map\), got 3"):
        register_collate(Fraction, 3)
    assert Fraction not in default_collate_fn_map


def test_user_function_can_recurse_with_the_map():
    class Pair:
        def __init__(self, a, b):
            self.a, self.b = a, b

    def pair_fn(batch, *, collate_fn_map):
        return collate([(p.a, p.b) for p in batch], collate_fn_map=collate_fn_map)

    fmap = {**default_collate_fn_map, Pair: pair_fn}
    out = collate([Pair(1, np.zeros(2)), Pair(2, np.ones(2))], collate_fn_map=fmap)
    assert out[0].tolist() == [1, 2]
    assert out[1].shape == (2, 2)


# ----------------------------------------------------------------- default_convert


def test_default_convert_keeps_numpy_and_rebuilds_containers():
    a = np.arange(3)
    assert default_convert(a) is a
    s = np.float32(1)
    assert default_convert(s) is s
    assert default_convert(3) == 3
    assert default_convert("x") == "x"
    out = default_convert((a, 1))
    assert isinstance(out, list) and out[0] is a and out[1] == 1
    p = default_convert(Point(a, 2))
    assert type(p) is Point and p.x is a
    d = default_convert(OrderedDict(k=a))
    assert type(d) is OrderedDict and d["k"] is a
    lst = [a, (1, 2)]
    converted = default_convert(lst)
    assert converted is not lst and converted[1] == [1, 2] and lst[1] == (1, 2)
    assert default_convert(range(2)) == [0, 1]  # as in torch: range cannot be rebuilt


# ----------------------------------------------------------------- StackedSamples


def _equal(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


def test_stacked_samples_equal_collating_the_tuples():
    images = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)
    labels = np.arange(5, dtype=np.int16)
    names = np.array(list("abcde"))
    stacked = StackedSamples((images, labels, names))
    fast = default_collate(stacked)
    slow = default_collate(list(stacked))
    assert isinstance(fast, list)
    assert _equal(fast, slow)
    assert fast[2] == list("abcde")


def test_stacked_samples_are_copies():
    column = np.arange(6).reshape(3, 2)[:, ::-1]  # not contiguous
    out = default_collate(StackedSamples((column,)))[0]
    assert not np.shares_memory(out, column)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out, column)


def test_stacked_samples_use_the_one_copy_path(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("per-sample stacking was used")

    monkeypatch.setitem(default_collate_fn_map, np.ndarray, fail)
    # with np.ndarray overridden, the registered function must be honoured ...
    with pytest.raises(AssertionError, match="per-sample stacking"):
        default_collate(StackedSamples((np.zeros((2, 2)),)))
    monkeypatch.undo()
    # ... and with the default map, np.stack is not called at all
    monkeypatch.setattr(np, "stack", fail)
    out = default_collate(StackedSamples((np.zeros((2, 2)),)))
    assert out[0].shape == (2, 2)


def test_stacked_samples_with_zero_rows():
    out = default_collate(StackedSamples((np.zeros((0, 3), np.float32),)))
    assert out[0].shape == (0, 3) and out[0].dtype == np.float32


# ----------------------------------------------------------------- collate_into


def _arrays(tree):
    if isinstance(tree, np.ndarray):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _arrays(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _arrays(v)


def _assert_same_tree(a, b):
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b)
        for k in a:
            _assert_same_tree(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same_tree(x, y)
    else:
        assert a == b


def _sample_batch():
    return [
        {
            "image": np.full((3, 4, 4), i, np.uint8),
            "label": i,
            "score": i / 2,
            "flag": bool(i % 2),
            "scalar": np.float32(i),
            "meta": {"boxes": np.arange(8, dtype=np.float32).reshape(2, 4) + i, "name": f"s{i}"},
            "pair": (np.int64(i), [i, i + 1]),
        }
        for i in range(4)
    ]


def test_collate_into_writes_every_array_into_allocator_memory():
    plain = default_collate(_sample_batch())
    pool = Pool()
    with collate_into(pool):
        pooled = default_collate(_sample_batch())
    _assert_same_tree(plain, pooled)
    arrays = list(_arrays(pooled))
    assert len(arrays) == 9
    for a in arrays:
        assert np.shares_memory(a, pool.buffer)
    # no two outputs overlap: each came from its own allocation
    assert len(pool.handed) == len(arrays)


def test_collate_into_stacked_samples():
    pool = Pool()
    stacked = StackedSamples((np.ones((4, 3), np.float32), np.arange(4)))
    with collate_into(pool):
        out = default_collate(stacked)
    assert all(np.shares_memory(a, pool.buffer) for a in out)
    _assert_same_tree(out, default_collate(stacked))


def test_collate_into_is_scoped_and_can_be_turned_off():
    pool = Pool()
    with collate_into(pool):
        with collate_into(None):
            inner = default_collate([np.zeros(2), np.zeros(2)])
        outer = default_collate([np.zeros(2), np.zeros(2)])
    after = default_collate([np.zeros(2), np.zeros(2)])
    assert not np.shares_memory(inner, pool.buffer)
    assert np.shares_memory(outer, pool.buffer)
    assert not np.shares_memory(after, pool.buffer)


def test_collate_into_checks_the_allocator():
    with (
        pytest.raises(
            TypeError, match=r"needs a callable allocator\(shape, dtype\) or None, got 5"
        ),
        collate_into(5),
    ):
        pass
    with (
        collate_into(lambda shape, dtype: np.empty((1,), dtype)),
        pytest.raises(
            ValueError,
            match=r"must return a numpy array of shape \(2,\) and dtype int64, got shape \(1,\)",
        ),
    ):
        default_collate([1, 2])
    with (
        collate_into(lambda shape, dtype: [0, 0]),
        pytest.raises(ValueError, match="got a list"),
    ):
        default_collate([1, 2])
    readonly = np.zeros(2, np.int64)
    readonly.flags.writeable = False
    with (
        collate_into(lambda shape, dtype: readonly),
        pytest.raises(ValueError, match="read-only"),
    ):
        default_collate([1, 2])
