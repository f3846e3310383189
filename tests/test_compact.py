"""StringArray / RecordArray behave like the lists they replace, without per-item objects."""

from __future__ import annotations

import pathlib
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker import DatasetIndexError
from stoker.compact import RecordArray, StringArray, compact

texts = st.lists(st.text(max_size=12), max_size=40)


@settings(max_examples=80, deadline=None)
@given(texts, st.data())
def test_string_array_behaves_like_the_list(items, data) -> None:
    array = StringArray(items)
    assert len(array) == len(items)
    assert list(array) == items
    assert array == items
    if items:
        i = data.draw(st.integers(-len(items), len(items) - 1))
        assert array[i] == items[i]
    start = data.draw(st.integers(-50, 50))
    stop = data.draw(st.integers(-50, 50))
    step = data.draw(st.sampled_from([1, 2, -1, 3]))
    assert array[start:stop:step].tolist() == items[start:stop:step]
    assert pickle.loads(pickle.dumps(array)) == array


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(max_size=8), st.integers(-(2**40), 2**40), st.booleans()),
        min_size=1,
        max_size=30,
    )
)
def test_record_array_behaves_like_the_list_of_tuples(rows) -> None:
    array = RecordArray(rows)
    assert list(array) == rows
    assert array[-1] == rows[-1]
    assert array[1:3] == rows[1:3]
    assert list(pickle.loads(pickle.dumps(array))) == rows


def test_paths_bytes_and_dict_records() -> None:
    paths = StringArray([pathlib.Path("/data/猫.jpg"), "/data/chat_été.png"])
    assert paths[0] == "/data/猫.jpg"
    raw = StringArray([b"\x00\x01", b""], encoding=None)
    assert raw[0] == b"\x00\x01" and raw[1] == b""
    rows = RecordArray(
        [{"path": "a.jpg", "label": 1, "w": 0.5}, {"path": "b.jpg", "label": 2, "w": 1}]
    )
    assert rows[1] == {"path": "b.jpg", "label": 2, "w": 1.0}
    assert rows.column("label").tolist() == [1, 2]
    assert isinstance(compact(["x"]), StringArray)
    assert isinstance(compact([("x", 1)]), RecordArray)


def test_storage_is_a_few_arrays_not_per_item_objects() -> None:
    items = [f"/datasets/imagenet/train/n{i:08d}/img_{i}.JPEG" for i in range(10_000)]
    array = StringArray(items)
    data, offsets = array.arrays
    assert isinstance(data, np.ndarray) and data.dtype == np.uint8
    assert offsets.dtype == np.int64 and len(offsets) == len(items) + 1
    as_list = sum(len(s) + 49 for s in items) + 8 * len(items)  # str objects + list pointers
    assert array.nbytes < 0.6 * as_list  # and, above all, no object whose refcount a read dirties


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: StringArray(["a", 3]), TypeError, "item 1 is a int: 3"),
        (lambda: StringArray(["a", b"b"]), TypeError, "item 1 is bytes but item 0 is text"),
        (
            lambda: RecordArray([("a", 1), ("b",)]),
            ValueError,
            r"record 1 is \('b',\) but record 0 is \('a', 1\)",
        ),
        (
            lambda: RecordArray([("a", 1), ("b", "x")]),
            TypeError,
            "field 1 must have one type in every record; record 1",
        ),
        (lambda: RecordArray(["a"]), TypeError, "Use StringArray for a list of strings"),
        (
            lambda: StringArray(["a"])[1],
            DatasetIndexError,
            "index 1 is out of range for StringArray of length 1",
        ),
    ],
)
def test_errors_name_the_item_and_the_fix(make, error, message) -> None:
    with pytest.raises(error, match=message):
        make()
