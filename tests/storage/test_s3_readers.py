"""The readers over a real S3-compatible server: URLs listed, sharded, cached, prefetched."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np
import pytest

from stoker import DataLoader
from stoker.formats.packed import PackedDataset, PackedWriter
from stoker.formats.tar import TarShards, write_tar_shards
from stoker.formats.text import JsonLines, TextLines
from stoker.storage import ShardCache


def _jsonl(s3, count: int, per_file: int = 3) -> list[int]:
    ids = []
    for f in range(count):
        rows = [{"id": f * per_file + r} for r in range(per_file)]
        ids += [row["id"] for row in rows]
        data = "".join(json.dumps(row) + "\n" for row in rows).encode()
        if f % 2:
            s3.put(f"jsonl/part-{f:03d}.jsonl.gz", gzip.compress(data))
        else:
            s3.put(f"jsonl/part-{f:03d}.jsonl", data)
    s3.put("jsonl/.hidden.jsonl", b'{"id": -1}\n')
    s3.put("jsonl/notes.txt", b"not a record\n")
    return ids


def test_jsonl_prefix_is_listed_sorted_and_read(s3) -> None:
    ids = _jsonl(s3, 5)
    ds = JsonLines(s3.url("jsonl"), storage_options=s3.options)
    assert list(ds.files) == [
        s3.url(f"jsonl/part-{f:03d}.jsonl" + (".gz" if f % 2 else "")) for f in range(5)
    ]
    assert [r["id"] for r in ds] == ids


def test_text_lines_glob_and_list_of_urls(s3) -> None:
    urls = [s3.put(f"txt/{n}.txt", f"{n} one\n{n} two\n".encode()) for n in ("a", "b")]
    by_glob = TextLines(s3.url("txt/*.txt"), storage_options=s3.options)
    by_list = TextLines(urls, storage_options=s3.options)
    assert list(by_glob) == list(by_list) == ["a one", "a two", "b one", "b two"]


def test_ranks_and_workers_read_disjoint_files(s3) -> None:
    ids = _jsonl(s3, 6)
    seen = []
    for rank in range(2):
        ds = JsonLines(s3.url("jsonl"), storage_options=s3.options, rank=rank, world_size=2)
        got = [
            r["id"]
            for r in DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        ]
        seen.append(got)
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == ids
    # each file was downloaded once in all: no rank or worker fetched another's file
    assert s3.proxy.count("/jsonl/part-", "GET") == 6


def test_second_epoch_is_served_from_the_cache(s3, tmp_path) -> None:
    _jsonl(s3, 4)
    ds = JsonLines(s3.url("jsonl"), storage_options=s3.options, cache=str(tmp_path / "cache"))
    first = [r["id"] for r in ds]
    gets = s3.proxy.count("/jsonl/part-", "GET")
    assert gets == 4
    assert [r["id"] for r in ds] == first
    assert s3.proxy.count("/jsonl/part-", "GET") == gets


def test_tar_shards_from_s3(s3, tmp_path) -> None:
    samples = [{"__key__": f"{i:04d}", "cls": i, "txt": f"s{i}"} for i in range(7)]
    paths = write_tar_shards(samples, str(tmp_path / "s-%03d.tar.gz"), max_samples_per_shard=3)
    for path in paths:
        with open(path, "rb") as f:
            s3.put(f"tars/{os.path.basename(path)}", f.read())
    ds = TarShards(s3.url("tars"), decode=True, storage_options=s3.options, verify="open")
    got = list(ds)
    assert [s["cls"] for s in got] == list(range(7))
    assert got[0]["__url__"] == s3.url("tars/s-000.tar.gz")


def _packed(tmp_path, records: int = 40, shard_bytes: int = 2500) -> str:
    folder = str(tmp_path / "packed")
    with PackedWriter(folder, max_shard_bytes=shard_bytes) as writer:
        for i in range(records):
            writer.add({"x": np.full(64, i, dtype=np.int32), "label": i})
    return folder


def test_packed_dataset_at_a_url_matches_the_local_one(s3, tmp_path) -> None:
    local = PackedDataset(_packed(tmp_path))
    url = s3.put_folder(local.path, "packed")
    remote = PackedDataset(url, storage_options=s3.options, verify="open")
    try:
        assert len(remote) == len(local) == 40
        assert remote.shard_paths[0] == f"{url}/shard-00000.npy"
        for i in (0, 17, 39, 5):
            assert remote[i]["label"] == local[i]["label"]
            assert np.array_equal(remote[i]["x"], local[i]["x"])
        loader = DataLoader(remote, batch_size=8, num_workers=2, multiprocessing_context="fork")
        labels = np.concatenate([b["label"] for b in loader])
        assert labels.tolist() == list(range(40))
    finally:
        remote.close()


def test_packed_damaged_download_is_caught_by_the_manifest(s3, tmp_path) -> None:
    folder = _packed(tmp_path)
    url = s3.put_folder(folder, "packed")
    with open(os.path.join(folder, "shard-00001.index.npy"), "rb") as f:
        damaged = bytearray(f.read())
    damaged[-1] ^= 0xFF
    s3.put("packed/shard-00001.index.npy", bytes(damaged))
    from stoker.formats.packed import PackedFormatError

    with pytest.raises(PackedFormatError, match="fails its checksum") as caught:
        PackedDataset(url, storage_options=s3.options)
    assert f"{url}/shard-00001.index.npy" in str(caught.value)


def test_cache_evicts_least_recently_used_but_never_a_held_file(tmp_path) -> None:
    cache = ShardCache(tmp_path, max_bytes=20)

    def writer(data: bytes):
        def fetch(dest: str) -> None:
            with open(dest, "wb") as f:
                f.write(data)

        return fetch

    held = cache.get("s3://b/a", 10, writer(b"a" * 10))
    cache.get("s3://b/b", 10, writer(b"b" * 10)).close()
    cache.get("s3://b/c", 10, writer(b"c" * 10)).close()  # evicts b (a is held)
    assert cache.contains("s3://b/a") and cache.contains("s3://b/c")
    assert not cache.contains("s3://b/b")
    held.close()
    cache.get("s3://b/d", 10, writer(b"d" * 10)).close()  # now a, the oldest, goes
    assert not cache.contains("s3://b/a")
    assert cache.usage() == 20


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resumed_stream_downloads_no_consumed_file(s3, num_workers) -> None:
    ids = _jsonl(s3, 8, per_file=4)
    url = s3.url("jsonl")

    def loader() -> DataLoader:
        stream = JsonLines(url, storage_options=s3.options, prefetch=1)
        return DataLoader(stream, batch_size=4, num_workers=num_workers, collate_fn=list)

    whole = [r["id"] for batch in loader() for r in batch]
    assert sorted(whole) == ids
    first = loader()
    it = iter(first)
    head = [r["id"] for _ in range(4) for r in next(it)]  # 4 of the 8 files consumed
    state = first.state_dict()
    it.close()
    s3.proxy.reset()
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [r["id"] for batch in resumed for r in batch]
    assert head + rest == whole
    # the file of the last record read is opened again (it might hold more); none before it
    last = max(i // 4 for i in head) if num_workers == 0 else None
    for f in range(8):
        name = f"jsonl/part-{f:03d}.jsonl" + (".gz" if f % 2 else "")
        if num_workers == 0:
            assert (s3.proxy.count(name) == 0) == (f < last), name
    if num_workers:  # each worker resumes in its own files, after the two it consumed
        fetched = {f for f in range(8) if s3.proxy.count(f"part-{f:03d}")}
        assert len(fetched) <= 8 - 4 + 2, fetched
