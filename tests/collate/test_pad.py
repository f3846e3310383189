"""PadCollate / pad_collate."""

from __future__ import annotations

import pickle
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collate.allocators import Pool
from stoker._errors import CollateError
from stoker.collate import PadCollate, collate_into, pad_collate


def test_dict_samples_right_padding():
    batch = [
        {"input_ids": [5, 6, 7], "label": 1},
        {"input_ids": [8], "label": 0},
        {"input_ids": [9, 10], "label": 1},
    ]
    out = pad_collate(batch, pad_value=0)
    assert list(out) == ["input_ids", "label", "attention_mask", "lengths"]
    assert out["input_ids"].dtype == np.int64
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert out["label"].tolist() == [1, 0, 1]
    assert out["attention_mask"].dtype == np.bool_
    assert out["attention_mask"].tolist() == [
        [True, True, True],
        [True, False, False],
        [True, True, False],
    ]
    assert out["lengths"].dtype == np.int64
    assert out["lengths"].tolist() == [3, 1, 2]


def test_left_padding_puts_pads_at_the_start():
    batch = [{"input_ids": np.array([5, 6, 7], np.int32)}, {"input_ids": np.array([8], np.int32)}]
    out = pad_collate(batch, pad_value=2, side="left")
    assert out["input_ids"].dtype == np.int32
    assert out["input_ids"].tolist() == [[5, 6, 7], [2, 2, 8]]
    assert out["attention_mask"].tolist() == [[True, True, True], [False, False, True]]
    assert out["lengths"].tolist() == [3, 1]


def test_tuple_samples_append_mask_and_lengths():
    ids, labels, mask, lengths = pad_collate([(np.array([1, 2, 3]), 7), (np.array([4]), 8)])
    assert ids.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert labels.tolist() == [7, 8]
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    assert lengths.tolist() == [3, 1]


def test_names_turn_tuple_samples_into_a_dict():
    out = PadCollate(names=("input_ids", "labels"))([([1, 2], 0), ([3], 1)])
    assert list(out) == ["input_ids", "labels", "attention_mask", "lengths"]
    assert out["input_ids"].tolist() == [[1, 2], [3, 0]]
    with pytest.raises(
        CollateError, match=r"needs samples of 2 elements, but sample 1 has 3 elements"
    ):
        PadCollate(names=("input_ids", "labels"))([([1, 2], 0), ([3], 1, 2)])


def test_namedtuple_samples_are_treated_as_dicts():
    Sample = namedtuple("Sample", ["ids", "label"])
    out = pad_collate([Sample([1, 2], 0), Sample([3], 1)])
    assert list(out) == ["ids", "label", "attention_mask", "lengths"]
    assert out["ids"].tolist() == [[1, 2], [3, 0]]


def test_existing_attention_mask_is_padded_with_zero_and_kept():
    batch = [
        {"input_ids": [101, 7, 102], "attention_mask": [1, 1, 1], "token_type_ids": [0, 0, 0]},
        {"input_ids": [101, 102], "attention_mask": [1, 1], "token_type_ids": [0, 0]},
    ]
    out = pad_collate(batch, pad_value={"input_ids": 50256, "token_type_ids": 0})
    assert list(out) == ["input_ids", "attention_mask", "token_type_ids", "lengths"]
    assert out["input_ids"].tolist() == [[101, 7, 102], [101, 102, 50256]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]  # not 50256
    assert out["attention_mask"].dtype == np.int64
    # a scalar pad value does not leak into the mask either
    assert pad_collate(batch, pad_value=9)["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]


def test_groups_pad_to_one_common_length_and_mask_follows_primary():
    batch = [
        {"input_ids": [1, 2], "labels": [1, 2, 3, 4]},
        {"input_ids": [3, 4, 5], "labels": [5]},
    ]
    collate_fn = PadCollate({"input_ids": 0, "labels": -100}, groups=[("input_ids", "labels")])
    out = collate_fn(batch)
    assert out["input_ids"].tolist() == [[1, 2, 0, 0], [3, 4, 5, 0]]
    assert out["labels"].tolist() == [[1, 2, 3, 4], [5, -100, -100, -100]]
    assert out["lengths"].tolist() == [2, 3]
    assert out["attention_mask"].tolist() == [[True, True, False, False], [True, True, True, False]]
    # without the group each field gets its own batch maximum
    separate = PadCollate({"input_ids": 0, "labels": -100})(batch)
    assert separate["input_ids"].shape == (2, 3)
    assert separate["labels"].shape == (2, 4)


def test_explicit_fields_pick_primary_and_leave_others_alone():
    batch = [
        {"labels": [1, 2], "input_ids": [7], "image": np.zeros((3, 2, 2))},
        {"labels": [4, 5], "input_ids": [8, 9], "image": np.ones((3, 2, 2))},
    ]
    out = pad_collate(batch, fields=["input_ids"], pad_value=0)
    assert out["input_ids"].tolist() == [[7, 0], [8, 9]]
    assert out["lengths"].tolist() == [1, 2]
    assert out["image"].shape == (2, 3, 2, 2)
    # labels were not padded: default_collate transposes lists, as torch does
    assert [c.tolist() for c in out["labels"]] == [[1, 4], [2, 5]]
    batch[1]["labels"] = [4]
    with pytest.raises(
        CollateError, match=r"field sample\['labels'\] \(batch of 2\): sample 0 has 2 elements"
    ):
        pad_collate(batch, fields=["input_ids"], pad_value=0)


def test_auto_picks_one_dimensional_sequences_only():
    batch = [
        {"audio": np.zeros((5, 2), np.float32), "ids": np.array([1, 2])},
        {"audio": np.zeros((3, 2), np.float32), "ids": np.array([3])},
    ]
    with pytest.raises(CollateError) as info:
        pad_collate(batch)
    assert (
        "cannot stack field sample['audio'] (batch of 2): sample 0 has shape (5, 2) but "
        "sample 1 has shape (3, 2)." in str(info.value)
    )
    assert "list the field in PadCollate(fields=[...]) to pad it along axis 0" in str(info.value)
    out = pad_collate(batch, fields=["audio", "ids"], pad_value=0)
    assert out["audio"].shape == (2, 5, 2)
    assert out["audio"].dtype == np.float32
    assert out["lengths"].tolist() == [5, 3]


def test_axis_one():
    batch = [(np.ones((2, 3)),), (np.ones((2, 1)) * 2,)]
    feats, mask, lengths = pad_collate(batch, axis=1, pad_value=-1.0)
    assert feats.shape == (2, 2, 3)
    assert feats[1].tolist() == [[2, -1, -1], [2, -1, -1]]
    assert mask.shape == (2, 3)
    assert lengths.tolist() == [3, 1]


def test_other_dimensions_must_agree():
    batch = [{"x": np.zeros((3, 2))}, {"x": np.zeros((4, 5))}]
    with pytest.raises(CollateError) as info:
        pad_collate(batch, fields=["x"])
    assert str(info.value) == (
        "PadCollate cannot pad or concatenate field sample['x'] (batch of 2): sample 0 has "
        "shape (3, 2) but sample 1 has shape (4, 5); they may differ only along axis 0."
    )


def test_pad_to_multiple_of_and_max_length():
    batch = [{"ids": list(range(1, 6))}, {"ids": [1]}]
    out = pad_collate(batch, pad_to_multiple_of=4)
    assert out["ids"].shape == (2, 8)
    assert out["attention_mask"].sum(axis=1).tolist() == [5, 1]
    trunc = pad_collate(batch, max_length=3)
    assert trunc["ids"].tolist() == [[1, 2, 3], [1, 0, 0]]
    assert trunc["lengths"].tolist() == [3, 1]
    left = pad_collate(batch, max_length=3, side="left")
    assert left["ids"].tolist() == [[1, 2, 3], [0, 0, 1]]
    both = pad_collate(batch, max_length=4, pad_to_multiple_of=2)
    assert both["ids"].shape == (2, 4)


def test_empty_sequences():
    out = pad_collate([{"ids": []}, {"ids": [3, 4]}])
    assert out["ids"].dtype == np.int64
    assert out["ids"].tolist() == [[0, 0], [3, 4]]
    assert out["lengths"].tolist() == [0, 2]
    none = pad_collate([{"ids": []}, {"ids": []}], pad_value=0.5)
    assert none["ids"].shape == (2, 0) and none["ids"].dtype == np.float64


def test_mask_and_lengths_can_be_turned_off():
    out = pad_collate([([1, 2],), ([3],)], mask_key=None, lengths_key=None)
    assert len(out) == 1 and out[0].tolist() == [[1, 2], [3, 0]]
    out = pad_collate([{"ids": [1]}, {"ids": [2, 3]}], mask_key="mask", lengths_key=None)
    assert list(out) == ["ids", "mask"]


def test_collate_into_covers_padded_fields_mask_and_lengths():
    pool = Pool()
    batch = [{"ids": [1, 2, 3], "label": 0}, {"ids": [4], "label": 1}]
    with collate_into(pool):
        out = pad_collate(batch)
    plain = pad_collate(batch)
    for key in plain:
        assert np.shares_memory(out[key], pool.buffer), key
        np.testing.assert_array_equal(out[key], plain[key])
        assert out[key].dtype == plain[key].dtype


def test_pickles_for_worker_processes():
    collate_fn = PadCollate({"ids": 0}, groups=[("ids",)], side="left")
    clone = pickle.loads(pickle.dumps(collate_fn))
    assert clone == collate_fn
    assert clone([{"ids": [1]}, {"ids": [2, 3]}])["ids"].tolist() == [[0, 1], [2, 3]]


# ----------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"side": "top"}, ValueError, 'side must be "left" or "right", got \'top\''),
        (
            {"pad_value": "0"},
            TypeError,
            "pad_value must be a number or a mapping from field to number, got '0'",
        ),
        ({"pad_value": {"ids": None}}, TypeError, "pad_value['ids'] must be a number, got None"),
        (
            {"fields": "input_ids"},
            TypeError,
            "fields must be a list of field names (dict keys or tuple positions), got "
            "'input_ids'; pass e.g. fields=['input_ids']",
        ),
        ({"fields": []}, ValueError, "fields must name at least one field to pad, got []"),
        ({"fields": ["a", "a"]}, ValueError, "fields names a field twice: ['a', 'a']"),
        ({"groups": [("a",), ("a", "b")]}, ValueError, "field 'a' is in more than one group"),
        ({"groups": [()]}, ValueError, "groups must not contain an empty group"),
        (
            {"axis": -1},
            ValueError,
            "axis must be a non-negative integer (an axis of one sample), got -1",
        ),
        ({"axis": 1.0}, TypeError, "axis must be a non-negative integer, got 1.0"),
        (
            {"pad_to_multiple_of": 0},
            ValueError,
            "pad_to_multiple_of must be a positive integer or None, got 0",
        ),
        (
            {"max_length": True},
            ValueError,
            "max_length must be a positive integer or None, got True",
        ),
        (
            {"max_length": 10, "pad_to_multiple_of": 8},
            ValueError,
            "max_length (10) must be a multiple of pad_to_multiple_of (8); pass max_length=16 or 8",
        ),
        (
            {"mask_key": "k", "lengths_key": "k"},
            ValueError,
            "mask_key and lengths_key must differ, both are 'k'",
        ),
        (
            {"mask_key": ["m"]},
            TypeError,
            "mask_key must be a hashable field name or None, got ['m']",
        ),
    ],
)
def test_argument_validation(kwargs, error, text):
    with pytest.raises(error) as info:
        PadCollate(**kwargs)
    assert text in str(info.value)


def test_pad_value_must_fit_the_dtype():
    batch = [{"ids": np.array([1, 2], np.uint8)}, {"ids": np.array([3], np.uint8)}]
    with pytest.raises(ValueError) as info:
        pad_collate(batch, pad_value=-100)
    assert str(info.value).startswith(
        "cannot pad field sample['ids'] with pad_value -100: its dtype uint8 cannot hold that "
        "value exactly."
    )
    with pytest.raises(ValueError, match=r"pad_value 0\.5"):
        pad_collate([{"ids": [1]}, {"ids": [1, 2]}], pad_value=0.5)
    floats = pad_collate(
        [{"x": np.ones(1, np.float32)}, {"x": np.ones(2, np.float32)}], pad_value=0.1
    )
    assert floats["x"][0, 1] == np.float32(0.1)
    nan = pad_collate([{"x": [1.0]}, {"x": [1.0, 2.0]}], pad_value=float("nan"))
    assert np.isnan(nan["x"][0, 1])


def test_mapping_pad_value_must_cover_padded_fields():
    with pytest.raises(
        ValueError, match=r"pad_value has no entry for the padded field 'labels'; add one"
    ):
        pad_collate(
            [{"ids": [1], "labels": [1]}, {"ids": [1, 2], "labels": [1, 2]}], pad_value={"ids": 0}
        )


def test_unknown_field_is_named():
    with pytest.raises(CollateError) as info:
        pad_collate([{"ids": [1]}], fields=["input_ids"])
    assert str(info.value) == (
        "PadCollate names the field 'input_ids', which is not one of the samples' keys ['ids']. "
        "Check fields= and groups=."
    )


def test_nothing_to_pad_is_an_error():
    with pytest.raises(
        CollateError,
        match=r"found no variable-length field to pad in samples with the samples' keys "
        r"\['a', 'b'\]",
    ):
        pad_collate([{"a": 1, "b": "x"}])


def test_lengths_key_conflict():
    with pytest.raises(CollateError, match="the samples already have a field 'lengths'"):
        pad_collate([{"ids": [1], "lengths": 1}])


def test_bad_samples():
    with pytest.raises(
        CollateError, match=r"needs samples that are dicts or tuples of fields, got numpy\.ndarray"
    ):
        pad_collate([np.array([1, 2]), np.array([3])])
    with pytest.raises(CollateError, match="cannot collate an empty batch"):
        pad_collate([])
    with pytest.raises(CollateError, match=r"sample 1 has no key 'ids'"):
        pad_collate([{"ids": [1]}, {"other": [1]}])
    with pytest.raises(
        CollateError,
        match=r"field sample\['ids'\] \(batch of 2\): sample 1 is int, which is not a "
        r"sequence of numbers",
    ):
        pad_collate([{"ids": [1]}, {"ids": 5}])
    with pytest.raises(CollateError, match=r"sample 1 is str, which is not a sequence of numbers"):
        pad_collate([{"ids": np.array([1])}, {"ids": "ab"}], fields=["ids"])


def test_string_lists_are_not_auto_padded():
    batch = [{"ids": [1, 2], "tokens": ["a", "b"]}, {"ids": [3], "tokens": ["c", "d"]}]
    out = pad_collate(batch)
    assert out["tokens"] == [["a", "c"], ["b", "d"]]  # default_collate's transpose


# ----------------------------------------------------------------- property


def unpad(padded, lengths, mask, side):
    rows = []
    for row, n, m in zip(padded, lengths, mask, strict=True):
        assert m.sum() == n
        real = row[m]
        expected = row[: len(row)][len(row) - n :] if side == "left" else row[:n]
        np.testing.assert_array_equal(real, expected)
        rows.append(real.tolist())
    return rows


@settings(max_examples=80, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=7), min_size=1, max_size=6),
    side=st.sampled_from(["left", "right"]),
    as_array=st.booleans(),
    multiple=st.sampled_from([None, 1, 3, 8]),
    pad=st.integers(-5, 5),
)
def test_unpadding_gives_back_the_sequences(seqs, side, as_array, multiple, pad):
    batch = [{"ids": np.array(s, np.int64) if as_array else s, "n": len(s)} for s in seqs]
    out = pad_collate(batch, pad_value=pad, side=side, pad_to_multiple_of=multiple)
    lengths, mask, padded = out["lengths"], out["attention_mask"], out["ids"]
    assert lengths.tolist() == [len(s) for s in seqs]
    assert out["n"].tolist() == lengths.tolist()
    width = max(len(s) for s in seqs)
    if multiple:
        width = -(-width // multiple) * multiple
    assert padded.shape == (len(seqs), width)
    assert unpad(padded, lengths, mask, side) == seqs
    assert (padded[~mask] == pad).all()


# ----------------------------------------------------------------- torch


def test_torch_tensors_match_the_seed_reference_implementation():
    torch = pytest.importorskip("torch", reason="checks the torch tensor path of pad_collate")

    def reference(batch):  # the hand-written collate from the seed article
        ids_list, labels = zip(*batch, strict=True)
        lengths = torch.tensor([len(x) for x in ids_list], dtype=torch.long)
        max_len = int(lengths.max())
        padded = torch.zeros(len(ids_list), max_len, dtype=torch.long)
        mask = torch.zeros(len(ids_list), max_len, dtype=torch.bool)
        for i, ids in enumerate(ids_list):
            padded[i, : len(ids)] = ids
            mask[i, : len(ids)] = True
        return {
            "input_ids": padded,
            "attention_mask": mask,
            "lengths": lengths,
            "labels": torch.tensor(labels, dtype=torch.long),
        }

    batch = [(torch.tensor([3, 1, 4, 1]), 0), (torch.tensor([5]), 1), (torch.tensor([9, 2]), 1)]
    ours = PadCollate(names=("input_ids", "labels"))(batch)
    theirs = reference(batch)
    assert set(ours) == set(theirs)
    for key in ("input_ids", "attention_mask", "lengths"):
        assert isinstance(ours[key], torch.Tensor), key
        assert ours[key].dtype == theirs[key].dtype and torch.equal(ours[key], theirs[key]), key
    assert torch.equal(torch.as_tensor(ours["labels"]), theirs["labels"])

    left = pad_collate(
        [(torch.tensor([1.5, 2.5]),), (torch.tensor([3.5]),)], side="left", pad_value=-1
    )
    assert left[0].dtype == torch.float32
    assert left[0].tolist() == [[1.5, 2.5], [-1.0, 3.5]]
    with pytest.raises(ValueError, match="cannot hold that value exactly"):
        pad_collate([(torch.tensor([1], dtype=torch.uint8),)], pad_value=-100)
    with pytest.raises(CollateError, match=r"sample 0 is torch.Tensor but sample 1 is list"):
        pad_collate([(torch.tensor([1]),), ([2],)])


def test_numpy_integers_are_options_too():
    batch = [{"ids": np.arange(3)}, {"ids": np.arange(6)}]
    numpy = PadCollate(
        pad_value=np.int64(-1),
        pad_to_multiple_of=np.int64(4),
        max_length=np.int32(8),
        axis=np.int64(0),
    )
    plain = PadCollate(pad_value=-1, pad_to_multiple_of=4, max_length=8, axis=0)
    assert numpy == plain
    assert all(type(getattr(numpy, n)) is int for n in ("pad_to_multiple_of", "max_length", "axis"))
    np.testing.assert_array_equal(numpy(batch)["ids"], plain(batch)["ids"])
    assert numpy(batch)["ids"].shape == (2, 8)
