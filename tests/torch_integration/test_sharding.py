"""stoker.sharding: every record read exactly once over all (rank, worker) pairs."""

from __future__ import annotations

import collections
import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stoker
from stoker.sharding import Shard, ShardedIterable, current_shard, shard_for_worker, shard_records

TOPOLOGY_ENV = ("RANK", "WORLD_SIZE")


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in TOPOLOGY_ENV:
        monkeypatch.delenv(name, raising=False)


def read_lines(path: str):
    """Module level, so process workers started with spawn could pickle it too."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


# ------------------------------------------------------------------ the exactly-once property


@settings(max_examples=300, deadline=None)
@given(
    records=st.lists(st.integers(0, 9), min_size=0, max_size=9),
    world_size=st.integers(1, 4),
    num_workers=st.integers(1, 4),
)
def test_every_record_is_read_by_exactly_one_shard(records, world_size, num_workers) -> None:
    files = {f"f{k}": [(k, r) for r in range(n)] for k, n in enumerate(records)}
    seen: collections.Counter = collections.Counter()
    readers: dict[int, list[int]] = collections.defaultdict(list)  # file -> records per reader
    for rank in range(world_size):
        for worker in range(num_workers):
            got = list(
                shard_records(
                    sorted(files), files.__getitem__, rank=rank, world_size=world_size,
                    worker_id=worker, num_workers=num_workers,
                )
            )  # fmt: skip
            seen.update(got)
            for k in {k for k, _ in got}:
                readers[k].append(sum(1 for f, _ in got if f == k))
    everything = [rec for recs in files.values() for rec in recs]
    assert sorted(seen) == sorted(everything)
    assert set(seen.values()) <= {1}, "a record was read twice"
    if 0 < len(files) < world_size * num_workers:
        # a file shared by several shards is split evenly between them
        assert all(max(counts) - min(counts) <= 1 for counts in readers.values())


@settings(max_examples=100, deadline=None)
@given(n_files=st.integers(0, 12), world_size=st.integers(1, 4), num_workers=st.integers(1, 4))
def test_files_are_dealt_whole_when_there_are_enough(n_files, world_size, num_workers) -> None:
    files = [f"f{k}" for k in range(n_files)]
    shards = [
        shard_for_worker(files, rank=r, world_size=world_size, worker_id=w, num_workers=num_workers)
        for r in range(world_size)
        for w in range(num_workers)
    ]
    assert [s.index for s in shards] == list(range(world_size * num_workers))
    if n_files >= world_size * num_workers:
        assert all(s.record_stride == 1 and s.record_offset == 0 for s in shards)
        assert sorted(f for s in shards for f in s.items) == sorted(files)
        assert max(len(s.items) for s in shards) - min(len(s.items) for s in shards) <= 1
    elif n_files:
        assert all(len(s.items) == 1 for s in shards)


def test_the_shard_of_a_rank_and_worker() -> None:
    files = ["a", "b", "c", "d", "e", "f", "g"]
    assert shard_for_worker(files, rank=1, world_size=2, worker_id=0, num_workers=2) == Shard(
        index=2, count=4, items=["c", "g"], record_stride=1, record_offset=0
    )
    # 2 files, 6 shards: file "a" is read by shards 0, 2, 4 (offsets 0, 1, 2 of stride 3)
    assert shard_for_worker(["a", "b"], rank=2, world_size=3, worker_id=0, num_workers=2) == Shard(
        index=4, count=6, items=["a"], record_stride=3, record_offset=2
    )
    assert list(Shard(4, 6, ["a"], 3, 2).records(range(10))) == [2, 5, 8]


# ------------------------------------------------------------------ finding the topology


def test_topology_defaults_to_one_process_without_workers() -> None:
    assert current_shard() == (0, 1)


def test_rank_and_world_size_come_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert current_shard() == (2, 3)
    assert current_shard(worker_id=1, num_workers=2) == (5, 6)
    assert current_shard(rank=0) == (0, 3)  # an explicit value wins


def test_an_initialised_torch_distributed_wins_over_the_environment(monkeypatch) -> None:
    class FakeDistributed:
        """Stands in for torch.distributed after init_process_group (no torch needed)."""

        is_available = staticmethod(lambda: True)
        is_initialized = staticmethod(lambda: True)
        get_rank = staticmethod(lambda: 3)
        get_world_size = staticmethod(lambda: 4)

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeDistributed)
    assert current_shard(worker_id=1, num_workers=2) == (7, 8)
    FakeDistributed.is_initialized = staticmethod(lambda: False)
    assert current_shard() == (0, 1)  # not initialised: the environment decides


def test_half_an_environment_is_an_error(monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(
        ValueError, match=r"sets only one of RANK and WORLD_SIZE \(RANK is missing\)"
    ):
        current_shard()


def test_a_non_integer_environment_is_an_error(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "one")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"RANK and WORLD_SIZE must be integers, got RANK='one'"):
        current_shard()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 2, "world_size": 2}, r"rank must be in \[0, 1\] with world_size=2, got rank=2"),
        ({"rank": -1, "world_size": 2}, r"rank must be a non-negative integer, got -1"),
        ({"world_size": 0, "rank": 0}, r"world_size must be a positive integer, got 0"),
        (
            {"worker_id": 3, "num_workers": 3},
            r"worker_id must be in \[0, 2\] with num_workers=3, got 3",
        ),
        (
            {"num_workers": True, "worker_id": 0},
            r"num_workers must be a positive integer, got True",
        ),
    ],
)
def test_invalid_topologies_say_what_is_wrong(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        current_shard(**kwargs)


def test_open_fn_must_be_callable() -> None:
    with pytest.raises(TypeError, match=r"open_fn must be callable .* got 'x.txt'"):
        ShardedIterable(["a.txt"], "x.txt")


def test_opened_records_are_closed_even_when_the_reader_stops_early() -> None:
    closed = []

    class Records:
        def __init__(self, name):
            self.name = name

        def __iter__(self):
            return iter(range(5))

        def close(self):
            closed.append(self.name)

    reader = shard_records(["a", "b"], Records, rank=0, world_size=1)
    assert [next(reader), next(reader)] == [0, 1]
    reader.close()
    assert closed == ["a"]


# ------------------------------------------------------------------ in a real loader


@pytest.fixture
def text_files(tmp_path):
    """Five files of different lengths; every line is unique."""
    paths = []
    for k, n in enumerate([7, 0, 3, 12, 5]):
        path = tmp_path / f"part-{k}.txt"
        path.write_text("".join(f"file{k}-line{i}\n" for i in range(n)), encoding="utf-8")
        paths.append(str(path))
    expected = sorted(f"file{k}-line{i}" for k, n in enumerate([7, 0, 3, 12, 5]) for i in range(n))
    return paths, expected


@pytest.mark.parametrize("worker_mode", ["process", "thread"])
@pytest.mark.parametrize("files", [5, 1], ids=["files>=shards", "files<shards"])
def test_two_ranks_of_two_workers_read_every_line_once(
    monkeypatch, text_files, worker_mode, files
) -> None:
    paths, expected = text_files
    paths = paths[:files] if files == 5 else [paths[3]]
    if files == 1:
        expected = sorted(line for line in expected if line.startswith("file3-"))
    lines = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = stoker.DataLoader(
            ShardedIterable(paths, read_lines), batch_size=4, num_workers=2, worker_mode=worker_mode
        )
        rank_lines = [line for batch in loader for line in batch]
        assert rank_lines, f"rank {rank} read nothing"
        lines.extend(rank_lines)
    assert sorted(lines) == expected
    assert os.environ["WORLD_SIZE"] == "2"


def test_shard_records_inside_torch_dataloader_workers(text_files) -> None:
    """In torch's own workers the shard comes from torch.utils.data.get_worker_info."""
    torch = pytest.importorskip("torch", reason="checks the fallback to torch's get_worker_info")
    paths, expected = text_files

    class TorchLines(torch.utils.data.IterableDataset):
        def __iter__(self):
            return shard_records(paths, read_lines)

    loader = torch.utils.data.DataLoader(TorchLines(), batch_size=None, num_workers=2)
    assert sorted(loader) == expected


def test_numpy_integers_are_a_topology_too() -> None:
    import numpy as np

    topology = {
        "rank": np.int64(1),
        "world_size": np.int32(2),
        "worker_id": np.uint8(1),
        "num_workers": np.int64(2),
    }
    assert current_shard(**topology) == (3, 4)
    assert all(type(v) is int for v in current_shard(**topology))
    assert shard_for_worker(list(range(8)), **topology).items == [3, 7]
