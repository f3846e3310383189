"""What declares ``thread_safe = True`` is safe: eight threads at once give the batches of one.

stoker's own datasets and transforms declare themselves thread-safe, so that
``worker_mode="auto"`` may run them in threads. Here each is loaded by eight thread workers
fetching at the same time (batches of two, so the threads interleave inside every batch)
and must give, bit for bit, the batches of ``num_workers=0``: random crops and flips
included. A dataset with a shared file handle is the counter-example the loader warns about.
"""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest

from stoker import ArrayDataset, ConcatDataset, DataLoader, Subset
from stoker._thread_safety import is_thread_safe, shared_handles

THREADS = 8


def batches(dataset, num_workers: int, **options) -> list[list[np.ndarray]]:
    mode = "thread" if num_workers else "auto"
    with DataLoader(
        dataset, batch_size=2, shuffle=True, generator=11, num_workers=num_workers,
        worker_mode=mode, persistent_workers=num_workers > 0, **options,
    ) as loader:  # fmt: skip
        return [[np.asarray(part) for part in batch] for epoch in range(2) for batch in loader]


def assert_same(expected: list, got: list) -> None:
    assert len(expected) == len(got)
    for a, b in zip(expected, got, strict=True):
        for part_a, part_b in zip(a, b, strict=True):
            np.testing.assert_array_equal(part_a, part_b)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> tuple[str, str]:
    """A folder of 16 JPEGs in two classes, and a packed copy of (bytes, label) records."""
    pytest.importorskip("PIL", reason="writing and decoding JPEGs needs Pillow")
    from PIL import Image

    from stoker.formats.packed import PackedWriter

    root = tmp_path_factory.mktemp("threads") / "images"
    packed = root.parent / "packed"
    rng = np.random.default_rng(5)
    with PackedWriter(packed, classes=["a", "b"]) as writer:
        for i in range(16):
            buffer = io.BytesIO()
            pixels = rng.integers(0, 256, (72 + 4 * (i % 3), 96, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
            target = root / "ab"[i % 2] / f"{i:02d}.jpg"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(buffer.getvalue())
            writer.add((buffer.getvalue(), i % 2))
    return str(root), str(packed)


def test_image_folder_and_its_random_transforms_under_eight_threads(images) -> None:
    from stoker.formats.image_folder import ImageFolder
    from stoker.vision import train_transform

    dataset = ImageFolder(images[0], transform=train_transform(48))
    assert is_thread_safe(dataset)
    assert_same(batches(dataset, 0), batches(dataset, THREADS))


def test_packed_records_decoded_under_eight_threads(images) -> None:
    from stoker.formats.packed import PackedDataset
    from stoker.vision import DecodeImage, train_transform

    dataset = PackedDataset(images[1], transform=DecodeImage(train_transform(48)))
    assert is_thread_safe(dataset)
    assert_same(batches(dataset, 0), batches(dataset, THREADS))
    plain = PackedDataset(images[1])  # views of the maps, fetched in batches
    assert is_thread_safe(plain)

    def as_arrays(records: list) -> list[np.ndarray]:
        return [np.frombuffer(bytes(data) + bytes([label]), np.uint8) for data, label in records]

    assert_same(
        batches(plain, 0, collate_fn=as_arrays), batches(plain, THREADS, collate_fn=as_arrays)
    )


def test_array_concat_and_subset_under_eight_threads() -> None:
    rng = np.random.default_rng(2)
    arrays = ArrayDataset(rng.standard_normal((40, 3)), np.arange(40))
    dataset = Subset(
        ConcatDataset([arrays, ArrayDataset(np.ones((9, 3)), np.arange(9))]), [*range(49)][::-1]
    )
    assert is_thread_safe(dataset)
    assert_same(batches(dataset, 0), batches(dataset, THREADS))


class SharedHandle:
    """Reads fixed-size records through one open file: seek, then read (not thread-safe)."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "rb")  # noqa: SIM115  (the handle is the point of the test)

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> bytes:
        self.file.seek(i * 8)
        return self.file.read(8)


def test_a_shared_file_handle_is_found_and_auto_keeps_processes(tmp_path) -> None:
    path = tmp_path / "records.bin"
    path.write_bytes(bytes(range(256)) * 2)
    dataset = SharedHandle(str(path))
    try:
        assert not is_thread_safe(dataset)
        assert shared_handles(dataset) == ["dataset.file (BufferedReader)"]
        loader = DataLoader(dataset, batch_size=4, num_workers=2, worker_mode="auto")
        assert [bytes(b) for batch in loader for b in batch] == [dataset[i] for i in range(64)]
        assert loader.stats().autotune == [
            "worker_mode auto: processes, since SharedHandle does not declare thread_safe = True"
        ]
    finally:
        dataset.file.close()


@pytest.mark.parametrize(
    "loading",
    [
        {"num_workers": 0},
        {"num_workers": 2, "worker_mode": "process"},
        {"num_workers": 2, "worker_mode": "thread"},
    ],
    ids=["main", "process", "thread"],
)
def test_one_iterator_consumed_by_two_threads_hands_out_each_batch_once(loading) -> None:
    """Two threads calling next() on one iterator take turns: the epoch starts once and every
    batch reaches exactly one of them."""
    loader = DataLoader(ArrayDataset(np.arange(64)), batch_size=4, **loading)
    iterator = iter(loader)
    got: list[list[int]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def consume(k: int) -> None:
        start.wait()
        try:
            for (batch,) in iterator:
                got[k].extend(batch.tolist())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sorted(got[0] + got[1]) == list(range(64))
