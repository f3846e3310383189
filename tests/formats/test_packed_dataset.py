"""PackedDataset as a dataset: views, batches, metadata, pickling, forking and loaders."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import pickle

import numpy as np
import pytest

from stoker import BlockShuffleSampler, DataLoader, DatasetIndexError
from stoker.formats.packed import PackedDataset, PackedFormatError, PackedWriter


def image_records(n: int) -> list[tuple[np.ndarray, int]]:
    return [
        (np.full((3, 4, 5), i, dtype=np.float32) + np.arange(5, dtype=np.float32), i % 3)
        for i in range(n)
    ]


@pytest.fixture
def packed(tmp_path) -> str:
    path = str(tmp_path / "images")
    with PackedWriter(
        path, max_shard_bytes=4096, classes=["cat", "dog", "émeu"], metadata={"split": "train"}
    ) as writer:
        for i, record in enumerate(image_records(50)):
            writer.add(record, key=f"class{i % 3}/{i:03d}.jpg")
    return path


def mapping_of(obj) -> object:
    """Follows .base / .obj links to what finally owns the memory."""
    seen = 0
    while seen < 20:
        nxt = (
            getattr(obj, "obj", None) if isinstance(obj, memoryview) else getattr(obj, "base", None)
        )
        if nxt is None:
            return obj
        obj, seen = nxt, seen + 1
    raise AssertionError("base chain too long")


# -- views and copies ---------------------------------------------------------------------------


def test_arrays_and_bytes_are_read_only_views_of_the_memory_map(packed, tmp_path) -> None:
    ds = PackedDataset(packed)
    image, _ = ds[7]
    assert isinstance(mapping_of(image), mmap.mmap)
    assert not image.flags.writeable
    shard = next(k for k, p in enumerate(ds.shard_paths) if ds.describe_sample(7).startswith(p))
    assert np.shares_memory(image, ds._opened.maps[shard])  # a window of the shard's mapping
    first, second = ds[0][0], ds[1][0]
    assert not np.shares_memory(first, second)
    assert mapping_of(first) is mapping_of(second)  # one mapping per shard, not one per read
    with PackedWriter(tmp_path / "b") as writer:
        writer.add(b"payload")
    view = PackedDataset(tmp_path / "b")[0]
    assert (
        isinstance(view, memoryview) and view.readonly and isinstance(mapping_of(view), mmap.mmap)
    )
    with pytest.raises(TypeError):
        view[0] = 1


def test_copy_true_gives_bytes_and_writable_arrays_that_own_their_memory(packed, tmp_path) -> None:
    image, _ = PackedDataset(packed, copy=True)[7]
    assert image.flags.writeable and image.flags.owndata
    image += 1  # does not touch the file
    np.testing.assert_array_equal(PackedDataset(packed)[7][0], image - 1)
    with PackedWriter(tmp_path / "b") as writer:
        writer.add(b"payload")
    assert PackedDataset(tmp_path / "b", copy=True)[0] == b"payload"


# -- indexing and batches ---------------------------------------------------------------------


def test_getitem_checks_indices_like_a_sequence(packed) -> None:
    ds = PackedDataset(packed)
    assert len(ds) == 50
    np.testing.assert_array_equal(ds[-1][0], ds[49][0])
    assert ds[np.int64(4)][1] == 1
    with pytest.raises(
        DatasetIndexError,
        match=r"index 50 is out of range for PackedDataset of length 50; valid indices are -50 to "
        r"49",
    ):
        ds[50]
    with pytest.raises(IndexError, match="index -51 is out of range"):
        ds[-51]
    with pytest.raises(TypeError, match="PackedDataset index must be an integer, got str: '3'"):
        ds["3"]


def test_getitems_returns_the_same_samples_as_getitem_in_order(packed) -> None:
    ds = PackedDataset(packed)
    order = [49, 0, 17, 17, -2, 33]
    batch = ds.__getitems__(order)
    assert len(batch) == len(order)
    for got, i in zip(batch, order, strict=True):
        expected = ds[i]
        np.testing.assert_array_equal(got[0], expected[0])
        assert got[1] == expected[1] and type(got[1]) is int
    assert ds.__getitems__([]) == []
    with pytest.raises(
        DatasetIndexError,
        match=r"index 99 \(position 1 of the 2 requested\) is out of range for PackedDataset of "
        r"length 50",
    ):
        ds.__getitems__([1, 99])
    assert ds.__getitems__(np.array([3, 4]))[1][1] == 1


def test_a_transform_is_applied_and_turns_off_batch_fetching(packed) -> None:
    ds = PackedDataset(packed, transform=lambda record: (record[0].sum(), record[1]))
    assert ds.__getitems__ is None  # so the loader draws per-sample random numbers
    assert ds[2] == (float(image_records(3)[2][0].sum()), 2)
    with pytest.raises(TypeError, match="transform must be callable or None, got int"):
        PackedDataset(packed, transform=3)
    with pytest.raises(ValueError, match="verify must be False, 'open' or 'read', got 'always'"):
        PackedDataset(packed, verify="always")


# -- metadata ------------------------------------------------------------------------------------


def test_classes_metadata_keys_columns_and_descriptions(packed) -> None:
    ds = PackedDataset(packed)
    assert ds.classes == ["cat", "dog", "émeu"]
    assert ds.class_to_idx == {"cat": 0, "dog": 1, "émeu": 2}
    assert ds.metadata == {"split": "train"}
    labels = ds.column(1)
    np.testing.assert_array_equal(labels, np.arange(50) % 3)
    assert labels.dtype == np.int64 and not labels.flags.writeable
    with pytest.raises(ValueError, match="field 0 is array; only int and float fields are columns"):
        ds.column(0)
    with pytest.raises(KeyError, match=r"no such field; the records have fields \[0, 1\]"):
        ds.column("label")
    assert ds.key(10) == "class1/010.jpg"
    description = ds.describe_sample(10)
    shard = next(k for k, p in enumerate(ds.shard_paths) if description.startswith(p))
    local = 10 - sum(s["records"] for s in ds.manifest["shards"][:shard])
    assert description == f"{ds.shard_paths[shard]} record {local} (from class1/010.jpg)"
    assert "records=50" in repr(ds)


# -- pickling and forking -----------------------------------------------------------------------


def test_pickling_sends_the_path_only_and_reopens_lazily(packed) -> None:
    ds = PackedDataset(packed, verify="read")
    small = pickle.dumps(ds)
    assert len(small) < 1000  # no index, no mapping: 50 or 50 million records alike
    clone = pickle.loads(small)
    assert clone._opened is None  # nothing opened until first use
    np.testing.assert_array_equal(clone[21][0], ds[21][0])
    assert clone.verify == "read" and clone.classes == ds.classes


def test_a_pickled_dataset_refuses_a_directory_rewritten_since(packed) -> None:
    sent = pickle.dumps(PackedDataset(packed))
    with PackedWriter(packed, overwrite=True) as writer:
        writer.add((np.zeros((3, 4, 5), np.float32), 0))
    clone = pickle.loads(sent)
    with pytest.raises(
        PackedFormatError, match="was rewritten after this PackedDataset was opened"
    ):
        len(clone)


def _read_in_child(ds, index, conn) -> None:
    image, label = ds[index]
    conn.send((float(image.sum()), label, ds._opened.pid == os.getpid(), os.getpid()))
    conn.close()


def test_a_forked_child_maps_the_shards_itself_and_reads_the_same_data(packed) -> None:
    ds = PackedDataset(packed)
    expected = ds[33]  # the parent has mapped a shard
    context = multiprocessing.get_context("fork")
    parent, child = context.Pipe()
    process = context.Process(target=_read_in_child, args=(ds, 33, child))
    process.start()
    total, label, remapped, pid = parent.recv()
    process.join(timeout=30)
    assert process.exitcode == 0
    assert pid != os.getpid() and remapped
    assert total == float(expected[0].sum()) and label == expected[1]
    assert ds._opened.pid == os.getpid()  # the parent's state is untouched


# -- loaders ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("worker_mode", "context"), [("process", None), ("process", "spawn"), ("thread", None)]
)
def test_loads_through_a_dataloader_with_two_workers(packed, worker_mode, context) -> None:
    ds = PackedDataset(packed, verify="read")
    sampler = BlockShuffleSampler(ds, block_size=8, window=2, generator=0)
    loader = DataLoader(
        ds,
        batch_size=8,
        sampler=sampler,
        num_workers=2,
        worker_mode=worker_mode,
        multiprocessing_context=context,
    )
    seen = []
    for images, labels in loader:
        assert images.shape[1:] == (3, 4, 5) and images.dtype == np.float32
        indices = images[:, 0, 0, 0].astype(int)
        np.testing.assert_array_equal(labels, indices % 3)
        seen.extend(indices.tolist())
    assert sorted(seen) == list(range(50))
    assert seen != list(range(50))  # shuffled


def test_a_corrupt_record_is_skipped_and_reported_by_its_shard_file(packed) -> None:
    ds = PackedDataset(packed)
    victim = 12
    shard = next(
        k for k, p in enumerate(ds.shard_paths) if ds.describe_sample(victim).startswith(p)
    )
    local = victim - sum(s["records"] for s in ds.manifest["shards"][:shard])
    index = np.load(os.path.join(packed, ds.manifest["shards"][shard]["index"]))
    with open(ds.shard_paths[shard], "r+b") as f:
        f.seek(128 + int(index["offset"][local]))
        f.write(b"\xff\xff")
    loader = DataLoader(
        PackedDataset(packed, verify="read"), batch_size=10, on_error="skip", max_errors=1
    )
    labels = np.concatenate([batch[1] for batch in loader])
    assert len(labels) == 49
    (skipped,) = loader.error_report()
    assert skipped.index == victim and skipped.error_type == "PackedFormatError"
    assert (
        skipped.source == ds.describe_sample(victim) and "(from class0/012.jpg)" in skipped.source
    )
    assert "fails its checksum" in skipped.message


def test_a_shard_replaced_after_opening_is_reported_when_mapped(packed) -> None:
    ds = PackedDataset(packed)
    last = len(ds) - 1
    with open(ds.shard_paths[-1], "r+b") as f:
        f.write(b"not a npy header")
    with pytest.raises(
        PackedFormatError, match=r"cannot memory-map shard .*changed since the dataset was opened"
    ):
        ds[last]


def test_torch_dataloader_reads_it_like_stokers(packed) -> None:
    torch = pytest.importorskip("torch", reason="the oracle is torch.utils.data.DataLoader")
    # copy=True: torch warns when it wraps read-only numpy arrays (the default views)
    reference = torch.utils.data.DataLoader(
        PackedDataset(packed, copy=True), batch_size=8, num_workers=2
    )
    ours = DataLoader(PackedDataset(packed), batch_size=8, num_workers=2)
    for (t_images, t_labels), (s_images, s_labels) in zip(reference, ours, strict=True):
        np.testing.assert_array_equal(t_images.numpy(), s_images)
        np.testing.assert_array_equal(t_labels.numpy(), s_labels)
