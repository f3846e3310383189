"""BucketStream: batches of similar length from a stream, every sample once, less padding."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest

from stoker import BucketStream, DataLoader, IterableDataset, pad_collate
from stoker.formats.text import JsonLines


@pytest.fixture(autouse=True)
def no_topology_in_the_environment(monkeypatch) -> None:
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)


class Lengths(IterableDataset):
    """Samples ``{"id": i, "ids": [..] * length}`` with lognormal lengths."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.lengths = np.clip(np.random.default_rng(seed).lognormal(4.0, 0.8, n), 1, 1000).astype(
            int
        )

    def __iter__(self):
        for i, n in enumerate(self.lengths.tolist()):
            yield {"id": i, "ids": list(range(n))}


def length(sample) -> int:
    return len(sample["ids"])


def padding(batches) -> int:
    return sum(max(map(length, b)) * len(b) - sum(map(length, b)) for b in batches)


def write_jsonl(folder, lengths) -> None:
    for k in range(4):
        with open(os.path.join(folder, f"part-{k}.jsonl"), "w") as f:
            for i in range(k, len(lengths), 4):
                f.write(json.dumps({"id": i, "ids": [0] * int(lengths[i])}) + "\n")


def test_sorted_windows_hold_every_sample_once_with_disjoint_ranges() -> None:
    stream = Lengths(640)
    batches = list(BucketStream(stream, 16, key=length, window=128, seed=0))
    ids = [s["id"] for b in batches for s in b]
    assert sorted(ids) == list(range(640))
    assert all(len(b) == 16 for b in batches)
    for w in range(5):  # 128 / 16 = 8 batches per window, in a random order
        window = batches[8 * w : 8 * w + 8]
        assert {s["id"] for b in window for s in b} == set(range(128 * w, 128 * w + 128))
        spans = sorted((min(map(length, b)), max(map(length, b))) for b in window)
        assert all(hi <= lo for (_, hi), (lo, _) in itertools.pairwise(spans))


def test_a_short_batch_waits_for_the_next_window_and_ends_the_stream() -> None:
    batches = list(BucketStream(Lengths(100), 16, key=length, window=40, seed=0))
    assert sorted(s["id"] for b in batches for s in b) == list(range(100))
    assert [len(b) for b in batches].count(16) == 6 and len(batches[-1]) == 4
    dropped = list(BucketStream(Lengths(100), 16, key=length, window=40, seed=0, drop_last=True))
    assert len(dropped) == 6


def test_boundaries_keep_each_batch_in_one_bucket_and_hold_at_most_a_window() -> None:
    bounds = [32, 64, 128, 256]
    batches = list(BucketStream(Lengths(2000), 8, key=length, window=40, boundaries=bounds))
    assert sorted(s["id"] for b in batches for s in b) == list(range(2000))
    edges = [0, *bounds, float("inf")]
    for b in batches:
        lo = max(e for e in edges if e <= min(map(length, b)))
        hi = min(e for e in edges if e > min(map(length, b)))
        assert all(lo <= length(s) < hi for s in b)
        assert 1 <= len(b) <= 8
    # held samples: at any yield, read - yielded <= window
    read = yielded = 0
    stream = Lengths(2000)

    class Counted(IterableDataset):
        def __iter__(self):
            nonlocal read
            for s in stream:
                read += 1
                yield s

    for b in BucketStream(Counted(), 8, key=length, window=40, boundaries=bounds):
        yielded += len(b)
        assert read - yielded + len(b) <= 40


@pytest.mark.parametrize("boundaries", [None, [32, 64, 128, 256]])
def test_bucketing_pads_less_than_plain_batching(boundaries) -> None:
    plain = list(BucketStream(Lengths(4000), 32, key=length, window=32))  # window = one batch
    bucketed = list(BucketStream(Lengths(4000), 32, key=length, window=1024, boundaries=boundaries))
    consecutive = [list(Lengths(4000))[i : i + 32] for i in range(0, 4000, 32)]
    assert padding(bucketed) < 0.5 * padding(consecutive)
    assert padding(plain) == padding(consecutive)  # a window of one batch cannot regroup anything


@pytest.mark.parametrize("num_workers", [0, 2])
def test_with_the_loader_and_pad_collate_every_sample_once(tmp_path, num_workers) -> None:
    lengths = np.random.default_rng(1).integers(1, 60, 300)
    write_jsonl(tmp_path, lengths)
    buckets = BucketStream(JsonLines(tmp_path, shuffle_buffer=32), 8, key=length, window=64)
    loader = DataLoader(buckets, batch_size=None, collate_fn=pad_collate, num_workers=num_workers)
    seen = []
    for batch in loader:
        ids, mask = batch["ids"], batch["attention_mask"]
        assert ids.shape == mask.shape and ids.shape[0] <= 8
        assert mask.sum(axis=1).tolist() == batch["lengths"].tolist()
        seen.extend(batch["id"].tolist())
    assert sorted(seen) == list(range(300))


def test_a_mid_epoch_state_replays_the_stream_and_an_epoch_boundary_state_resumes(
    tmp_path, caplog
) -> None:
    write_jsonl(tmp_path, np.random.default_rng(2).integers(1, 40, 120))

    def loader():
        stream = BucketStream(JsonLines(tmp_path, shuffle_buffer=16), 8, key=length, window=32)
        return DataLoader(stream, batch_size=None, collate_fn=list, generator=5)

    def ids(batches):
        return [[s["id"] for s in batch] for batch in batches]

    whole = ids(loader())
    first = loader()
    iterator = iter(first)
    head = ids(next(iterator) for _ in range(3))
    state = first.state_dict()  # BucketStream has no state: the batches delivered are counted
    assert state["stream"]["replay"] and state["stream"]["taken"] == 3
    assert "BucketStream has no state_dict / load_state_dict" in caplog.text
    del iterator
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + ids(resumed) == whole
    first = loader()
    list(first)
    state = first.state_dict()  # at the epoch's end: the next epoch, no stream state needed
    second = ids(first)
    resumed = loader()
    resumed.load_state_dict(state)
    assert ids(resumed) == second


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="window"):
        BucketStream(Lengths(10), 8, window=4)
    with pytest.raises(ValueError, match="strictly increasing"):
        BucketStream(Lengths(10), 8, boundaries=[5, 5])
    with pytest.raises(TypeError, match="key"):
        BucketStream(Lengths(10), 8, key=3)
