"""RaggedCollate: concatenated variable-count fields with a batch index."""

from __future__ import annotations

import pickle
from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collate.allocators import Pool
from stoker._errors import CollateError
from stoker.collate import RaggedCollate, collate_into


def detection_batch():
    return [
        {
            "image": np.zeros((3, 4, 4), np.uint8),
            "boxes": np.ones((2, 4), np.float32),
            "labels": [1, 2],
        },
        {
            "image": np.ones((3, 4, 4), np.uint8),
            "boxes": np.zeros((0, 4), np.float32),
            "labels": [],
        },
        {
            "image": np.ones((3, 4, 4), np.uint8),
            "boxes": np.full((1, 4), 2, np.float32),
            "labels": np.array([3]),
        },
    ]


def test_concatenates_and_adds_batch_index():
    out = RaggedCollate(fields=("boxes", "labels"), counts_key="counts")(detection_batch())
    assert list(out) == ["image", "boxes", "labels", "batch_index", "counts"]
    assert out["image"].shape == (3, 3, 4, 4)
    assert out["boxes"].dtype == np.float32
    assert out["boxes"].tolist() == [[1] * 4, [1] * 4, [2] * 4]
    assert out["labels"].dtype == np.int64
    assert out["labels"].tolist() == [1, 2, 3]
    assert out["batch_index"].dtype == np.int64
    assert out["batch_index"].tolist() == [0, 0, 2]
    assert out["counts"].tolist() == [2, 0, 1]


def test_prepend_batch_index_column_yolo_style():
    collate_fn = RaggedCollate(("boxes",), batch_index_key=None, prepend_batch_index=("boxes",))
    out = collate_fn([{k: v for k, v in s.items() if k != "labels"} for s in detection_batch()])
    assert list(out) == ["image", "boxes"]
    assert out["boxes"].shape == (3, 5)
    assert out["boxes"][:, 0].tolist() == [0, 0, 2]
    assert out["boxes"][:, 1:].tolist() == [[1] * 4, [1] * 4, [2] * 4]
    # labels not listed: default_collate refuses the variable-length lists, naming them
    lists = [{**s, "labels": [int(x) for x in s["labels"]]} for s in detection_batch()]
    with pytest.raises(
        CollateError,
        match=r"field sample\['labels'\] \(batch of 3\): sample 0 has 2 elements but "
        r"sample 1 has 0",
    ):
        RaggedCollate(("boxes",))(lists)


def test_every_sample_empty():
    batch = [{"boxes": np.zeros((0, 4), np.float32), "labels": []} for _ in range(3)]
    out = RaggedCollate(("boxes", "labels"), prepend_batch_index=("boxes",))(batch)
    assert out["boxes"].shape == (0, 5) and out["boxes"].dtype == np.float32
    assert out["labels"].shape == (0,)
    assert out["batch_index"].shape == (0,)
    empty_lists = RaggedCollate(("boxes",))([{"boxes": []}, {"boxes": np.array([])}])
    assert empty_lists["boxes"].shape == (0,)


def test_empty_lists_and_empty_1d_arrays_mean_no_rows():
    batch = [{"boxes": []}, {"boxes": np.ones((2, 4), np.int32)}, {"boxes": np.array([], np.int32)}]
    out = RaggedCollate(("boxes",))(batch)
    assert out["boxes"].shape == (2, 4) and out["boxes"].dtype == np.int32
    assert out["batch_index"].tolist() == [1, 1]


def test_tuple_samples_use_positions():
    batch = [(np.zeros((2, 2)), np.ones((3, 4)), 0), (np.zeros((2, 2)), np.ones((1, 4)), 1)]
    image, boxes, label, batch_index = RaggedCollate((1,))(batch)
    assert image.shape == (2, 2, 2)
    assert boxes.shape == (4, 4)
    assert label.tolist() == [0, 1]
    assert batch_index.tolist() == [0, 0, 0, 1]


def test_namedtuple_samples_are_treated_as_dicts():
    Target = namedtuple("Target", ["boxes", "labels"])
    out = RaggedCollate(("boxes", "labels"))([Target([[0, 0, 1, 1]], [4]), Target([], [])])
    assert list(out) == ["boxes", "labels", "batch_index"]
    assert out["boxes"].tolist() == [[0, 0, 1, 1]]


def test_fields_of_one_sample_must_agree_on_count():
    batch = detection_batch()
    batch[2]["labels"] = [3, 4]
    with pytest.raises(CollateError) as info:
        RaggedCollate(("boxes", "labels"))(batch)
    assert str(info.value) == (
        "RaggedCollate: sample 2 has 1 rows in sample['boxes'] but 2 in field "
        "sample['labels']; the fields of one sample must have one row per object."
    )


def test_row_shapes_must_agree():
    batch = [{"boxes": np.zeros((2, 4))}, {"boxes": np.zeros((1, 5))}]
    with pytest.raises(
        CollateError,
        match=r"field sample\['boxes'\] \(batch of 2\): sample 0 has shape \(2, 4\) but "
        r"sample 1 has shape \(1, 5\); they may differ only along axis 0",
    ):
        RaggedCollate(("boxes",))(batch)


def test_prepend_needs_2d_rows():
    with pytest.raises(
        CollateError,
        match=r"only to 2-D fields, but field sample\['labels'\] has rows of shape \(\)",
    ):
        RaggedCollate(("labels",), prepend_batch_index=("labels",))([{"labels": [1]}])


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "text"),
    [
        (
            ("boxes",),
            {},
            TypeError,
            "fields must be a list of field names (dict keys or tuple positions), got "
            "'boxes'; pass e.g. fields=['boxes']",
        ),
        (((),), {}, ValueError, "fields must name at least one variable-count field, got []"),
        (
            (("boxes",),),
            {"prepend_batch_index": ("labels",)},
            ValueError,
            "prepend_batch_index names 'labels', which is not in fields=['boxes']",
        ),
        (
            (("boxes",),),
            {"batch_index_key": "boxes"},
            ValueError,
            "batch_index_key='boxes' is also in fields; pick another name",
        ),
        (
            (("boxes",),),
            {"counts_key": "batch_index"},
            ValueError,
            "batch_index_key and counts_key must differ, both are 'batch_index'",
        ),
        (
            (("boxes",),),
            {"batch_index_key": None},
            ValueError,
            "RaggedCollate needs batch_index_key, counts_key or prepend_batch_index",
        ),
    ],
)
def test_argument_validation(args, kwargs, error, text):
    with pytest.raises(error) as info:
        RaggedCollate(*args, **kwargs)
    assert text in str(info.value)


def test_call_time_errors():
    with pytest.raises(
        CollateError, match=r"names 'box', which is not one of the samples' keys \['boxes'\]"
    ):
        RaggedCollate(("box",))([{"boxes": []}])
    with pytest.raises(
        CollateError,
        match="already have a field 'batch_index', where RaggedCollate puts the batch index",
    ):
        RaggedCollate(("boxes",))([{"boxes": [], "batch_index": 0}])
    with pytest.raises(CollateError, match="cannot collate an empty batch"):
        RaggedCollate(("boxes",))([])


def test_collate_into_covers_every_array():
    pool = Pool()
    collate_fn = RaggedCollate(("boxes", "labels"), prepend_batch_index=("boxes",), counts_key="n")
    plain = collate_fn(detection_batch())
    with collate_into(pool):
        pooled = collate_fn(detection_batch())
    for key in plain:
        assert np.shares_memory(pooled[key], pool.buffer), key
        assert pooled[key].dtype == plain[key].dtype
        np.testing.assert_array_equal(pooled[key], plain[key])


def test_pickles():
    collate_fn = RaggedCollate(("boxes",), counts_key="n")
    assert pickle.loads(pickle.dumps(collate_fn)) == collate_fn


@settings(max_examples=50, deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=1, max_size=6), data=st.data())
def test_split_by_batch_index_gives_back_the_samples(counts, data):
    batch = [
        {
            "boxes": np.array(
                data.draw(
                    st.lists(
                        st.lists(st.floats(0, 1, width=32), min_size=4, max_size=4),
                        min_size=n,
                        max_size=n,
                    )
                ),
                np.float32,
            ).reshape(n, 4),
            "labels": data.draw(st.lists(st.integers(0, 80), min_size=n, max_size=n)),
        }
        for n in counts
    ]
    out = RaggedCollate(("boxes", "labels"), counts_key="counts")(batch)
    assert out["counts"].tolist() == counts
    for i, sample in enumerate(batch):
        rows = out["batch_index"] == i
        np.testing.assert_array_equal(out["boxes"][rows], sample["boxes"])
        assert out["labels"][rows].tolist() == sample["labels"]


def test_torch_tensors_match_a_yolo_reference():
    torch = pytest.importorskip("torch", reason="checks the torch tensor path of RaggedCollate")
    samples = [
        (
            torch.zeros(3, 2, 2),
            torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.4], [1.0, 0.5, 0.5, 0.1, 0.1]]),
        ),
        (torch.ones(3, 2, 2), torch.zeros((0, 5))),
        (torch.ones(3, 2, 2), torch.tensor([[2.0, 0.3, 0.3, 0.2, 0.2]])),
    ]

    def yolo_reference(batch):  # yolov5's collate_fn: targets get the image index in column 0
        images, labels = zip(*batch, strict=True)
        targets = []
        for i, lb in enumerate(labels):
            t = torch.zeros((lb.shape[0], 6))
            t[:, 1:] = lb
            t[:, 0] = i
            targets.append(t)
        return torch.stack(images, 0), torch.cat(targets, 0)

    images, targets, batch_index = RaggedCollate((1,), prepend_batch_index=(1,))(samples)
    ref_images, ref_targets = yolo_reference(samples)
    assert isinstance(targets, torch.Tensor) and isinstance(batch_index, torch.Tensor)
    assert torch.equal(images, ref_images)
    assert targets.dtype == ref_targets.dtype and torch.equal(targets, ref_targets)
    assert batch_index.tolist() == [0, 0, 2]
    plain = RaggedCollate((1,))(samples)
    assert torch.equal(plain[1], torch.cat([s[1] for s in samples]))
