"""Damaged or hostile packed manifests and indexes: refused, naming the file and the fault."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest

from stoker.formats.packed import PackedDataset, PackedFormatError, PackedWriter

REWRITE = "write the dataset again (stoker pack / PackedWriter)"
DAMAGED = f"the manifest is damaged or was not written by stoker; {REWRITE}"


def write(path, records, **kwargs) -> str:
    with PackedWriter(path, **kwargs) as writer:
        for i, record in enumerate(records):
            writer.add(record, key=f"source-{i}")
    return str(path)


def int64_records(n: int = 6) -> list[dict]:
    return [{"values": np.arange(i, i + 3, dtype="<i8") * 1000, "label": i} for i in range(n)]


def manifest_path(path: str) -> str:
    return os.path.join(path, "manifest.json")


def load_manifest(path: str) -> dict:
    with open(manifest_path(path)) as f:
        return json.load(f)


def sign(manifest: dict) -> dict:
    """The checksum the format specifies (docs/packed-format.md), computed here independently."""
    body = {key: value for key, value in manifest.items() if key != "manifest_crc32"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return {**body, "manifest_crc32": zlib.crc32(text.encode("ascii"))}


def rewrite_manifest(path: str, change, version: int = 2) -> None:
    """Changes the manifest with ``change(manifest)`` and stores it as a valid ``version``."""
    manifest = load_manifest(path)
    change(manifest)
    manifest["version"] = version
    if version == 2:
        manifest = sign(manifest)
    else:
        manifest.pop("manifest_crc32", None)
    with open(manifest_path(path), "w") as f:
        json.dump(manifest, f, indent=1)


def flip_text(path: str, old: bytes, new: bytes) -> None:
    """Replaces the only occurrence of ``old`` in the file by ``new`` (one flipped bit)."""
    with open(path, "rb") as f:
        raw = f.read()
    assert raw.count(old) == 1 and len(old) == len(new)
    assert (
        bin(int.from_bytes(bytes(a ^ b for a, b in zip(old, new, strict=True)), "big")).count("1")
        == 1
    )
    with open(path, "wb") as f:
        f.write(raw.replace(old, new))


# -- item: one flipped bit in the manifest ---------------------------------------------------------


@pytest.mark.parametrize("verify", [False, "open"])
def test_a_flipped_bit_that_byte_swaps_an_array_dtype_fails_the_manifest_checksum(
    tmp_path, verify
) -> None:
    path = write(tmp_path / "d", int64_records())
    flip_text(manifest_path(path), b'"dtype": "<i8"', b'"dtype": ">i8"')
    with pytest.raises(PackedFormatError) as caught:
        PackedDataset(path, verify=verify)[1]["values"]
    text = str(caught.value)
    assert text.startswith(f"{manifest_path(path)} fails its checksum (manifest_crc32 0x")
    assert text.endswith(f"): the manifest is damaged; {REWRITE}")


def test_a_flipped_bit_that_drops_an_array_dtype_is_caught(tmp_path) -> None:
    path = write(tmp_path / "d", int64_records())
    flip_text(manifest_path(path), b'"dtype": "<i8"', b'"dtypE": "<i8"')
    with pytest.raises(PackedFormatError, match="fails its checksum"):
        PackedDataset(path, verify="open")
    rewrite_manifest(path, lambda m: None, version=1)  # a version 1 manifest has no checksum
    with pytest.raises(PackedFormatError) as caught:
        PackedDataset(path, verify="open")
    assert str(caught.value) == (
        f"{manifest_path(path)}: schema['fields'][0]['dtype'] must be a numpy dtype string such as "
        f"'<f4' or '|u1', got None: {DAMAGED}"
    )


@pytest.mark.parametrize("version", [1, 2])
def test_a_rewritten_index_whose_crc_matches_cannot_point_a_field_into_another_record(
    tmp_path, version
) -> None:
    records = [(bytes([65 + i]) * 40, i) for i in range(4)]
    path = write(tmp_path / "d", records)
    index_path = os.path.join(path, "shard-00000.index.npy")
    index = np.load(index_path)
    index["start0"][1] = index["offset"][2] - index["offset"][1]  # record 1's bytes: record 2's
    index["nbytes0"][1] = 40
    buffer = io.BytesIO()
    np.save(buffer, index)
    raw = buffer.getvalue()
    with open(index_path, "wb") as f:
        f.write(raw)

    def resign(manifest: dict) -> None:
        manifest["shards"][0]["index_crc32"] = zlib.crc32(raw)
        manifest["shards"][0]["index_file_bytes"] = len(raw)

    rewrite_manifest(path, resign, version)
    with pytest.raises(PackedFormatError) as caught:
        PackedDataset(path, verify="open")
    assert str(caught.value) == (
        f"the index of {os.path.join(path, 'shard-00000.npy')!r} is damaged: record 1 of this "
        "shard (dataset index 1) has field 0 outside the record (start, nbytes, length) (48, "
        f"40, 40); {REWRITE}"
    )


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("shape", [-1, 3], "has array field 'values' with a negative dimension (shape) ([-1, 3])"),
        (
            "shape",
            [2, 3],
            "has array field 'values' whose shape times the item size (8) is not its byte count "
            "(shape, nbytes) ([2, 3], 24)",
        ),
        ("offset", 8, "does not start on a multiple of 16 (offset) (8)"),
        (
            "length",
            10**6,
            "does not lie inside the shard's 184-byte payload (offset, length) (0, 1000000)",
        ),
        (
            "key_length",
            10**6,
            "has a key outside the 48-byte keys file (key_offset, key_length) (0, 1000000)",
        ),
    ],
)
@pytest.mark.parametrize("version", [1, 2])
def test_every_index_extent_is_checked_at_open(tmp_path, field, value, problem, version) -> None:
    path = write(
        tmp_path / "d", [{"values": np.zeros((1, 3), "<i8") + i, "label": i} for i in range(6)]
    )
    index_path = os.path.join(path, "shard-00000.index.npy")
    index = np.load(index_path)
    index[{"shape": "shape0", "offset": "offset"}.get(field, field)][0] = value
    buffer = io.BytesIO()
    np.save(buffer, index)
    raw = buffer.getvalue()
    with open(index_path, "wb") as f:
        f.write(raw)
    rewrite_manifest(path, lambda m: m["shards"][0].update(index_crc32=zlib.crc32(raw)), version)
    with pytest.raises(PackedFormatError) as caught:
        PackedDataset(path)
    data_path = os.path.join(path, "shard-00000.npy")
    assert str(caught.value) == (
        f"the index of {data_path!r} is damaged: record 0 of this shard (dataset index 0) "
        f"{problem}; {REWRITE}"
    )


# -- item: file names, regular files, sizes -------------------------------------------------------


def test_a_shard_named_outside_the_dataset_is_refused(tmp_path) -> None:
    path = write(tmp_path / "d", [b"inside"] * 3)
    other = write(tmp_path / "other", [b"OUTSIDE"] * 3)
    shutil.copy(os.path.join(other, "shard-00000.npy"), tmp_path / "outside.npy")
    shutil.copy(os.path.join(other, "shard-00000.index.npy"), tmp_path / "outside.index.npy")
    outside = load_manifest(other)["shards"][0]

    def point_outside(manifest: dict) -> None:
        shard = manifest["shards"][0]
        shard.update(
            {
                k: outside[k]
                for k in ("data_bytes", "data_file_bytes", "index_file_bytes", "index_crc32")
            }
        )
        shard["data"], shard["index"] = "../outside.npy", "../outside.index.npy"

    for version in (2, 1):
        rewrite_manifest(path, point_outside, version)
        with pytest.raises(PackedFormatError) as caught:
            PackedDataset(path)
        assert str(caught.value) == (
            f"{manifest_path(path)}: shards[0]['data'] must be 'shard-00000.npy' (the name the "
            f"writer gives shard 0), got '../outside.npy': {DAMAGED}"
        )


@pytest.mark.parametrize("target", ["/dev/zero", "absolute"])
def test_an_index_that_is_a_device_or_an_absolute_path_is_refused_before_reading(
    tmp_path, target
) -> None:
    path = write(tmp_path / "d", [b"x"] * 3)
    rewrite_manifest(path, lambda m: None, version=1)
    index_path = os.path.join(path, "shard-00000.index.npy")
    if target == "/dev/zero":
        os.remove(index_path)
        os.symlink("/dev/zero", index_path)  # the right name, but a device behind it
        expected = (
            f"index file {index_path!r} is not a regular file (it is a device, a FIFO or "
            f"a folder); {REWRITE}"
        )
    else:
        rewrite_manifest(path, lambda m: m["shards"][0].update(index=index_path), version=1)
        expected = (
            f"{manifest_path(path)}: shards[0]['index'] must be 'shard-00000.index.npy' (the "
            f"name the writer gives shard 0), got {index_path!r}: {DAMAGED}"
        )
    script = textwrap.dedent(
        f"""
        import resource
        # reading /dev/zero would never end
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from stoker.formats.packed import PackedDataset
        try:
            PackedDataset({path!r})
        except Exception as exc:
            print(type(exc).__name__ + ": " + str(exc))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == f"PackedFormatError: {expected}", result.stderr[-2000:]


# -- item: structurally wrong manifests and damaged .npy headers ----------------------------------


@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda m: m["shards"][0].pop("records"),
            "shards[0]['records'] must be a non-negative integer, got None",
        ),
        (
            lambda m: m["shards"][0].update(records="3"),
            "shards[0]['records'] must be a non-negative integer, got '3'",
        ),
        (
            lambda m: m.update(shards={"0": 1}),
            "the manifest['shards'] must be a list, got {'0': 1}",
        ),
        (
            lambda m: m["schema"]["fields"][1].update(kind="blob"),
            "schema['fields'][1]['kind'] must be one of ('bytes', 'str', 'array', 'int', "
            "'float'), got 'blob'",
        ),
        (
            lambda m: m["schema"]["fields"][0].update(dtype="<q9"),
            "schema['fields'][0]['dtype'] must be a numpy dtype string such as '<f4' or '|u1', "
            "got '<q9'",
        ),
        (
            lambda m: m["schema"]["fields"][0].update(dtype="|O"),
            "schema['fields'][0]['dtype'] must be a number, bool, time or fixed-size string "
            "dtype, got '|O'",
        ),
        (
            lambda m: m["schema"]["fields"][0].update(ndim=10**9),
            "schema['fields'][0]['ndim'] must be an integer from 0 to 64, got 1000000000",
        ),
        (
            lambda m: m.pop("schema"),
            "the manifest['schema'] must be a JSON object, got NoneType None",
        ),
        (
            lambda m: m.update(records=7),
            "the manifest['records'] is 7 but its shards hold 6 records",
        ),
    ],
)
def test_a_structurally_wrong_manifest_names_the_key(tmp_path, change, expected, version) -> None:
    path = write(tmp_path / "d", int64_records())
    rewrite_manifest(path, change, version)
    with pytest.raises(PackedFormatError) as caught:
        PackedDataset(path)
    assert str(caught.value) == f"{manifest_path(path)}: {expected}: {DAMAGED}"


@pytest.mark.parametrize("version", [1, 2])
def test_a_damaged_npy_header_is_reported_without_advice_to_unpickle(tmp_path, version) -> None:
    path = write(tmp_path / "d", int64_records())
    index_path = os.path.join(path, "shard-00000.index.npy")
    with open(index_path, "rb") as f:
        raw = f.read()
    header_end = raw.index(b"\n") + 1
    header = raw[:header_end]
    descr = header[header.index(b"'descr': ") + 9 : header.index(b", 'fortran_order'")]
    damaged = header.replace(descr, b"'|O'".ljust(len(descr))) + raw[header_end:]
    with open(index_path, "wb") as f:
        f.write(damaged)
    rewrite_manifest(
        path, lambda m: m["shards"][0].update(index_crc32=zlib.crc32(damaged)), version
    )
    with pytest.raises(PackedFormatError) as caught:
        PackedDataset(path)
    text = str(caught.value)
    assert text.startswith(
        f"index file {index_path!r} holds object of shape (6,), but the manifest describes [("
    )
    assert text.endswith(f"of shape (6,): it is damaged; {REWRITE}")
    assert "pickle" not in text.lower()
    broken = b"\x93NUMPY\x01\x00\x10\x00{'descr': <i8}\n" + raw[header_end:]
    with open(index_path, "wb") as f:
        f.write(broken)
    rewrite_manifest(
        path,
        lambda m: m["shards"][0].update(
            index_crc32=zlib.crc32(broken), index_file_bytes=len(broken)
        ),
        version,
    )
    with pytest.raises(PackedFormatError) as caught:
        PackedDataset(path)
    text = str(caught.value)
    assert text.startswith(f"index file {index_path!r} has a damaged .npy header (")
    assert "pickle" not in text.lower()


def test_a_version_1_dataset_still_opens_and_says_what_is_not_protected(tmp_path, caplog) -> None:
    path = write(tmp_path / "d", int64_records())
    rewrite_manifest(path, lambda m: None, version=1)
    with caplog.at_level("WARNING", logger="stoker"):
        ds = PackedDataset(path, verify="open")
    assert [r["label"] for r in ds] == list(range(6))
    (record,) = caplog.records
    assert record.getMessage().startswith(
        f"{manifest_path(path)} is packed format version 1, whose manifest has no checksum: "
        "damage to it"
    )


# -- item: a manifest that is not a file, far too large, or nested too deeply --------------------


def replace_manifest(path: str, make) -> str:
    target = manifest_path(path)
    os.remove(target)
    make(target)
    return target


def write_text(text: str):
    def make(target: str) -> None:
        with open(target, "w") as f:
            f.write(text)

    return make


def sparse(size: int):
    def make(target: str) -> None:
        with open(target, "wb") as f:
            f.truncate(size)

    return make


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        pytest.param(
            write_text("[" * 100_000),
            r"manifest\.json is not valid JSON \(RecursionError: maximum recursion depth exceeded "
            r"while decoding a JSON array.*\): the manifest is damaged",
            id="nested-lists",
        ),
        pytest.param(
            write_text('{"a": ' * 100_000),
            r"manifest\.json is not valid JSON \(RecursionError: maximum recursion depth exceeded"
            r".*\): the manifest is damaged",
            id="nested-objects",
        ),
        pytest.param(
            write_text('{"format": "stoker-packed", "records": ' + "9" * 5000 + "}"),
            r"manifest\.json is not valid JSON \(Exceeds the limit .* for integer string "
            r"conversion.*\): the manifest is damaged",
            id="huge-integer",
        ),
        pytest.param(
            sparse(64 * 2**20 + 1),
            r"the manifest '.*manifest\.json' is 67108865 bytes, far above any manifest stoker "
            r"writes \(at most 67108864 bytes are read\): it is damaged or not a manifest",
            id="over-64-MiB",
        ),
        pytest.param(
            os.mkdir,
            r"the manifest '.*manifest\.json' is not a regular file \(it is a device, a FIFO or a "
            r"folder\)",
            id="folder",
        ),
        pytest.param(
            os.mkfifo,
            r"the manifest '.*manifest\.json' is not a regular file",
            id="fifo",
        ),
        pytest.param(
            lambda target: os.symlink("/dev/zero", target),
            r"the manifest '.*manifest\.json' is not a regular file",
            id="link-to-dev-zero",
        ),
    ],
)
def test_a_manifest_that_cannot_be_parsed_safely_is_refused_naming_it(
    tmp_path, make, expected
) -> None:
    path = write(tmp_path / "d", int64_records())
    replace_manifest(path, make)
    with pytest.raises(PackedFormatError, match=expected) as caught:
        PackedDataset(path)
    assert manifest_path(path) in str(caught.value)
    assert REWRITE in str(caught.value)


def test_a_manifest_nested_just_short_of_the_parser_limit_is_refused_too(tmp_path) -> None:
    """Nesting that parses can still be too deep to check (the checksum re-encodes the JSON a
    few calls deeper): every depth around the parser's limit raises PackedFormatError."""
    path = write(tmp_path / "d", int64_records())

    def open_nested(depth: int) -> str:
        nested = "[" * depth + "]" * depth
        head = '{"format": "stoker-packed", "version": 2, "manifest_crc32": 0, "x": '
        replace_manifest(path, write_text(head + nested + "}"))
        with pytest.raises(PackedFormatError) as caught:
            PackedDataset(path)
        return str(caught.value)

    low, high = 1, 100_000  # parses at low, not at high
    messages = {}
    while high - low > 1:
        middle = (low + high) // 2
        messages[middle] = open_nested(middle)
        if "is not valid JSON" in messages[middle]:
            high = middle
        else:
            low = middle
    assert all(manifest_path(path) in message for message in messages.values())
    assert messages[low].startswith(f"{manifest_path(path)} nests too deeply to be checked")
