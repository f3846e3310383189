"""Parity with torch.utils.data.default_collate, and torch tensors as input."""

from __future__ import annotations

from collections import OrderedDict, namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch", reason="torch is the oracle for default_collate parity")
from torch.utils.data import default_collate as torch_default_collate

from collate.allocators import Pool
from stoker._errors import CollateError
from stoker._stacked import StackedSamples
from stoker.collate import collate_into, default_collate, pad_collate

Point = namedtuple("Point", ["x", "y"])


def assert_matches_torch(ours, theirs, where="batch"):
    """Recursive comparison: numpy leaves must equal torch's tensors in value and dtype."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, (np.ndarray, torch.Tensor)), f"{where}: got {type(ours)}"
        ours_t = torch.as_tensor(ours)
        assert ours_t.dtype == theirs.dtype, f"{where}: {ours_t.dtype} != {theirs.dtype}"
        assert ours_t.shape == theirs.shape, f"{where}: {ours_t.shape} != {theirs.shape}"
        assert torch.equal(ours_t, theirs), f"{where}: values differ"
    elif isinstance(theirs, tuple) and hasattr(theirs, "_fields"):
        assert type(ours) is type(theirs), where
        for name in theirs._fields:
            assert_matches_torch(getattr(ours, name), getattr(theirs, name), f"{where}.{name}")
    elif isinstance(theirs, dict):
        assert type(ours) is type(theirs), f"{where}: {type(ours)} != {type(theirs)}"
        assert list(ours) == list(theirs), where
        for k in theirs:
            assert_matches_torch(ours[k], theirs[k], f"{where}[{k!r}]")
    elif isinstance(theirs, (list, tuple)):
        # torch returns the tuple zip() built for nested strings; stoker always a list
        strings = all(isinstance(x, (str, bytes)) for x in theirs)
        assert type(ours) is type(theirs) or (strings and isinstance(ours, list)), where
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_matches_torch(a, b, f"{where}[{i}]")
    else:
        assert type(ours) is type(theirs) and ours == theirs, where


CASES = {
    "ints": [0, 1, 2, 3],
    "floats": [0.5, 1.5, -2.0],
    "bools": [True, False, True],
    "bool and int": [True, 2],
    "float then int": [2.5, 1],
    "strings": ["a", "bc"],
    "bytes": [b"a", b"bc"],
    "float32 arrays": [np.ones((2, 3), np.float32), np.zeros((2, 3), np.float32)],
    "uint8 images": [np.full((3, 4, 4), i, np.uint8) for i in range(3)],
    "int16 0-d arrays": [np.array(3, np.int16), np.array(4, np.int16)],
    "bool arrays": [np.array([True, False]), np.array([False, False])],
    "numpy float32 scalars": [np.float32(1.5), np.float32(2)],
    "numpy int8 scalars": [np.int8(1), np.int8(-3)],
    "numpy bool scalars": [np.bool_(True), np.bool_(False)],
    "numpy float64 scalars": [np.float64(0.25), np.float64(1)],
    "dicts": [{"A": 0, "B": 1.5}, {"A": 100, "B": 2.5}],
    "ordered dicts": [OrderedDict(a=1, b="x"), OrderedDict(a=2, b="y")],
    "nested dicts": [
        {"meta": {"boxes": np.full((2, 4), i, np.float32), "id": i}, "name": f"n{i}"}
        for i in range(3)
    ],
    "namedtuples": [Point(0, np.zeros(2)), Point(1, np.ones(2))],
    "tuples": [(0, 1.5, "a"), (2, 3.5, "b")],
    "lists": [[0, 1], [2, 3]],
    "list of arrays": [[np.zeros(2), np.ones(2)], [np.ones(2), np.zeros(2)]],
    "mixed": [
        (np.full((3, 2, 2), i, np.float32), i, {"w": float(i), "tags": ["x", "y"]}, Point(i, "p"))
        for i in range(4)
    ],
    "tensors": [torch.ones(2, 3), torch.zeros(2, 3)],
    "tensor dicts": [{"t": torch.arange(3) + i, "l": i} for i in range(3)],
    "bfloat16 tensors": [torch.ones(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.bfloat16)],
}


@pytest.mark.parametrize("name", list(CASES))
def test_default_collate_matches_torch(name):
    batch = CASES[name]
    assert_matches_torch(default_collate(batch), torch_default_collate(batch))


def test_known_difference_int_then_float_is_float64():
    # torch.tensor([1, 2.5]) infers float32; stoker picks float64 whatever comes first
    assert torch_default_collate([1, 2.5]).dtype == torch.float32
    assert default_collate([1, 2.5]).dtype == np.float64


@pytest.mark.parametrize("name", ["strings arrays", "object arrays", "none", "ragged"])
def test_both_refuse_the_same_batches(name):
    batch = {
        "strings arrays": [np.array(["a"]), np.array(["b"])],
        "object arrays": [np.array([{}], dtype=object)] * 2,
        "none": [None, None],
        "ragged": [np.zeros(2), np.zeros(3)],
    }[name]
    with pytest.raises((TypeError, RuntimeError)):
        torch_default_collate(batch)
    with pytest.raises(CollateError):
        default_collate(batch)


# ----------------------------------------------------------------- property: random structures

LEAVES = {
    "int": lambda draw: draw(st.integers(-(2**40), 2**40)),
    "float": lambda draw: draw(st.floats(-1e6, 1e6)),
    "bool": lambda draw: draw(st.booleans()),
    "str": lambda draw: draw(st.text(max_size=3)),
    "f32 array": lambda draw: np.full((2, 3), draw(st.floats(-1e3, 1e3, width=32)), np.float32),
    "i64 array": lambda draw: np.arange(4, dtype=np.int64) * draw(st.integers(-9, 9)),
    "u8 scalar": lambda draw: np.uint8(draw(st.integers(0, 255))),
    "f16 scalar": lambda draw: np.float16(draw(st.integers(-100, 100))),
}

schemas = st.recursive(
    st.sampled_from(sorted(LEAVES)),
    lambda children: st.one_of(
        st.dictionaries(st.sampled_from("abcd"), children, min_size=1, max_size=3).map(
            lambda d: ("dict", d)
        ),
        st.lists(children, min_size=1, max_size=3).map(lambda xs: ("list", xs)),
        st.lists(children, min_size=1, max_size=3).map(lambda xs: ("tuple", xs)),
        st.tuples(children, children).map(lambda xy: ("point", xy)),
    ),
    max_leaves=6,
)


def build(draw, schema):
    if isinstance(schema, str):
        return LEAVES[schema](draw)
    kind, parts = schema
    if kind == "dict":
        return {k: build(draw, v) for k, v in parts.items()}
    if kind == "list":
        return [build(draw, v) for v in parts]
    if kind == "tuple":
        return tuple(build(draw, v) for v in parts)
    return Point(*(build(draw, v) for v in parts))


@settings(max_examples=60, deadline=None)
@given(schema=schemas, batch_size=st.integers(1, 4), data=st.data())
def test_random_structures_match_torch(schema, batch_size, data):
    batch = [build(data.draw, schema) for _ in range(batch_size)]
    assert_matches_torch(default_collate(batch), torch_default_collate(batch))


# ----------------------------------------------------------------- tensors


def test_tensor_shape_mismatch_names_the_field():
    with pytest.raises(
        CollateError,
        match=r"sample\['t'\] \(batch of 2\): sample 0 has shape \(2,\) but sample 1 has "
        r"shape \(3,\)",
    ):
        default_collate([{"t": torch.zeros(2)}, {"t": torch.zeros(3)}])


def test_tensor_mixed_with_array_is_named():
    with pytest.raises(
        CollateError, match=r"sample 0 is torch.Tensor but sample 1 is numpy.ndarray"
    ):
        default_collate([torch.zeros(2), np.zeros(2)])


def test_sparse_and_nested_tensors_are_refused():
    sparse = torch.zeros(2, 2).to_sparse()
    with pytest.raises(CollateError, match="batches of sparse tensors are not supported"):
        default_collate([sparse, sparse])


def test_stacked_samples_with_tensor_columns():
    images = torch.arange(24, dtype=torch.float32).reshape(4, 2, 3)
    labels = torch.arange(4)
    stacked = StackedSamples((images, labels))
    fast = default_collate(stacked)
    slow = default_collate(list(stacked))
    assert isinstance(fast, list) and all(isinstance(c, torch.Tensor) for c in fast)
    for a, b in zip(fast, slow, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert fast[0].data_ptr() != images.data_ptr()
    assert_matches_torch(fast, torch_default_collate(list(stacked)))


def test_collate_into_stacks_tensors_into_allocator_memory():
    pool = Pool()
    batch = [
        {"t": torch.full((2, 2), float(i)), "bf": torch.ones(2, dtype=torch.bfloat16)}
        for i in range(3)
    ]
    with collate_into(pool):
        out = default_collate(batch)
        padded = pad_collate([(torch.tensor([1, 2]),), (torch.tensor([3]),)])
    assert np.shares_memory(out["t"].numpy(), pool.buffer)
    assert torch.equal(out["t"], torch_default_collate(batch)["t"])
    # bfloat16 has no numpy dtype: stacked normally
    assert torch.equal(out["bf"], torch_default_collate(batch)["bf"])
    assert np.shares_memory(padded[0].numpy(), pool.buffer)
    assert padded[0].tolist() == [[1, 2], [3, 0]]
