"""States taken where an epoch is easy to get wrong: before it starts, at its last batch, with a
sampler whose length changes by epoch, a stream whose length lies; each resumed run must
continue the uninterrupted one exactly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stoker import ArrayDataset, DataLoader, IterableDataset, get_worker_info, sample_rng
from stoker.samplers import ShardSampler


class Noisy:
    """Map-style samples that carry random draws (the global ones and stoker's own)."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> dict:
        return {"i": i, "np": np.random.rand(), "rng": sample_rng().random()}


def plain(batch: dict) -> dict:
    return {key: value.tolist() for key, value in batch.items()}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("where", ["before-iter", "after-iter"])
def test_a_state_taken_before_the_first_batch_pins_the_seed(num_workers, where) -> None:
    """generator=None: a state taken before the epoch draws nothing has its seed anyway; the
    resumed loader, in a process whose global generator is elsewhere, gives the same batches
    and the same random draws inside them, and taking the state changed nothing."""

    def make():
        return DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=num_workers)

    np.random.seed(1)
    expected = [plain(b) for b in make()]
    np.random.seed(1)
    loader = make()
    iterator = iter(loader) if where == "after-iter" else None
    state = loader.state_dict()
    assert isinstance(state["seed"], int), state
    np.random.seed(555)  # another process: another global state
    resumed = make()
    resumed.load_state_dict(state)
    assert [plain(b) for b in resumed] == expected
    # the loader the state was taken from runs the same epoch as an untouched one
    assert [plain(b) for b in (iterator if iterator is not None else loader)] == expected


class LyingLength(IterableDataset):
    """10 samples, split by worker, resumable; ``__len__`` can be made to lie."""

    def __init__(self, length: int = 10) -> None:
        self.pos, self.length = 0, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(self.pos, 10):
            self.pos = i + 1
            if i % workers == worker:
                yield i

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]


@pytest.mark.filterwarnings("ignore:.*IterableDataset.*:UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("length", [10, 7], ids=["len-right", "len-short"])
def test_a_stream_resumes_after_every_batch_whatever_its_len_says(num_workers, length) -> None:
    def make():
        return DataLoader(LyingLength(length), batch_size=4, num_workers=num_workers)

    expected = [b.tolist() for b in make()]
    assert sorted(i for batch in expected for i in batch) == list(range(10))
    for stop in range(1, len(expected) + 1):
        loader = make()
        iterator = iter(loader)
        head = [next(iterator).tolist() for _ in range(stop)]
        state = loader.state_dict()
        del iterator
        loader.close()
        resumed = make()
        resumed.load_state_dict(state)
        tail = [b.tolist() for b in resumed]
        assert head + tail == expected, f"stopped after {stop} batches, state {state}"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sampler_whose_length_changes_by_epoch_resumes_after_every_batch(num_workers) -> None:
    """ShardSampler gives a rank another number of samples each epoch (whole shards): a state
    in the middle of an epoch stays in that epoch, whatever the next epoch's length."""
    dataset = ArrayDataset(np.arange(30))
    sizes = [5, 3, 7, 2, 4, 6, 3]

    def make():
        sampler = ShardSampler(dataset, shard_sizes=sizes, num_replicas=3, rank=2, seed=1)
        return DataLoader(dataset, batch_size=2, sampler=sampler, num_workers=num_workers)

    reference = make()
    epochs = [[b[0].tolist() for b in reference] for _ in range(3)]
    assert len({len(e) for e in epochs}) > 1, "the epochs must differ in length"
    flat = [b for e in epochs for b in e]
    for stop in range(1, len(flat)):
        loader, head, state, stopped_in = make(), [], None, 0
        for epoch in range(3):
            for batch in loader:
                head.append(batch[0].tolist())
                if len(head) == stop:
                    state, stopped_in = loader.state_dict(), epoch
                    break
            if state is not None:
                break
        loader.close()
        resumed = make()
        resumed.load_state_dict(state)
        tail = [b[0].tolist() for _ in range(stopped_in, 3) for b in resumed]
        assert head + tail == flat, f"stopped after {stop} batches, state {state}"


@pytest.mark.filterwarnings("ignore:.*IterableDataset.*:UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_a_state_that_went_through_json_resumes_exactly(num_workers) -> None:
    """JSON writes the workers' int ids as strings: the resumed workers still find their
    streams, and read on from them instead of from their start."""

    def make():
        return DataLoader(LyingLength(), batch_size=2, num_workers=num_workers)

    expected = [b.tolist() for b in make()]
    loader = make()
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    del iterator
    loader.close()
    resumed = make()
    resumed.load_state_dict(state)
    assert head + [b.tolist() for b in resumed] == expected
