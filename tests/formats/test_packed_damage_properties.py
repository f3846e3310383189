"""Every file of a small packed dataset, one flipped bit or one truncation at a time.

With ``verify="open"`` or ``verify="read"`` no single flipped bit anywhere in the dataset's
files can make a read return other data than was written: each read returns the original
record or raises PackedFormatError. Without verification the same holds for every file but
the payload, where a flipped bit changes at most the record that holds it. A truncated file,
whichever and wherever, is refused at open.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from formats.damage import bits_to_try, flipped, truncated
from stoker.formats.packed import PackedDataset, PackedFormatError, PackedWriter

RECORDS = [
    {
        "jpeg": b"\xff\xd8" + bytes([i]) * (5 + 3 * i),
        "name": f"é{i}",
        "x": np.arange(i + 1, dtype="<f4"),
        "y": i,
        "w": i / 2,
    }
    for i in range(4)
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("packed") / "d")
    with PackedWriter(
        path, max_shard_bytes=80, classes=["a", "b"], metadata={"note": "x"}
    ) as writer:
        for i, record in enumerate(RECORDS):
            writer.add(record, key=f"src/{i}.jpg")
    assert len(PackedDataset(path).shard_paths) == 2
    return path


def same(got: dict, expected: dict) -> bool:
    if list(got) != list(expected):
        return False
    for key, value in expected.items():
        if isinstance(value, np.ndarray):
            if not (
                got[key].dtype == value.dtype
                and got[key].shape == value.shape
                and (got[key] == value).all()
            ):
                return False
        elif isinstance(value, bytes):
            if bytes(got[key]) != value:
                return False
        elif got[key] != value or type(got[key]) is not type(value):
            return False
    return True


def files(path: str) -> list[str]:
    return sorted(os.path.join(path, name) for name in os.listdir(path))


def read_each(path: str, verify) -> list[object]:
    """Each record, or the PackedFormatError its read raised (None if opening raised)."""
    try:
        ds = PackedDataset(path, verify=verify)
    except PackedFormatError:
        return [None]
    out: list[object] = []
    for i in range(len(RECORDS)):
        try:
            out.append(ds[i])
        except PackedFormatError as exc:
            out.append(exc)
    try:
        out.append(ds.__getitems__(list(range(len(RECORDS)))))
    except PackedFormatError as exc:
        out.append(exc)
    return out


def payload_extents(path: str, file: str) -> list[tuple[int, int, int]]:
    """``(first byte, end, dataset index)`` in the file of each record of a data file."""
    ds = PackedDataset(path)
    if file not in ds.shard_paths:
        return []
    shard = list(ds.shard_paths).index(file)
    first = sum(s["records"] for s in ds.manifest["shards"][:shard])
    columns = ds._open().columns
    out = []
    for i in range(first, first + ds.manifest["shards"][shard]["records"]):
        offset, length = int(columns["offset"][i]), int(columns["length"][i])
        out.append((128 + offset, 128 + offset + length, i))
    return out


@pytest.mark.parametrize("verify", ["open", "read", False])
def test_property_no_flipped_bit_returns_other_data_than_was_written(dataset, verify) -> None:
    most = 1200 if verify == "open" else 500
    for file in files(dataset):
        extents = payload_extents(dataset, file) if verify is False else []
        for bit in bits_to_try(os.path.getsize(file) * 8, most, seed=len(file)):
            allowed = next((i for lo, hi, i in extents if lo <= bit // 8 < hi), None)
            with flipped(file, bit):
                results = read_each(dataset, verify)
            if results == [None]:
                continue  # refused at open
            *singles, batch = results
            for i, got in enumerate(singles):
                assert (
                    isinstance(got, PackedFormatError) or same(got, RECORDS[i]) or i == allowed
                ), f"{os.path.basename(file)} bit {bit}: record {i} came back different"
            if not isinstance(batch, PackedFormatError):
                assert all(
                    same(g, r) or i == allowed
                    for i, (g, r) in enumerate(zip(batch, RECORDS, strict=True))
                )


def test_property_a_file_truncated_anywhere_is_refused_at_open(dataset) -> None:
    for file in files(dataset):
        size = os.path.getsize(file)
        for cut in range(size):
            with truncated(file, cut):
                try:
                    ds = PackedDataset(dataset)
                except PackedFormatError as exc:
                    assert os.path.basename(file) in str(exc), (file, cut)
                    continue
                # only the manifest's final newline can go: the JSON is whole without it
                assert file.endswith("manifest.json") and cut == size - 1
                assert all(same(ds[i], record) for i, record in enumerate(RECORDS))
