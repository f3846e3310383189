"""Multi-worker delivery: every index exactly once, in the right order, in every mode."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from engine.engine_datasets import (
    BatchedSamples,
    InfoSamples,
    ReplicaStream,
    Samples,
    ShardedStream,
    TorchShardedStream,
    shard_bounds,
)
from harness import leaks as engine_harness
from stoker import ArrayDataset, DataLoader, get_worker_info

MODES = ("process", "thread")


def indices_of(batches: list) -> list[int]:
    return [int(i) for batch in batches for i in np.atleast_1d(batch[0])]


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "as_ready"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_every_index_exactly_once_per_epoch(num_workers: int, mode: str, in_order: bool) -> None:
    n, batch_size = 61, 4
    ds = Samples(n)
    single = DataLoader(ds, batch_size=batch_size, shuffle=True, generator=7)
    references = [[b[0].tolist() for b in single] for _ in range(2)]
    assert references[0] != references[1]  # a new shuffle each epoch
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        generator=7,
        num_workers=num_workers,
        worker_mode=mode,
        in_order=in_order,
    )
    for reference in references:
        batches = list(loader)
        got = [b[0].tolist() for b in batches]
        assert sorted(indices_of(batches)) == list(range(n))
        assert len(batches) == len(loader) == 16
        if in_order:
            assert got == reference  # the sampler's order, batch for batch
        else:
            assert sorted(got) == sorted(reference)  # the same batches, whatever the order
    worker_ids = {int(w) for b in batches for w in b[3]}
    assert worker_ids == set(range(num_workers))  # every worker took part, none other
    pids = {int(p) for b in batches for p in b[1]}
    if mode == "thread":
        assert pids == {os.getpid()}
    else:
        assert len(pids) == num_workers and os.getpid() not in pids


@pytest.mark.parametrize("mode", MODES)
def test_map_dataset_with_getitems_is_fetched_in_one_call(mode: str) -> None:
    batches = list(DataLoader(BatchedSamples(10), batch_size=3, num_workers=2, worker_mode=mode))
    assert [b[0].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert all(list(b[5]) == ["getitems"] * len(b[0]) for b in batches)


@pytest.mark.parametrize("mode", MODES)
def test_map_dataset_without_getitems_is_fetched_per_index(mode: str) -> None:
    batches = list(DataLoader(Samples(10), batch_size=3, num_workers=2, worker_mode=mode))
    assert [b[0].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert all(len(b) == 5 for b in batches)  # no "getitems" marker: __getitem__ only


@pytest.mark.parametrize("mode", MODES)
def test_array_dataset_values_survive_the_trip(mode: str) -> None:
    x = np.arange(300, dtype=np.float32).reshape(100, 3)
    y = np.arange(100, dtype=np.int64) * 7
    loader = DataLoader(
        ArrayDataset(x, y), batch_size=8, shuffle=True, generator=1, num_workers=2, worker_mode=mode
    )
    xs, ys = zip(*loader, strict=True)
    xs, ys = np.concatenate(xs), np.concatenate(ys)
    assert xs.dtype == np.float32 and ys.dtype == np.int64
    order = ys // 7
    assert sorted(order.tolist()) == list(range(100))
    np.testing.assert_array_equal(xs, x[order])


@pytest.mark.parametrize("mode", MODES)
def test_batch_size_none_yields_unbatched_samples_in_order(mode: str) -> None:
    items = list(DataLoader(Samples(7, width=2), batch_size=None, num_workers=2, worker_mode=mode))
    assert [item[0] for item in items] == list(range(7))  # plain ints: no batch dimension added
    assert all(item[4].tolist() == [item[0]] * 2 for item in items)
    reference = list(DataLoader(Samples(7, width=2), batch_size=None))  # default_convert, as torch
    assert [type(item) for item in items] == [type(item) for item in reference]


@pytest.mark.parametrize("mode", MODES)
def test_drop_last_drops_only_the_short_batch(mode: str) -> None:
    loader = DataLoader(Samples(11), batch_size=4, drop_last=True, num_workers=3, worker_mode=mode)
    batches = list(loader)
    assert [b[0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(loader) == 2


# ------------------------------------------------------------------- iterable datasets


@pytest.mark.parametrize("mode", MODES)
def test_iterable_dataset_runs_one_replica_per_worker(mode: str) -> None:
    loader = DataLoader(ReplicaStream(10), batch_size=4, num_workers=3, worker_mode=mode)
    with pytest.warns(UserWarning) as caught:
        values = [int(v) for batch in loader for v in batch]
    assert sorted(values) == sorted(list(range(10)) * 3)  # no sharding: every worker repeats it
    # the duplicated-data trap is named, once per loader
    assert len(caught) == 1
    assert str(caught[0].message) == (
        "ReplicaStream is an IterableDataset running in 3 workers, but it never called "
        "get_worker_info(): every worker iterates all of it, so each sample is loaded 3 times. "
        "Shard the stream inside __iter__ by worker (stoker.sharding does files, then records, "
        "by rank and worker), or use num_workers=1."
    )


@pytest.mark.parametrize("mode", MODES)
def test_torch_datasets_that_shard_with_torchs_get_worker_info_are_not_duplicated(
    mode: str,
) -> None:
    torch = pytest.importorskip(
        "torch", reason="a torch IterableDataset asking torch for its worker"
    )
    loader = DataLoader(TorchShardedStream(20), batch_size=3, num_workers=2, worker_mode=mode)
    values = sorted(int(v) for batch in loader for v in batch)
    assert values == list(range(20))
    assert torch.utils.data.get_worker_info() is None  # back to torch's answer in the trainer


@pytest.mark.parametrize("in_order", [True, False], ids=["in_order", "as_ready"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_sharded_iterable_dataset_covers_the_stream_once(
    num_workers: int, mode: str, in_order: bool
) -> None:
    loader = DataLoader(
        ShardedStream(29, split=17),
        batch_size=3,
        num_workers=num_workers,
        worker_mode=mode,
        in_order=in_order,
    )
    batches = [b.tolist() for b in loader]
    assert sorted(itertools.chain.from_iterable(batches)) == list(range(29))
    for batch in batches:  # a batch never mixes two workers' shards
        owners = {
            w
            for w in range(num_workers)
            for v in batch
            if v in shard_bounds(29, 17, w, num_workers)
        }
        assert len(owners) == 1


@pytest.mark.parametrize("mode", MODES)
def test_sharded_iterable_order_equals_torch(mode: str) -> None:
    torch = pytest.importorskip(
        "torch", reason="the order is compared with torch.utils.data.DataLoader"
    )

    class TorchSharded(torch.utils.data.IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            return iter(shard_bounds(23, 14, info.id, info.num_workers))

    expected = [
        b.tolist() for b in torch.utils.data.DataLoader(TorchSharded(), batch_size=3, num_workers=2)
    ]
    got = [
        b.tolist()
        for b in DataLoader(
            ShardedStream(23, split=14), batch_size=3, num_workers=2, worker_mode=mode
        )
    ]
    assert got == expected
    # 5 batches from worker 0 alternate with 3 from worker 1; then worker 0 finishes alone
    assert got[-2:] == [[9, 10, 11], [12, 13]] and len(got) == 8


# ------------------------------------------------------------------- worker info / init


def test_get_worker_info_inside_workers_and_none_in_main() -> None:
    assert get_worker_info() is None
    loader = DataLoader(InfoSamples(12), batch_size=2, num_workers=3, generator=11)
    batches = list(loader)
    assert get_worker_info() is None  # iterating did not leak worker info into the trainer
    seeds: dict[int, int] = {}
    for batch in batches:
        assert batch["num_workers"].tolist() == [3, 3]
        assert batch["own_dataset"].all()
        for worker, seed in zip(batch["id"].tolist(), batch["seed"].tolist(), strict=True):
            seeds.setdefault(worker, seed)
            assert seeds[worker] == seed
    assert sorted(seeds) == [0, 1, 2]
    assert [seeds[w] - seeds[0] for w in (0, 1, 2)] == [0, 1, 2]  # worker seed = base seed + id
    again = list(DataLoader(InfoSamples(12), batch_size=2, num_workers=3, generator=11))
    assert {int(w): int(s) for b in again for w, s in zip(b["id"], b["seed"], strict=True)} == seeds


def test_get_worker_info_in_thread_workers_is_per_thread() -> None:
    batches = list(DataLoader(InfoSamples(8), batch_size=2, num_workers=2, worker_mode="thread"))
    assert sorted({int(w) for b in batches for w in b["id"]}) == [0, 1]
    assert all(b["num_workers"].tolist() == [2, 2] for b in batches)
    assert get_worker_info() is None


def test_small_batches_travel_inline_without_segments() -> None:
    loader = DataLoader(Samples(40, width=8), batch_size=4, num_workers=2)
    it = iter(loader)
    seen = []
    for batch in it:
        seen.append(batch)
        assert engine_harness.data_segments(os.getpid()) == []  # 4 * 8 floats: far below 64 KiB
    assert indices_of(seen) == list(range(40))
    assert all(b[4].tolist() == [[i] * 8 for i in b[0].tolist()] for b in seen)


class OneHandle:
    """Reads fixed-size records through one shared file handle: seek, then read."""

    def __init__(self, path: str, n: int, thread_safe: bool | None = None) -> None:
        self.n = n
        self.records = {"file": open(path, "rb")}  # noqa: SIM115  (held for the dataset's life)
        if thread_safe is not None:
            self.thread_safe = thread_safe

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> bytes:
        f = self.records["file"]
        f.seek(i * 8)
        return f.read(8)

    def close(self) -> None:
        self.records["file"].close()


def test_thread_workers_sharing_a_file_handle_are_warned_about(tmp_path) -> None:
    path = tmp_path / "records.bin"
    path.write_bytes(b"".join(i.to_bytes(8, "little") for i in range(16)))
    dataset = OneHandle(str(path), 16)
    with pytest.warns(UserWarning) as caught:
        DataLoader(dataset, batch_size=4, num_workers=2, worker_mode="thread")
    assert str(caught[0].message) == (
        "worker_mode='thread' runs 2 threads that call OneHandle.__getitem__ at the same time, "
        "and it holds open file handles they would share: dataset.records['file'] "
        "(BufferedReader). Interleaved seeks and reads return the wrong bytes without an error. "
        "Open the file per thread (for example in __getitem__, or keyed by "
        "threading.get_ident()), read with os.pread or mmap, use worker_mode='process', or, if "
        "access is safe, set thread_safe = True on the dataset."
    )
    # process workers each have their own handle; a declared-safe dataset is taken at its word
    DataLoader(dataset, batch_size=4, num_workers=2)
    safe = OneHandle(str(path), 16, thread_safe=True)
    DataLoader(safe, batch_size=4, num_workers=2, worker_mode="thread")
    dataset.close()
    safe.close()
