"""Packed shards from a real S3 server: each shard downloaded once per epoch in any order,
prefetching that follows the order of the reads, and the bounds on what a process holds."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from stoker import BlockShuffleSampler, DataLoader
from stoker.formats.packed import PackedDataset, PackedWriter
from stoker.samplers import ShardSampler
from stoker.storage import ShardCache, Storage
from stoker.storage.packed import RemoteShards


def _packed(s3, tmp_path, records: int = 60) -> tuple[str, int, list[int]]:
    """A dataset of 12 shards of 5 records at a URL; its URL, shard count and shard sizes."""
    folder = str(tmp_path / "packed")
    with PackedWriter(folder, max_shard_bytes=1400) as writer:
        for i in range(records):
            writer.add({"x": np.full(64, i, dtype=np.int32), "label": i})
    local = PackedDataset(folder)
    sizes = [s["data_file_bytes"] for s in local.manifest["shards"]]
    return s3.put_folder(folder, "packed"), len(sizes), sizes


def _gets(s3, shards: int) -> list[int]:
    return [s3.proxy.count(f"shard-{s:05d}.npy") for s in range(shards)]


@pytest.mark.parametrize(("num_workers", "context"), [(0, None), (2, "fork"), (2, "spawn")])
def test_a_shuffled_epoch_without_a_cache_downloads_each_shard_once(
    s3, tmp_path, num_workers, context
) -> None:
    url, shards, _ = _packed(s3, tmp_path)
    assert shards == 12
    ds = PackedDataset(url, storage_options=s3.options, prefetch=2)  # no cache folder
    # the worker processes share the dataset's private folder
    loader = DataLoader(ds, 4, shuffle=True, generator=0, num_workers=num_workers,
                        multiprocessing_context=context)  # fmt: skip
    first = sorted(np.concatenate([b["label"] for b in loader]).tolist())
    assert first == list(range(60))
    assert _gets(s3, shards) == [1] * shards  # shards read again later are kept, not fetched
    # The second epoch (another order) reads the shards the first one kept: no download.
    second = np.concatenate([b["label"] for b in loader]).tolist()
    assert sorted(second) == first
    assert _gets(s3, shards) == [1] * shards
    ds.close()


def test_a_block_shuffled_epoch_downloads_each_shard_once(s3, tmp_path) -> None:
    url, shards, _ = _packed(s3, tmp_path)
    ds = PackedDataset(url, storage_options=s3.options, prefetch=3)
    sampler = BlockShuffleSampler(ds, block_size=5, window=2, generator=1)
    labels = [int(s["label"]) for s in DataLoader(ds, batch_size=None, sampler=sampler)]
    ds.close()
    assert sorted(labels) == list(range(60))
    assert _gets(s3, shards) == [1] * shards


@pytest.mark.parametrize(
    ("replicas", "num_workers", "context"),
    [(2, 0, None), (3, 0, None), (2, 2, "fork"), (3, 2, "spawn")],
)
def test_ranks_with_a_shard_sampler_download_disjoint_shards(
    s3, tmp_path, replicas, num_workers, context
) -> None:
    url, shards, _ = _packed(s3, tmp_path)
    seen = []
    for rank in range(replicas):  # each rank opens the dataset itself, as on its own machine
        ds = PackedDataset(url, storage_options=s3.options, prefetch=3)
        sampler = ShardSampler(ds, num_replicas=replicas, rank=rank, seed=7)
        batches = DataLoader(
            ds, batch_size=4, sampler=sampler, num_workers=num_workers,
            multiprocessing_context=context,
        )  # fmt: skip
        seen.append(np.concatenate([b["label"] for b in batches]).tolist())
        ds.close()
    assert sorted(label for labels in seen for label in labels) == list(range(60))
    assert _gets(s3, shards) == [1] * shards  # each shard downloaded by one rank only,
    # prefetching included: it follows the rank's own shards, which the sampler hands over


def test_a_cache_smaller_than_the_dataset_is_named_in_a_warning(s3, tmp_path) -> None:
    url, _, sizes = _packed(s3, tmp_path)
    small = ShardCache(tmp_path / "cache", max_bytes=sum(sizes) // 2)
    with pytest.warns(UserWarning, match=r"more than the cache's max_bytes") as caught:
        PackedDataset(url, storage_options=s3.options, cache=small).close()
    text = str(caught[0].message)
    assert f"PackedDataset({url!r})" in text and "downloaded again" in text
    big = ShardCache(tmp_path / "big", max_bytes=sum(sizes))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PackedDataset(url, storage_options=s3.options, cache=big).close()


def _remote(s3, url: str, prefetch: int, cache: ShardCache) -> RemoteShards:
    shards = RemoteShards(url, Storage(s3.options, cache=cache, prefetch=prefetch))
    shards.mirror()
    return shards


def test_shards_read_in_order_are_prefetched_and_a_jump_prefetches_nothing(s3, tmp_path) -> None:
    url, count, sizes = _packed(s3, tmp_path)
    remote = _remote(s3, url, 3, ShardCache(tmp_path / "cache"))
    try:
        remote.open(0, sizes[0])
        remote.prefetch_after(0, sizes)  # starting at the first shard: in order
        assert remote.prefetching == (1, 2, 3)
        remote.open(1, sizes[1])
        remote.prefetch_after(1, sizes)
        assert remote.prefetching == (2, 3, 4)
        remote.open(9, sizes[9])  # a jump: a shuffled order, whose next shard is unknown
        remote.prefetch_after(9, sizes)
        assert remote.prefetching == ()
        remote.open(6, sizes[6])
        remote.prefetch_after(6, sizes)
        assert remote.prefetching == ()
    finally:
        remote.close()
    gets = _gets(s3, count)
    assert [gets[s] for s in (0, 1, 6, 9)] == [1, 1, 1, 1]
    assert sum(gets[s] for s in (5, 7, 8, 10, 11)) == 0  # never the shards after a jump


def test_what_a_process_holds_and_prefetches_stays_bounded(s3, tmp_path) -> None:
    url, _, sizes = _packed(s3, tmp_path)
    cache = ShardCache(tmp_path / "cache", max_bytes=0)  # keeps only what is held
    prefetch = 2
    remote = _remote(s3, url, prefetch, cache)
    order = [0, 1, 2, 3, 9, 4, 5, 11, 10, 6, 7, 8, 0, 1, 2, 5, 6, 7, 3]
    try:
        for shard in order:
            remote.open(shard, sizes[shard])
            remote.prefetch_after(shard, sizes)
            assert len(remote.held) <= prefetch + 2, (shard, remote.held)
            assert len(remote.prefetching) <= prefetch, (shard, remote.prefetching)
            assert remote.held[-1] == shard
    finally:
        remote.close()
    # Nothing is held any more (dropped prefetches included): every file can be evicted.
    cache.get("s3://elsewhere/one", 3, _write_abc).close()
    assert cache.usage() == 3


def _write_abc(dest: str) -> None:
    with open(dest, "wb") as f:
        f.write(b"abc")


def test_a_planned_order_is_prefetched_in_that_order(s3, tmp_path) -> None:
    url, count, sizes = _packed(s3, tmp_path)
    remote = _remote(s3, url, 2, ShardCache(tmp_path / "cache"))
    remote.plan([7, 3, 9, 1, 4])
    try:
        remote.open(7, sizes[7])
        remote.prefetch_after(7, sizes)
        assert remote.prefetching == (3, 9)  # the plan's next two, not shards 8 and 9
        remote.open(3, sizes[3])
        remote.prefetch_after(3, sizes)
        assert remote.prefetching == (1, 9)
        remote.open(4, sizes[4])  # the plan's last: nothing after it
        remote.prefetch_after(4, sizes)
        assert remote.prefetching == ()
    finally:
        remote.close()
    gets = _gets(s3, count)
    assert [gets[s] for s in (0, 2, 5, 6, 8, 10, 11)] == [0] * 7
