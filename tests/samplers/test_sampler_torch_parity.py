"""Real torch as the oracle: stoker's samplers yield what torch's yield."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.samplers import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

torch = pytest.importorskip("torch", reason="torch is the oracle for these parity tests")
tud = torch.utils.data


def _assert_same_with_same_generator(
    make_torch: Callable[[Any], Any], make_stoker: Callable[[Any], Any], seed: int, epochs: int = 3
) -> None:
    g_torch = torch.Generator().manual_seed(seed)
    g_stoker = torch.Generator().manual_seed(seed)
    t, s = make_torch(g_torch), make_stoker(g_stoker)
    for _ in range(epochs):
        assert list(s) == list(t)
    # ... and the generators advanced by exactly the same draws.
    assert torch.equal(g_torch.get_state(), g_stoker.get_state())


@given(
    n=st.integers(1, 70),
    num_samples=st.one_of(st.none(), st.integers(1, 200)),
    replacement=st.booleans(),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=60, deadline=None)
def test_random_sampler_equals_torch(
    n: int, num_samples: int | None, replacement: bool, seed: int
) -> None:
    _assert_same_with_same_generator(
        lambda g: tud.RandomSampler(range(n), replacement, num_samples, generator=g),
        lambda g: RandomSampler(range(n), replacement, num_samples, generator=g),
        seed,
    )


@pytest.mark.parametrize("num_samples", [1, 31, 32, 33, 64, 100])
def test_random_sampler_with_replacement_equals_torch_around_chunk_boundaries(
    num_samples: int,
) -> None:
    _assert_same_with_same_generator(
        lambda g: tud.RandomSampler(range(7), True, num_samples, generator=g),
        lambda g: RandomSampler(range(7), True, num_samples, generator=g),
        seed=3,
    )


@given(indices=st.lists(st.integers(0, 1000), max_size=60), seed=st.integers(0, 2**32))
@settings(max_examples=40, deadline=None)
def test_subset_random_sampler_equals_torch(indices: list[int], seed: int) -> None:
    _assert_same_with_same_generator(
        lambda g: tud.SubsetRandomSampler(indices, generator=g),
        lambda g: SubsetRandomSampler(indices, generator=g),
        seed,
    )


@given(
    weights=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=40).filter(
        lambda w: sum(1 for x in w if x > 0) >= 3
    ),
    replacement=st.booleans(),
    num_samples=st.integers(1, 3),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=40, deadline=None)
def test_weighted_random_sampler_equals_torch(
    weights: list[float], replacement: bool, num_samples: int, seed: int
) -> None:
    k = num_samples if not replacement else num_samples * 17
    _assert_same_with_same_generator(
        lambda g: tud.WeightedRandomSampler(weights, k, replacement, generator=g),
        lambda g: WeightedRandomSampler(weights, k, replacement, generator=g),
        seed,
    )


@pytest.mark.parametrize("n", [0, 1, 9])
def test_sequential_sampler_equals_torch(n: int) -> None:
    assert list(SequentialSampler(range(n))) == list(tud.SequentialSampler(range(n)))
    assert len(SequentialSampler(range(n))) == len(tud.SequentialSampler(range(n)))


@given(n=st.integers(0, 60), batch_size=st.integers(1, 20), drop_last=st.booleans())
@settings(max_examples=60, deadline=None)
def test_batch_sampler_equals_torch(n: int, batch_size: int, drop_last: bool) -> None:
    expected = list(tud.BatchSampler(tud.SequentialSampler(range(n)), batch_size, drop_last))
    fast = BatchSampler(SequentialSampler(range(n)), batch_size, drop_last)
    general = BatchSampler(range(n), batch_size, drop_last)
    over_torch_sampler = BatchSampler(tud.SequentialSampler(range(n)), batch_size, drop_last)
    for ours in (fast, general, over_torch_sampler):
        assert list(ours) == expected
        assert len(ours) == len(expected)


@given(n=st.integers(1, 60), batch_size=st.integers(1, 20), drop_last=st.booleans())
@settings(max_examples=40, deadline=None)
def test_batch_of_random_sampler_equals_torch(n: int, batch_size: int, drop_last: bool) -> None:
    _assert_same_with_same_generator(
        lambda g: tud.BatchSampler(tud.RandomSampler(range(n), generator=g), batch_size, drop_last),
        lambda g: BatchSampler(RandomSampler(range(n), generator=g), batch_size, drop_last),
        seed=n * 100 + batch_size,
    )


@given(
    n=st.integers(0, 60),
    num_replicas=st.integers(1, 9),
    data=st.data(),
    drop_last=st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_distributed_sampler_without_shuffle_equals_torch(
    n: int, num_replicas: int, data: st.DataObject, drop_last: bool
) -> None:
    rank = data.draw(st.integers(0, num_replicas - 1))
    theirs = tud.DistributedSampler(
        range(n), num_replicas, rank, shuffle=False, drop_last=drop_last
    )
    ours = DistributedSampler(range(n), num_replicas, rank, shuffle=False, drop_last=drop_last)
    assert list(ours) == list(theirs)
    assert len(ours) == len(theirs)
    assert (ours.num_samples, ours.total_size) == (theirs.num_samples, theirs.total_size)


def test_stoker_batch_sampler_drives_a_torch_data_loader() -> None:
    data = list(range(23))
    loader = tud.DataLoader(
        data, batch_sampler=BatchSampler(RandomSampler(data, generator=0), 5, False)
    )
    batches = [b.tolist() for b in loader]
    assert sorted(i for b in batches for i in b) == data
    assert [len(b) for b in batches] == [5, 5, 5, 5, 3]
