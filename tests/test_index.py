"""One index rule for every stoker sequence: numpy integers in, DatasetIndexError out of range."""

from __future__ import annotations

import numpy as np
import pytest

from stoker import ArrayDataset, ConcatDataset, DatasetIndexError
from stoker._index import normalize_index, normalize_indices
from stoker.compact import RecordArray, StringArray

OWNERS = {
    "ArrayDataset": lambda: ArrayDataset(np.arange(4)),
    "ConcatDataset": lambda: ConcatDataset(
        [ArrayDataset(np.arange(2)), ArrayDataset(np.arange(2))]
    ),
    "StringArray": lambda: StringArray(["a", "b", "c", "d"]),
    "RecordArray": lambda: RecordArray([("a", 1), ("b", 2), ("c", 3), ("d", 4)]),
}


@pytest.mark.parametrize("owner", sorted(OWNERS))
@pytest.mark.parametrize("index", [np.int8(-1), np.uint16(3), np.int64(3), 3, -1])
def test_every_integer_kind_reaches_the_same_item(owner, index) -> None:
    seq = OWNERS[owner]()
    assert repr(seq[index]) == repr(seq[3])


@pytest.mark.parametrize("owner", sorted(OWNERS))
def test_out_of_range_is_a_dataset_index_error_naming_owner_and_range(owner) -> None:
    seq = OWNERS[owner]()
    with pytest.raises(DatasetIndexError) as info:
        seq[4]
    assert (
        str(info.value)
        == f"index 4 is out of range for {owner} of length 4; valid indices are -4 to 3"
    )
    with pytest.raises(IndexError, match=f"index -5 is out of range for {owner}"):
        seq[-5]


@pytest.mark.parametrize("owner", sorted(OWNERS))
@pytest.mark.parametrize("index", [True, np.bool_(False), 1.0, "1"])
def test_bools_floats_and_strings_are_type_errors(owner, index) -> None:
    with pytest.raises(TypeError, match=f"{owner} index must be an integer, got"):
        OWNERS[owner]()[index]


def test_empty_and_batched_indices() -> None:
    with pytest.raises(
        DatasetIndexError, match="index 0 is out of range for X of length 0; it is empty"
    ):
        normalize_index(0, 0, "X")
    assert normalize_indices(np.array([-1, 0], dtype=np.int16), 3, "X").tolist() == [2, 0]
    assert normalize_indices([], 3, "X").dtype == np.int64
    with pytest.raises(
        DatasetIndexError, match=r"index 7 \(position 1 of the 2 requested\) is out of range for X"
    ):
        normalize_indices([0, 7], 3, "X")
    with pytest.raises(
        TypeError, match=r"X\.__getitems__ needs integer indices, got dtype float64"
    ):
        normalize_indices([0.5], 3, "X")
    with pytest.raises(
        ValueError, match=r"X.__getitems__ needs a flat list of indices, got shape \(1, 1\)"
    ):
        normalize_indices([[0]], 3, "X")
