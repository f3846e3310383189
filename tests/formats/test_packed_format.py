"""The packed format: round trips, shards, the atomic finish, and damaged datasets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker import DatasetError
from stoker.formats.packed import FORMAT_VERSION, PackedDataset, PackedFormatError, PackedWriter


def write(path, records, keys=None, **kwargs) -> str:
    with PackedWriter(path, **kwargs) as writer:
        for i, record in enumerate(records):
            writer.add(record, key=None if keys is None else keys[i])
    return str(path)


def assert_same(got, expected) -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict) and list(got) == list(expected)
        for key in expected:
            assert_same(got[key], expected[key])
    elif isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert_same(a, b)
    elif isinstance(expected, np.ndarray):
        assert isinstance(got, np.ndarray)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)
    elif isinstance(expected, (bytes, bytearray)):
        assert isinstance(got, memoryview) and got.readonly
        assert bytes(got) == bytes(expected)
    else:
        assert type(got) is type(expected) and got == expected


# -- round trips ---------------------------------------------------------------------------


def test_round_trip_of_bytes_records(tmp_path) -> None:
    records = [b"", b"a", bytes(range(256)) * 3, bytearray(b"mutable"), memoryview(b"view")]
    ds = PackedDataset(write(tmp_path / "d", records))
    assert len(ds) == len(records)
    for i, record in enumerate(records):
        assert_same(ds[i], bytes(record))


@pytest.mark.parametrize(
    "dtype",
    [
        "uint8",
        "int16",
        ">i4",
        "int64",
        "float16",
        "float32",
        ">f8",
        "complex64",
        "bool",
        "<U3",
        "S2",
    ],
)
def test_round_trip_of_arrays_of_many_dtypes_and_shapes(tmp_path, dtype) -> None:
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (0, 4), (1, 1), (5, 2)]
    records = []
    for shape in shapes:
        values = rng.integers(0, 100, size=shape)
        array = (
            values.astype(np.dtype(dtype))
            if np.dtype(dtype).kind not in "US"
            else values.astype(str).astype(dtype)
        )
        records.append(array)
    records.append(np.asfortranarray(rng.integers(0, 9, (4, 3))).astype(dtype))  # not C-contiguous
    records.append(rng.integers(0, 9, (6, 8)).astype(dtype)[::2, ::3])  # a strided view
    ds = PackedDataset(write(tmp_path / "d", records))
    for i, record in enumerate(records):
        got = ds[i]
        assert got.dtype == np.dtype(dtype)
        assert got.flags.aligned
        assert_same(got, np.ascontiguousarray(record))


def test_round_trip_of_tuple_and_dict_records_with_scalars(tmp_path) -> None:
    rng = np.random.default_rng(1)
    tuples = [
        (
            rng.bytes(int(n)),
            rng.standard_normal((int(n) % 4, 3)).astype(np.float32),
            int(n) - 50,
            float(n) / 3,
            f"é{n}猫",
        )
        for n in rng.integers(0, 100, 20)
    ]
    ds = PackedDataset(write(tmp_path / "t", tuples))
    for i, record in enumerate(tuples):
        assert_same(ds[i], record)
    dicts = [
        {"label": i, "x": np.full((2, i + 1), i, dtype=np.int8), "name": str(i), "w": 0.5 * i}
        for i in range(7)
    ]
    ds = PackedDataset(write(tmp_path / "d", dicts))
    for i, record in enumerate(dicts):
        assert_same(ds[i], record)


def test_numpy_scalars_bools_and_extreme_ints_are_stored_as_python_numbers(tmp_path) -> None:
    records = [
        (np.int32(7), np.float32(0.5), True),
        (2**63 - 1, -1.5e300, False),
        (-(2**63), float("inf"), np.bool_(True)),
    ]
    ds = PackedDataset(write(tmp_path / "d", records))
    assert ds[0] == (7, 0.5, 1)
    assert ds[1] == (2**63 - 1, -1.5e300, 0)
    assert ds[2] == (-(2**63), float("inf"), 1)
    assert all(type(v) in (int, float) for v in ds[0])


def test_an_int_beyond_int64_is_refused(tmp_path) -> None:
    with (
        PackedWriter(tmp_path / "d") as writer,
        pytest.raises(OverflowError, match="does not fit in int64"),
    ):
        writer.add((1, 2**63))


def test_a_shard_whose_records_are_all_empty_has_an_empty_payload(tmp_path) -> None:
    ds = PackedDataset(write(tmp_path / "d", [b"", b""]))  # nothing to memory-map
    assert ds.manifest["shards"][0]["data_bytes"] == 0
    for i in range(2):
        assert_same(ds[i], b"")


def test_an_empty_dataset_round_trips(tmp_path) -> None:
    ds = PackedDataset(write(tmp_path / "d", []))
    assert len(ds) == 0 and ds.shard_paths == ()
    with pytest.raises(IndexError, match="out of range for PackedDataset of length 0; it is empty"):
        ds[0]


record_values = st.one_of(
    st.binary(max_size=300),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)


@settings(max_examples=25, deadline=None)
@given(
    layout=st.lists(
        st.sampled_from(["bytes", "int", "float", "str", "f4", "i2", "u1"]), min_size=1, max_size=4
    ),
    n=st.integers(0, 12),
    limit=st.integers(1, 400),
    data=st.data(),
)
def test_property_any_records_round_trip_through_any_shard_limit(layout, n, limit, data) -> None:
    def value(kind):
        if kind == "bytes":
            return data.draw(st.binary(max_size=200))
        if kind == "int":
            return data.draw(st.integers(min_value=-(2**63), max_value=2**63 - 1))
        if kind == "float":
            return data.draw(st.floats(allow_nan=False))
        if kind == "str":
            return data.draw(st.text(max_size=20))
        shape = data.draw(st.tuples(st.integers(0, 5), st.integers(0, 5)))
        return np.asarray(
            data.draw(
                st.lists(
                    st.integers(0, 100), min_size=shape[0] * shape[1], max_size=shape[0] * shape[1]
                )
            ),
            dtype=kind,
        ).reshape(shape)

    records = [tuple(value(kind) for kind in layout) for _ in range(n)]
    keys = [data.draw(st.one_of(st.none(), st.text(max_size=10))) for _ in range(n)]
    with tempfile.TemporaryDirectory() as folder:
        ds = PackedDataset(write(folder, records, keys, max_shard_bytes=limit), verify="open")
        assert len(ds) == n
        for i, record in enumerate(records):
            assert_same(ds[i], tuple(bytes(v) if isinstance(v, bytes) else v for v in record))
            assert ds.key(i) == (keys[i] or None)
        if n:
            for got, record in zip(
                ds.__getitems__(list(range(n))[::-1]), records[::-1], strict=True
            ):
                assert_same(got, record)


# -- the schema ------------------------------------------------------------------------------


def test_records_must_keep_the_first_records_fields(tmp_path) -> None:
    writer = PackedWriter(tmp_path / "d")
    writer.add((b"x", np.zeros(3, np.float32), 1))
    with pytest.raises(
        ValueError, match=r"record 1 does not match the dataset's schema \(0: bytes, 1: array"
    ):
        writer.add((b"x", np.zeros(3, np.float32)))
    with pytest.raises(
        TypeError,
        match=r"record 1: field 1 must be array\(dtype=<f4, ndim=1\) like in record 0, got "
        r"array\(dtype=<f8",
    ):
        writer.add((b"x", np.zeros(3), 1))
    with pytest.raises(
        TypeError, match=r"record 1: field 1 must be array\(dtype=<f4, ndim=1\).*ndim=2"
    ):
        writer.add((b"x", np.zeros((1, 3), np.float32), 1))
    with pytest.raises(
        TypeError, match="record 1: field 2 must be int like in record 0, got float"
    ):
        writer.add((b"x", np.zeros(3, np.float32), 1.5))
    writer.add((b"ok", np.zeros(5, np.float32), 2))  # the shape may change
    writer.close()
    assert len(PackedDataset(tmp_path / "d")) == 2


def test_unstorable_values_are_refused_with_the_field_named(tmp_path) -> None:
    writer = PackedWriter(tmp_path / "d")
    with pytest.raises(
        TypeError,
        match=r"field 'meta' is a list, which a packed record cannot hold; each field must be",
    ):
        writer.add({"x": b"", "meta": [1, 2]})
    with pytest.raises(TypeError, match="the record is a ndarray"):
        writer.add(np.array([object()]))
    with pytest.raises(TypeError, match="dict records need str keys"):
        writer.add({1: b""})
    with pytest.raises(TypeError, match="key must be a str or None, got int"):
        writer.add(b"", key=3)
    writer.abort()


def test_writer_arguments_are_checked(tmp_path) -> None:
    with pytest.raises(ValueError, match="max_shard_bytes must be a positive int"):
        PackedWriter(tmp_path / "a", max_shard_bytes=0)
    with pytest.raises(ValueError, match=r"distinct label 0\.\.n-1"):
        PackedWriter(tmp_path / "b", classes={"cat": 0, "dog": 2})
    with pytest.raises(ValueError, match=r"class names must be distinct, got duplicates \['cat'\]"):
        PackedWriter(tmp_path / "c", classes=["cat", "cat"])
    with pytest.raises(TypeError, match="metadata must be JSON-serialisable"):
        PackedWriter(tmp_path / "d", metadata={"x": object()})
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file"):
        PackedWriter(tmp_path / "file")


# -- shards ---------------------------------------------------------------------------------


def test_a_small_shard_limit_spreads_records_over_shards(tmp_path) -> None:
    records = [bytes([i]) * (10 + 7 * i) for i in range(30)]
    path = write(tmp_path / "d", records, max_shard_bytes=100)
    ds = PackedDataset(path)
    manifest = ds.manifest
    assert len(ds.shard_paths) == len(manifest["shards"]) > 5
    assert sum(s["records"] for s in manifest["shards"]) == 30
    for shard in manifest["shards"]:
        assert (
            shard["data_bytes"] <= 100 or shard["records"] == 1
        )  # a big record gets a shard of its own
        assert os.path.getsize(os.path.join(path, shard["data"])) == shard["data_file_bytes"]
    assert [bytes(ds[i]) for i in range(30)] == records
    big = [s for s in manifest["shards"] if s["data_bytes"] > 100]
    assert big and all(s["records"] == 1 for s in big)
    last = ds.describe_sample(29)
    assert last == f"{ds.shard_paths[-1]} record {manifest['shards'][-1]['records'] - 1}"


def test_every_file_is_plain_numpy_or_json_and_matches_the_spec(tmp_path) -> None:
    records = [(b"jpeg-bytes-%d" % i, np.arange(i + 1, dtype="<i4"), i) for i in range(5)]
    path = write(
        tmp_path / "d",
        records,
        keys=[f"k{i}" for i in range(5)],
        classes=["a", "b"],
        metadata={"m": 1},
    )
    with open(os.path.join(path, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["format"] == "stoker-packed" and manifest["version"] == FORMAT_VERSION == 2
    body = {key: value for key, value in manifest.items() if key != "manifest_crc32"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert manifest["manifest_crc32"] == zlib.crc32(canonical.encode("ascii"))
    assert list(manifest)[-1] == "manifest_crc32"
    assert manifest["classes"] == ["a", "b"] and manifest["metadata"] == {"m": 1}
    shard = manifest["shards"][0]
    data = np.load(os.path.join(path, shard["data"]), mmap_mode="r")  # a standard .npy
    index = np.load(os.path.join(path, shard["index"]))
    keys = np.load(os.path.join(path, shard["keys"]))
    assert data.dtype == np.uint8 and data.shape == (shard["data_bytes"],)
    for i, (raw, array, label) in enumerate(records):
        row = index[i]
        assert row["offset"] % 16 == 0
        record = data[row["offset"] : row["offset"] + row["length"]]
        assert record[row["start0"] : row["start0"] + row["nbytes0"]].tobytes() == raw
        assert row["start1"] % 16 == 0
        got = (
            record[row["start1"] : row["start1"] + row["nbytes1"]]
            .view("<i4")
            .reshape(row["shape1"])
        )
        np.testing.assert_array_equal(got, array)
        assert row["value2"] == label
        assert (
            keys[row["key_offset"] : row["key_offset"] + row["key_length"]].tobytes()
            == f"k{i}".encode()
        )
        assert zlib.crc32(record) == row["crc32"]


# -- the atomic finish ----------------------------------------------------------------------------


def test_an_unfinished_write_is_refused_with_a_clear_message(tmp_path) -> None:
    writer = PackedWriter(tmp_path / "d", max_shard_bytes=64)
    for _ in range(20):
        writer.add(b"x" * 30)
    names = os.listdir(tmp_path / "d")
    assert names and all(
        name.endswith(".partial") for name in names
    )  # nothing has a final name yet
    with pytest.raises(
        PackedFormatError,
        match=r"has no manifest.json: the write did not finish \(it crashed or was aborted; \d+ "
        r"partial file",
    ):
        PackedDataset(tmp_path / "d")
    writer.close()
    assert len(PackedDataset(tmp_path / "d")) == 20
    assert not [n for n in os.listdir(tmp_path / "d") if n.endswith(".partial")]


def test_a_process_killed_mid_write_leaves_nothing_that_looks_complete(tmp_path) -> None:
    script = textwrap.dedent(
        f"""
        import os
        from stoker.formats.packed import PackedWriter
        w = PackedWriter({str(tmp_path / "d")!r}, max_shard_bytes=1000)
        for i in range(100):
            w.add(b"y" * 100)
        os._exit(3)  # dies without closing: no finally, no atexit
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3, result.stderr
    assert "manifest.json" not in os.listdir(tmp_path / "d")
    with pytest.raises(PackedFormatError, match="the write did not finish"):
        PackedDataset(tmp_path / "d")


def test_an_exception_inside_the_with_block_aborts_and_removes_partial_files(tmp_path) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        PackedWriter(tmp_path / "d", max_shard_bytes=10) as writer,
    ):
        for _ in range(5):
            writer.add(b"z" * 8)
        raise RuntimeError("boom")
    assert os.listdir(tmp_path / "d") == []
    with pytest.raises(
        PackedFormatError, match=r"no manifest\.json: it is not a finished packed dataset"
    ):
        PackedDataset(tmp_path / "d")
    with pytest.raises(ValueError, match="was aborted"):
        writer.close()


def test_the_manifest_is_written_last(tmp_path, monkeypatch) -> None:
    real_replace = os.replace
    renamed = []

    def replace(src, dst):
        renamed.append(os.path.basename(dst))
        if os.path.basename(dst) == "manifest.json":
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    writer = PackedWriter(tmp_path / "d", max_shard_bytes=10)
    for _ in range(3):
        writer.add(b"q" * 8)
    with pytest.raises(OSError, match="disk full"):
        writer.close()
    assert renamed[-1] == "manifest.json" and len(renamed) == 3 * 3 + 1
    assert os.listdir(tmp_path / "d") == []  # the failed finish removed the shards again
    monkeypatch.undo()
    with pytest.raises(PackedFormatError, match=r"no manifest\.json"):
        PackedDataset(tmp_path / "d")


def test_a_non_empty_directory_needs_overwrite_which_replaces_the_old_dataset(tmp_path) -> None:
    path = write(tmp_path / "d", [b"old"] * 10, max_shard_bytes=3)
    (tmp_path / "d" / "notes.txt").write_text("mine")
    with pytest.raises(
        FileExistsError,
        match=r"is not empty: it holds a packed dataset\. Choose an empty directory, or pass "
        r"overwrite=True",
    ):
        PackedWriter(path)
    write(path, [b"new"], overwrite=True)
    ds = PackedDataset(path)
    assert [bytes(ds[i]) for i in range(len(ds))] == [b"new"]
    assert sorted(os.listdir(path)) == sorted(
        [
            "manifest.json",
            "notes.txt",
            "shard-00000.npy",
            "shard-00000.index.npy",
            "shard-00000.keys.npy",
        ]
    )


# -- damaged datasets --------------------------------------------------------------------------


def damaged(tmp_path, n=40):
    records = [(bytes([i % 256]) * (50 + i), i) for i in range(n)]
    path = write(tmp_path / "d", records, max_shard_bytes=1000)
    return path, PackedDataset(path).manifest


def test_a_truncated_shard_fails_at_open_naming_the_file_and_the_record(tmp_path) -> None:
    path, manifest = damaged(tmp_path)
    shard = manifest["shards"][1]
    first = manifest["shards"][0]["records"]
    data = os.path.join(path, shard["data"])
    index = np.load(os.path.join(path, shard["index"]))
    cut = 3  # keep records 0..2 of the shard whole, cut record 3 in the middle
    os.truncate(data, 128 + int(index["offset"][cut]) + 5)
    with pytest.raises(PackedFormatError, match="is truncated") as info:
        PackedDataset(path)
    message = str(info.value)
    assert shard["data"] in message
    assert f"Record {cut} of this shard (dataset index {first + cut})" in message
    assert f"the {shard['records'] - cut - 1} after it are cut off" in message


def test_a_flipped_byte_fails_the_checksum_naming_the_file_and_the_record(tmp_path) -> None:
    path, manifest = damaged(tmp_path)
    shard = manifest["shards"][2]
    first = sum(s["records"] for s in manifest["shards"][:2])
    index = np.load(os.path.join(path, shard["index"]))
    victim = 4
    with open(os.path.join(path, shard["data"]), "r+b") as f:
        f.seek(128 + int(index["offset"][victim]) + 10)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    expected = (
        rf"{shard['data']}: record {victim} of this shard \(dataset index "
        rf"{first + victim}\) fails its checksum"
    )
    # verify="read": only the damaged record fails, when it is read
    ds = PackedDataset(path, verify="read")
    assert ds[first + victim - 1][1] == first + victim - 1
    with pytest.raises(PackedFormatError, match=expected):
        ds[first + victim]
    with pytest.raises(PackedFormatError, match=expected):
        ds.__getitems__([0, first + victim])
    # verify="open" (or verify_all()): the whole dataset is checked once, at open
    with pytest.raises(PackedFormatError, match=expected):
        PackedDataset(path, verify="open")
    with pytest.raises(PackedFormatError, match=expected):
        PackedDataset(path).verify_all()
    # verify=False trusts the data (documented): the flipped byte comes back as is
    i = first + victim
    original = bytes([i % 256]) * (50 + i)
    got = bytes(PackedDataset(path)[i][0])
    assert got != original and got[:10] == original[:10] and got[10] == original[10] ^ 0x01


def test_a_damaged_index_or_a_missing_shard_is_reported(tmp_path) -> None:
    path, manifest = damaged(tmp_path)
    index = os.path.join(path, manifest["shards"][0]["index"])
    with open(index, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 0xFF]))
    with pytest.raises(
        PackedFormatError,
        match=r"index file .*shard-00000.index.npy' fails its checksum .*it is damaged",
    ):
        PackedDataset(path)
    os.remove(os.path.join(path, manifest["shards"][0]["index"]))
    with pytest.raises(PackedFormatError, match=r"index file .*shard-00000.index.npy' is missing"):
        PackedDataset(path)
    path2, manifest2 = damaged(tmp_path / "two")
    os.remove(os.path.join(path2, manifest2["shards"][1]["data"]))
    with pytest.raises(PackedFormatError, match=r"shard data file .*shard-00001.npy' is missing"):
        PackedDataset(path2)


def test_a_grown_shard_a_bad_manifest_and_a_newer_version_are_reported(tmp_path) -> None:
    path, manifest = damaged(tmp_path)
    with open(os.path.join(path, manifest["shards"][0]["data"]), "ab") as f:
        f.write(b"extra")
    with pytest.raises(
        PackedFormatError, match=r"shard-00000\.npy' is \d+ bytes but the manifest says .*modified"
    ):
        PackedDataset(path)
    manifest_path = os.path.join(path, "manifest.json")
    with open(manifest_path, "w") as f:
        json.dump({**manifest, "version": FORMAT_VERSION + 1}, f)
    with pytest.raises(
        PackedFormatError,
        match=f"is format version {FORMAT_VERSION + 1}, but this stoker reads versions up to "
        f"{FORMAT_VERSION}; upgrade stoker",
    ):
        PackedDataset(path)
    with open(manifest_path, "w") as f:
        f.write('{"format": "stoker-packed", "vers')
    with pytest.raises(PackedFormatError, match=r"manifest\.json is not valid JSON"):
        PackedDataset(path)
    with pytest.raises(FileNotFoundError, match="does not exist; pass the directory"):
        PackedDataset(tmp_path / "missing")
    assert issubclass(PackedFormatError, DatasetError)


def test_numpy_integers_size_shards(tmp_path) -> None:
    writer = PackedWriter(tmp_path / "n", max_shard_bytes=np.int64(4096))
    assert writer.max_shard_bytes == 4096 and type(writer.max_shard_bytes) is int
    writer.close()
