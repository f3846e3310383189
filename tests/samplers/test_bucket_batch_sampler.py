"""BucketBatchSampler: every index once per epoch, far less padding than random batches."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.samplers import BatchSampler, BucketBatchSampler, RandomSampler


def _padding_waste(lengths: np.ndarray, batches: list[list[int]]) -> int:
    return sum(int(lengths[b].max()) * len(b) - int(lengths[b].sum()) for b in batches)


@given(
    lengths=st.lists(st.integers(0, 500), max_size=300),
    batch_size=st.integers(1, 17),
    multiplier=st.integers(1, 6),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**40),
)
@settings(max_examples=100, deadline=None)
def test_every_index_once_per_epoch(
    lengths: list[int],
    batch_size: int,
    multiplier: int,
    shuffle: bool,
    drop_last: bool,
    seed: int,
) -> None:
    s = BucketBatchSampler(
        lengths,
        batch_size,
        bucket_size_multiplier=multiplier,
        shuffle=shuffle,
        drop_last=drop_last,
        generator=seed,
    )
    n = len(lengths)
    for _ in range(2):
        batches = list(s)
        assert len(batches) == len(s)
        flat = [i for b in batches for i in b]
        assert all(type(i) is int for i in flat)
        assert len(flat) == len(set(flat))
        sizes = sorted((len(b) for b in batches), reverse=True)
        if drop_last:
            assert set(sizes) <= {batch_size}
            assert len(flat) == n - n % batch_size
        else:
            assert sorted(flat) == list(range(n))
            assert sizes[:-1] == [batch_size] * (len(sizes) - 1)  # at most one short batch


@given(
    lengths=st.lists(st.integers(0, 100), min_size=1, max_size=200),
    batch_size=st.integers(1, 9),
    multiplier=st.integers(1, 5),
)
@settings(max_examples=60, deadline=None)
def test_without_shuffle_batches_are_sorted_within_each_pool(
    lengths: list[int], batch_size: int, multiplier: int
) -> None:
    arr = np.array(lengths)
    s = BucketBatchSampler(arr, batch_size, bucket_size_multiplier=multiplier, shuffle=False)
    batches = list(s)
    assert batches == list(s)  # no randomness at all
    pool_size = batch_size * multiplier
    flat = [i for b in batches for i in b]
    for start in range(0, len(flat), pool_size):
        pool = flat[start : start + pool_size]
        # the pool holds consecutive indices, sorted by length (stable on index)
        assert sorted(pool) == list(range(start, start + len(pool)))
        assert pool == sorted(pool, key=lambda i: (lengths[i], i))


def test_pads_far_less_than_random_batching_on_skewed_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(4.0, 1.0, 5000).astype(np.int64) + 1, 4000)
    bucketed = list(BucketBatchSampler(lengths, 32, bucket_size_multiplier=100, generator=0))
    random = list(BatchSampler(RandomSampler(lengths, generator=0), 32, False))
    waste_bucketed = _padding_waste(lengths, bucketed)
    waste_random = _padding_waste(lengths, random)
    assert waste_bucketed < 0.1 * waste_random, (waste_bucketed, waste_random)


def test_batches_change_from_epoch_to_epoch() -> None:
    lengths = np.arange(200) % 7
    s = BucketBatchSampler(lengths, 8, bucket_size_multiplier=5, generator=1)
    first, second = list(s), list(s)
    assert first != second
    assert sorted(map(sorted, first)) != sorted(map(sorted, second))  # composition too


def test_lengths_are_validated_naming_the_first_bad_index() -> None:
    with pytest.raises(ValueError, match=r"lengths must be non-negative, but lengths\[2\] is -1"):
        BucketBatchSampler([3, 4, -1, -7], 2)
    with pytest.raises(ValueError, match=r"but lengths\[1\] is -2"):
        BucketBatchSampler(np.array([0, -2]), 2)
    with pytest.raises(TypeError, match=r"ints, but lengths\[1\] is float: 2.5"):
        BucketBatchSampler([1, 2.5, 3], 2)
    with pytest.raises(TypeError, match=r"lengths\[0\] is str: 'long'"):
        BucketBatchSampler(["long", 3], 2)
    with pytest.raises(TypeError, match=r"lengths\[1\] is bool: True"):
        BucketBatchSampler([1, True], 2)
    with pytest.raises(ValueError, match=r"1-D sequence of ints, got an array of shape \(2, 1\)"):
        BucketBatchSampler([[1], [2]], 2)


def test_other_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match=r"batch_size must be a positive integer, got 0"):
        BucketBatchSampler([1, 2], 0)
    with pytest.raises(
        ValueError, match=r"bucket_size_multiplier must be a positive integer, got -1"
    ):
        BucketBatchSampler([1, 2], 1, bucket_size_multiplier=-1)
    with pytest.raises(TypeError, match=r"drop_last must be True or False, got str: 'no'"):
        BucketBatchSampler([1, 2], 1, drop_last="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"shuffle must be True or False, got int: 1"):
        BucketBatchSampler([1, 2], 1, shuffle=1)  # type: ignore[arg-type]


def test_empty_lengths_give_no_batches() -> None:
    s = BucketBatchSampler([], 4, generator=0)
    assert list(s) == []
    assert len(s) == 0
