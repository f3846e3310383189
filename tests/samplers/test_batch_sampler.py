"""BatchSampler: torch's batching, with a fast path over stoker's samplers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.samplers import (
    BatchSampler,
    BlockShuffleSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

INNER: dict[str, Callable[[int, int], Any]] = {
    "sequential": lambda n, seed: SequentialSampler(range(n)),
    "random": lambda n, seed: RandomSampler(range(max(n, 1)), generator=seed),
    "subset": lambda n, seed: SubsetRandomSampler(list(range(5, 5 + n)), generator=seed),
    "weighted": lambda n, seed: WeightedRandomSampler(
        np.ones(max(n, 1)), max(n, 1), generator=seed
    ),
    "block_shuffle": lambda n, seed: BlockShuffleSampler(range(n), 3, window=2, generator=seed),
    "distributed": lambda n, seed: DistributedSampler(range(n), num_replicas=3, rank=2, seed=seed),
}


class _Reiterable:
    """A plain iterable (no _epoch_indices) over a fixed list: the general path."""

    def __init__(self, items: list[int]) -> None:
        self.items = items

    def __iter__(self) -> Iterator[int]:
        return iter(self.items)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_batch_size_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"batch_size must be a positive integer, got {bad!r}"):
        BatchSampler(range(4), bad, False)  # type: ignore[arg-type]


def test_drop_last_must_be_a_bool() -> None:
    with pytest.raises(ValueError, match=r"drop_last must be True or False, got int: 0"):
        BatchSampler(range(4), 2, 0)  # type: ignore[arg-type]


def test_exposes_what_the_data_loader_reads() -> None:
    inner = SequentialSampler(range(5))
    b = BatchSampler(inner, 2, True)
    assert (b.sampler, b.batch_size, b.drop_last) == (inner, 2, True)
    assert len(b) == 2
    assert len(BatchSampler(inner, 2, False)) == 3


@given(
    kind=st.sampled_from(sorted(INNER)),
    n=st.integers(0, 120),
    batch_size=st.integers(1, 40),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**40),
)
@settings(max_examples=150, deadline=None)
def test_fast_path_gives_the_same_batches_as_the_general_path(
    kind: str, n: int, batch_size: int, drop_last: bool, seed: int
) -> None:
    fast_inner = INNER[kind](n, seed)
    reference_inner = INNER[kind](n, seed)
    fast = BatchSampler(fast_inner, batch_size, drop_last)
    for epoch in range(2):
        reference_inner.set_epoch(epoch)
        general = BatchSampler(_Reiterable(list(reference_inner)), batch_size, drop_last)
        batches = list(fast)
        assert batches == list(general)
        assert len(batches) == len(fast)
        assert all(type(i) is int for b in batches for i in b)
        assert all(len(b) == batch_size for b in batches[:-1])
        if batches:
            assert len(batches[-1]) == batch_size if drop_last else len(batches[-1]) >= 1


def test_fast_path_reads_the_epoch_array_once() -> None:
    calls = []

    class Spy(RandomSampler):
        def _epoch_indices(self) -> np.ndarray:
            calls.append(self.epoch)
            return super()._epoch_indices()

    b = BatchSampler(Spy(range(100), generator=0), 8, False)
    list(b)
    list(b)
    assert calls == [0, 1]


def test_a_subclass_overriding_iter_is_served_through_iter() -> None:
    class Reversed(SequentialSampler):
        def __iter__(self) -> Iterator[int]:
            return iter(reversed(range(len(self.data_source))))

    assert list(BatchSampler(Reversed(range(5)), 2, False)) == [[4, 3], [2, 1], [0]]


def test_general_path_batches_any_iterable_like_torch() -> None:
    def gen() -> Iterator[str]:
        yield from "abcdefg"

    class Gen:
        def __iter__(self) -> Iterator[str]:
            return gen()

    assert list(BatchSampler(Gen(), 3, False)) == [["a", "b", "c"], ["d", "e", "f"], ["g"]]
    assert list(BatchSampler(Gen(), 3, True)) == [["a", "b", "c"], ["d", "e", "f"]]
    with pytest.raises(TypeError):
        len(BatchSampler(Gen(), 3, True))


def test_set_epoch_and_state_are_forwarded_to_the_wrapped_sampler() -> None:
    inner = RandomSampler(range(40), generator=3)
    b = BatchSampler(inner, 6, False)
    b.set_epoch(4)
    assert inner.epoch == 4
    fourth = list(b)
    state = b.state_dict()
    assert state == {"type": "BatchSampler", "sampler": inner.state_dict()}
    following = list(b)
    other = BatchSampler(RandomSampler(range(40), generator=99), 6, False)
    other.load_state_dict(state)
    assert list(other) == following
    reference = RandomSampler(range(40), generator=3)
    reference.set_epoch(4)
    assert fourth == list(BatchSampler(reference, 6, False))


def test_set_epoch_and_state_over_a_plain_iterable() -> None:
    b = BatchSampler(range(10), 4, False)
    b.set_epoch(3)  # nothing to forward to: a no-op
    assert b.state_dict() == {"type": "BatchSampler", "sampler": None}
    b.load_state_dict({"type": "BatchSampler", "sampler": None})
    with pytest.raises(ValueError, match=r"the wrapped range has no load_state_dict"):
        b.load_state_dict({"type": "BatchSampler", "sampler": {"epoch": 1}})
    with pytest.raises(ValueError, match=r"expects the dict returned by state_dict\(\), got int"):
        b.load_state_dict(3)  # type: ignore[arg-type]


def test_fast_path_keeps_up_with_a_hot_loader() -> None:
    # 20,000 batches of 256 (5.1M indices); the fast path does this in well under a
    # second, a per-int path takes several.
    b = BatchSampler(RandomSampler(range(256 * 20_000), generator=0), 256, True)
    start = time.perf_counter()
    count = sum(1 for _ in b)
    elapsed = time.perf_counter() - start
    assert count == 20_000
    assert elapsed < 2.5, f"{count / elapsed:.0f} batches/s"
