"""A cached copy is the object's version it was downloaded from: an object overwritten with
other bytes of the same size is downloaded again by a reader sharing the cache folder, and
its stale copy is neither served nor called corrupted."""

from __future__ import annotations

import os

import numpy as np
import pytest

from stoker.formats.packed import PackedDataset, PackedFormatError, PackedWriter
from stoker.formats.tar import TarShards, write_tar_shards
from stoker.formats.text import JsonLines, TextLines
from stoker.storage import ShardCache, Storage

OLD = b'{"id": 1}\n{"id": 2}\n'
NEW = b'{"id": 7}\n{"id": 8}\n'  # other bytes, the same size


def test_an_overwritten_object_is_read_anew_by_a_new_reader(s3, tmp_path) -> None:
    assert len(OLD) == len(NEW)
    s3.put("jsonl/part-000.jsonl", OLD)
    cache = str(tmp_path / "cache")

    def ids() -> list[int]:
        return [
            r["id"] for r in JsonLines(s3.url("jsonl"), storage_options=s3.options, cache=cache)
        ]

    assert ids() == [1, 2]
    s3.put("jsonl/part-000.jsonl", NEW)
    assert ids() == [7, 8]
    assert s3.proxy.count("part-000.jsonl") == 2  # downloaded again
    assert ids() == [7, 8]
    assert s3.proxy.count("part-000.jsonl") == 2  # the new copy serves the next reader
    assert ShardCache(cache).usage() == len(NEW)  # the stale copy is gone


def test_a_url_given_in_a_list_is_checked_too(s3, tmp_path) -> None:
    """A URL in a list is not listed: its version comes from the object's own info."""
    url = s3.put("txt/a.txt", b"old one\nold two\n")
    cache = str(tmp_path / "cache")
    assert list(TextLines([url], storage_options=s3.options, cache=cache)) == ["old one", "old two"]
    s3.put("txt/a.txt", b"new one\nnew two\n")
    assert list(TextLines([url], storage_options=s3.options, cache=cache)) == ["new one", "new two"]


def test_an_http_tar_shard_is_checked_by_its_etag(s3, tmp_path) -> None:
    def shard(value: str) -> bytes:
        path = write_tar_shards(
            [{"__key__": "0000", "cls": value}], str(tmp_path / f"{value}-%03d.tar")
        )[0]
        with open(path, "rb") as f:
            return f.read()

    old, new = shard("1"), shard("2")
    assert len(old) == len(new) and old != new
    s3.put("tars/s-000.tar", old)
    s3.fs.call_s3("put_object_acl", Bucket=s3.bucket, Key="tars/s-000.tar", ACL="public-read")
    url = f"{s3.proxy.endpoint}/{s3.bucket}/tars/s-000.tar"
    cache = str(tmp_path / "cache")
    assert [s["cls"] for s in TarShards([url], cache=cache)] == [b"1"]
    s3.put("tars/s-000.tar", new)
    s3.fs.call_s3("put_object_acl", Bucket=s3.bucket, Key="tars/s-000.tar", ACL="public-read")
    assert [s["cls"] for s in TarShards([url], cache=cache)] == [b"2"]


def test_a_local_file_is_checked_by_its_mtime_and_size(tmp_path) -> None:
    source = tmp_path / "data.bin"
    source.write_bytes(b"old bytes")
    url = f"file://{source}"
    cache = str(tmp_path / "cache")
    with Storage(cache=cache).fetch(url) as held, open(held.path, "rb") as f:
        assert f.read() == b"old bytes"
        assert held.version is not None and "mtime" in held.version
    source.write_bytes(b"new bytes")
    stamp = os.stat(source).st_mtime_ns + 5 * 10**9  # a rewrite a few seconds later
    os.utime(source, ns=(stamp, stamp))
    with Storage(cache=cache).fetch(url) as held, open(held.path, "rb") as f:
        assert not held.hit
        assert f.read() == b"new bytes"


def _write_packed(folder: str, offset: int) -> str:
    with PackedWriter(folder, max_shard_bytes=2500) as writer:
        for i in range(40):
            writer.add({"x": np.full(64, i + offset, dtype=np.int32), "label": i + offset})
    return folder


@pytest.mark.parametrize("verify", [False, "open"])
def test_a_rewritten_packed_dataset_is_read_anew(s3, tmp_path, verify) -> None:
    first = PackedDataset(_write_packed(str(tmp_path / "first"), 0))
    second = PackedDataset(_write_packed(str(tmp_path / "second"), 1000))
    sizes = [[s["data_file_bytes"] for s in ds.manifest["shards"]] for ds in (first, second)]
    assert sizes[0] == sizes[1] and len(sizes[0]) > 2  # the same shard sizes, other bytes
    url = s3.put_folder(first.path, "packed")
    cache = str(tmp_path / "cache")

    def labels() -> list[int]:
        ds = PackedDataset(url, storage_options=s3.options, cache=cache, verify=verify)
        try:
            # the label lives in the index file, the array in the data shard
            return [int(ds[i]["x"][0]) for i in range(len(ds))]
        finally:
            ds.close()

    assert labels() == list(range(40))
    gets = s3.proxy.count("shard-00000.npy")
    s3.put_folder(second.path, "packed")
    assert labels() == list(range(1000, 1040))  # neither the old data nor "corrupted"
    assert s3.proxy.count("shard-00000.npy") == gets + 1
    assert labels() == list(range(1000, 1040))
    assert s3.proxy.count("shard-00000.npy") == gets + 1  # the new copies are reused


def test_a_damaged_shard_is_called_corrupted_and_leaves_nothing_running(s3, tmp_path) -> None:
    folder = _write_packed(str(tmp_path / "packed"), 0)
    url = s3.put_folder(folder, "packed")
    with open(os.path.join(folder, "shard-00001.npy"), "rb") as f:
        damaged = bytearray(f.read())
    damaged[-10] ^= 0xFF  # in the last record's bytes: the size and the header still agree
    s3.put("packed/shard-00001.npy", bytes(damaged))
    with pytest.raises(PackedFormatError, match="fails its checksum") as caught:
        PackedDataset(url, storage_options=s3.options, cache=str(tmp_path / "cache"), verify="open")
    assert f"{url}/shard-00001.npy" in str(caught.value)
    # the leak check after the test: no prefetch thread, no connection left open
