"""Shuffle buffers: a permutation per epoch, seeded, and resumable from record positions."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from stoker import DataLoader, IterableDataset, ShuffleBuffer
from stoker.formats.tar import TarShards, write_tar_shards
from stoker.formats.text import JsonLines, TextLines


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


def write_corpus(folder, sizes=(23, 17, 31, 9)) -> set[tuple[int, int]]:
    """JSON-lines files (every other one gzipped, with blank lines); returns every key."""
    keys = set()
    for k, n in enumerate(sizes):
        lines = []
        for i in range(n):
            lines.append(json.dumps({"f": k, "i": i}))
            if i % 7 == 3:
                lines.append("")  # blank lines are not records
            keys.add((k, i))
        data = "".join(line + "\n" for line in lines)
        path = os.path.join(folder, f"part-{k}.jsonl" + (".gz" if k % 2 else ""))
        opener = gzip.open if k % 2 else open
        with opener(path, "wt", encoding="utf-8") as f:
            f.write(data)
    return keys


def key(record) -> tuple[int, int]:
    return record["f"], record["i"]


def keys_of(loader) -> list[tuple[int, int]]:
    return [key(r) for r in loader]


class Counting(IterableDataset):
    """A stream of ints with its own state_dict (what ShuffleBuffer needs from a stream)."""

    def __init__(self, n: int) -> None:
        self.n, self.next = n, 0
        self._resume = 0

    def __iter__(self):
        self.next = self._resume
        self._resume = 0
        while self.next < self.n:
            self.next += 1
            yield self.next - 1

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state):
        self._resume = state["next"]


def make_readers(folder):
    """Each kind of shuffled stream, over the same 80 records, by name."""
    tar_paths = write_tar_shards(
        ({"__key__": f"{i:04d}", "json": {"f": i // 20, "i": i % 20}} for i in range(80)),
        os.path.join(folder, "shard-%02d.tar"),
        max_samples_per_shard=20,
    )

    def tar_record(sample):
        return json.loads(sample["json"])

    return {
        "jsonl": lambda: JsonLines(folder, shuffle_buffer=16),
        "tar": lambda: TarShards(tar_paths, decode=tar_record, shuffle_buffer=16),
        "wrapped": lambda: ShuffleBuffer(JsonLines(folder), 16),
        "text": lambda: TextLines(
            sorted(os.path.join(folder, n) for n in os.listdir(folder) if ".jsonl" in n),
            skip_empty=True,
            transform=json.loads,
            shuffle_buffer=16,
        ),
    }


KINDS = ["jsonl", "tar", "wrapped", "text"]


def expected_keys(kind: str, corpus: set) -> set:
    return {(i // 20, i % 20) for i in range(80)} if kind == "tar" else corpus


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", KINDS)
def test_every_record_once_per_epoch_and_epochs_differ(tmp_path, kind, num_workers) -> None:
    corpus = write_corpus(tmp_path)
    ds = make_readers(tmp_path)[kind]()
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers, generator=7)
    first, second = keys_of(loader), keys_of(loader)
    want = expected_keys(kind, corpus)
    assert sorted(first) == sorted(want) and len(first) == len(want)
    assert sorted(second) == sorted(want)
    assert first != second  # a new order each epoch
    assert first != sorted(first)  # shuffled, not in file order
    again = DataLoader(
        make_readers(tmp_path)[kind](), batch_size=None, num_workers=num_workers, generator=7
    )
    assert keys_of(again) == first  # the same seed gives the same order
    other = DataLoader(
        make_readers(tmp_path)[kind](), batch_size=None, num_workers=num_workers, generator=8
    )
    assert keys_of(other) != first


@pytest.mark.parametrize("kind", KINDS)
def test_0_and_1_workers_give_one_order_and_more_workers_the_same_set(tmp_path, kind) -> None:
    corpus = write_corpus(tmp_path)
    make = make_readers(tmp_path)[kind]
    orders = {
        n: keys_of(DataLoader(make(), batch_size=None, num_workers=n, generator=7))
        for n in (0, 1, 3)
    }
    assert orders[0] == orders[1]  # one shard either way, seeded alike
    assert orders[0] != sorted(orders[0])
    assert sorted(orders[3]) == sorted(orders[0]) == sorted(expected_keys(kind, corpus))


def test_a_buffer_over_any_stream_gives_one_order_with_0_and_1_workers() -> None:
    orders = [
        list(
            DataLoader(ShuffleBuffer(Counting(40), 10), batch_size=None, generator=4, num_workers=n)
        )
        for n in (0, 1)
    ]
    assert orders[0] == orders[1] and sorted(orders[0]) == list(range(40))


def test_an_explicit_seed_fixes_the_order_whatever_the_loader_seed(tmp_path) -> None:
    write_corpus(tmp_path)
    orders = [
        keys_of(
            DataLoader(ShuffleBuffer(JsonLines(tmp_path), 8, seed=3), batch_size=None, generator=g)
        )
        for g in (1, 2)
    ]
    assert orders[0] == orders[1]
    outside = ShuffleBuffer(JsonLines(tmp_path), 8, seed=3)
    assert [key(r) for r in outside] == orders[0]
    outside.set_epoch(1)
    assert [key(r) for r in outside] != orders[0]


def test_a_reader_shuffles_from_its_own_seed_outside_a_loader(tmp_path) -> None:
    write_corpus(tmp_path)
    one = [key(r) for r in JsonLines(tmp_path, shuffle_buffer=8, seed=1)]
    assert one == [key(r) for r in JsonLines(tmp_path, shuffle_buffer=8, seed=1)]
    assert one != [key(r) for r in JsonLines(tmp_path, shuffle_buffer=8, seed=2)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stop", [0, 1, 5, 15, 16, 17, 40, 79])
def test_resuming_equals_the_uninterrupted_run(tmp_path, kind, stop) -> None:
    write_corpus(tmp_path)
    make = make_readers(tmp_path)[kind]
    whole = DataLoader(make(), batch_size=None, generator=11)
    keys_of(whole)  # epoch 0
    uninterrupted = keys_of(whole)  # epoch 1: the resumed epoch is not the first
    loader = DataLoader(make(), batch_size=None, generator=11)
    keys_of(loader)
    iterator = iter(loader)
    head = [key(next(iterator)) for _ in range(stop)]
    state = loader.state_dict()
    del iterator
    resumed = DataLoader(make(), batch_size=None, generator=99)
    resumed.load_state_dict(state)
    assert head + keys_of(resumed) == uninterrupted


def test_resuming_reads_no_consumed_record_again(tmp_path) -> None:
    write_corpus(tmp_path)
    parsed = []

    def count(record):
        parsed.append(key(record))
        return record

    first = DataLoader(
        JsonLines(tmp_path, shuffle_buffer=16), batch_size=4, collate_fn=list, generator=5
    )
    whole = [key(r) for batch in first for r in batch]
    loader = DataLoader(
        JsonLines(tmp_path, shuffle_buffer=16), batch_size=4, generator=5, collate_fn=list
    )
    iterator = iter(loader)
    head = [key(r) for _ in range(6) for r in next(iterator)]
    state = loader.state_dict()
    del iterator
    resumed = DataLoader(
        JsonLines(tmp_path, shuffle_buffer=16, transform=count),
        batch_size=4,
        generator=5,
        collate_fn=list,
    )
    resumed.load_state_dict(state)
    rest = [key(r) for batch in resumed for r in batch]
    assert head + rest == whole
    assert sorted(parsed) == sorted(rest)  # every record parsed once: none of the 24 delivered
    buffered = state["stream"]["dataset"]["buffer"]
    assert len(buffered) == 15  # the buffer is stored as positions ...
    assert all(len(p) == 2 for p in buffered)  # ... (file, record) pairs


@pytest.mark.parametrize(
    ("saved_with", "resumed_with"), [(0, 0), (0, 1), (1, 0)], ids=["0", "0-to-1", "1-to-0"]
)
@pytest.mark.parametrize("stop", [0, 3, 10, 25])
def test_a_buffer_over_any_stream_resumes_with_its_samples(stop, saved_with, resumed_with) -> None:
    whole = list(DataLoader(ShuffleBuffer(Counting(40), 10), batch_size=None, generator=1))
    loader = DataLoader(
        ShuffleBuffer(Counting(40), 10), batch_size=None, generator=1, num_workers=saved_with
    )
    iterator = iter(loader)
    head = [next(iterator) for _ in range(stop)]
    state = loader.state_dict()
    del iterator
    loader.close()
    resumed = DataLoader(
        ShuffleBuffer(Counting(40), 10), batch_size=None, generator=2, num_workers=resumed_with
    )
    resumed.load_state_dict(state)
    assert head + list(resumed) == whole
    assert sorted(whole) == list(range(40)) and whole != list(range(40))


def test_a_reader_resumes_without_a_buffer(tmp_path) -> None:
    write_corpus(tmp_path)
    ds = JsonLines(tmp_path, shuffle_files=True)
    whole = [key(r) for r in ds]
    iterator = iter(ds)
    head = [key(next(iterator)) for _ in range(30)]
    state = ds.state_dict()
    again = JsonLines(tmp_path, shuffle_files=True)
    again.load_state_dict(state)
    assert head + [key(r) for r in again] == whole


def test_a_state_from_another_shard_is_refused(tmp_path) -> None:
    write_corpus(tmp_path)
    ds = JsonLines(tmp_path, shuffle_buffer=4, rank=0, world_size=2)
    iterator = iter(ds)
    next(iterator)
    state = ds.state_dict()
    other = JsonLines(tmp_path, shuffle_buffer=4, rank=1, world_size=2)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="saved by shard 0 of 2"):
        list(other)
    with pytest.raises(ValueError, match="expects a state saved by"):
        other.load_state_dict({"epoch": 0})


def test_shuffle_true_on_a_stream_names_the_shuffle_buffer(tmp_path) -> None:
    write_corpus(tmp_path)
    with pytest.raises(ValueError, match=r"shuffle_buffer=N.*stoker\.ShuffleBuffer"):
        DataLoader(JsonLines(tmp_path), shuffle=True)
