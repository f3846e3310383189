"""SequentialSampler, RandomSampler, SubsetRandomSampler and WeightedRandomSampler."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.samplers import (
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

SEEDS = st.integers(min_value=0, max_value=2**63 - 1)


# ---- argument checks -------------------------------------------------------------------


def test_random_sampler_rejects_non_bool_replacement() -> None:
    with pytest.raises(TypeError, match=r"replacement must be True or False, got int: 1"):
        RandomSampler(range(3), replacement=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -2, 2.5, True, "3"])
def test_random_sampler_rejects_bad_num_samples(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"num_samples must be a positive integer, got {bad!r}"):
        RandomSampler(range(3), num_samples=bad)  # type: ignore[arg-type]


def test_random_sampler_rejects_empty_data_source() -> None:
    with pytest.raises(ValueError, match=r"needs a non-empty data_source .* length, which is 0"):
        RandomSampler([])


def test_random_sampler_with_num_samples_fails_clearly_when_data_source_empties() -> None:
    data: list[int] = [1, 2]
    s = RandomSampler(data, num_samples=4, generator=0)
    data.clear()
    with pytest.raises(ValueError, match=r"cannot draw 4 samples from an empty data_source"):
        iter(s)


@pytest.mark.parametrize("bad", ["x", 1.5, True, -1])
def test_generator_argument_is_checked(bad: object) -> None:
    with pytest.raises((TypeError, ValueError), match=r"generator must be"):
        RandomSampler(range(3), generator=bad)


def test_subset_random_sampler_rejects_non_int_indices_naming_the_first() -> None:
    with pytest.raises(TypeError, match=r"indices must be ints, but indices\[2\] is str: 'a'"):
        SubsetRandomSampler([1, 2, "a", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"indices\[1\] is float: 1.5"):
        SubsetRandomSampler([0, 1.5])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"1-D sequence of ints, got an array of shape \(2, 2\)"):
        SubsetRandomSampler([[0, 1], [2, 3]])  # type: ignore[list-item]


def test_weighted_sampler_argument_checks() -> None:
    with pytest.raises(ValueError, match=r"num_samples must be a positive integer, got 0"):
        WeightedRandomSampler([1.0], 0)
    with pytest.raises(ValueError, match=r"replacement must be True or False, got str: 'no'"):
        WeightedRandomSampler([1.0], 1, replacement="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"weights must be a 1-D sequence, got weights of shape"):
        WeightedRandomSampler([[1.0, 2.0]], 1)
    with pytest.raises(ValueError, match=r"non-negative, but weights\[1\] is -0.5"):
        WeightedRandomSampler([1.0, -0.5], 1)
    with pytest.raises(ValueError, match=r"finite and non-negative, but weights\[2\] is nan"):
        WeightedRandomSampler([1.0, 1.0, float("nan")], 1)
    with pytest.raises(ValueError, match=r"at least one positive weight"):
        WeightedRandomSampler([0.0, 0.0], 1)
    with pytest.raises(ValueError, match=r"at most the number of positive weights \(2\), got "):
        WeightedRandomSampler([1.0, 0.0, 2.0], 3, replacement=False)
    with pytest.raises(TypeError, match=r"weights must be a 1-D sequence of numbers"):
        WeightedRandomSampler(["a", "b"], 1)  # type: ignore[list-item]


# ---- what is yielded -------------------------------------------------------------------


@given(n=st.integers(0, 300))
@settings(max_examples=30, deadline=None)
def test_sequential_sampler_yields_range(n: int) -> None:
    s = SequentialSampler(range(n))
    first = list(s)
    assert first == list(range(n))
    assert list(s) == first  # every epoch the same
    assert len(s) == n
    assert all(type(i) is int for i in first)


@given(n=st.integers(1, 300), seed=SEEDS)
@settings(max_examples=60, deadline=None)
def test_random_sampler_without_replacement_is_a_permutation(n: int, seed: int) -> None:
    s = RandomSampler(range(n), generator=seed)
    for _ in range(2):
        order = list(s)
        assert sorted(order) == list(range(n))
        assert len(order) == len(s)
        assert all(type(i) is int for i in order)


@given(n=st.integers(1, 40), num_samples=st.integers(1, 150), seed=SEEDS)
@settings(max_examples=60, deadline=None)
def test_random_sampler_num_samples_concatenates_permutations(
    n: int, num_samples: int, seed: int
) -> None:
    order = list(RandomSampler(range(n), num_samples=num_samples, generator=seed))
    assert len(order) == num_samples
    for start in range(0, num_samples, n):
        chunk = order[start : start + n]
        assert len(set(chunk)) == len(chunk)  # each full or partial permutation is distinct
        assert set(chunk) <= set(range(n))


@given(n=st.integers(1, 50), num_samples=st.integers(1, 200), seed=SEEDS)
@settings(max_examples=40, deadline=None)
def test_random_sampler_with_replacement_stays_in_range(
    n: int, num_samples: int, seed: int
) -> None:
    s = RandomSampler(range(n), replacement=True, num_samples=num_samples, generator=seed)
    order = list(s)
    assert len(order) == len(s) == num_samples
    assert all(0 <= i < n for i in order)


def test_random_sampler_with_replacement_repeats_indices() -> None:
    order = list(RandomSampler(range(10), replacement=True, num_samples=200, generator=1))
    assert len(set(order)) == 10  # 200 draws from 10 cover all of them and repeat them


def test_random_sampler_reads_length_at_every_epoch() -> None:
    data = list(range(5))
    s = RandomSampler(data, generator=0)
    assert sorted(s) == list(range(5))
    data.extend([5, 6])
    assert len(s) == 7
    assert sorted(s) == list(range(7))


@given(indices=st.lists(st.integers(-5, 10**6), max_size=100, unique=True), seed=SEEDS)
@settings(max_examples=50, deadline=None)
def test_subset_random_sampler_is_a_permutation_of_its_indices(
    indices: list[int], seed: int
) -> None:
    s = SubsetRandomSampler(indices, generator=seed)
    order = list(s)
    assert sorted(order) == sorted(indices)
    assert len(s) == len(indices)
    assert s.indices is indices


def test_subset_random_sampler_accepts_range_and_array() -> None:
    assert sorted(SubsetRandomSampler(range(3, 9), generator=0)) == list(range(3, 9))
    assert sorted(SubsetRandomSampler(np.array([7, 2], dtype=np.uint8), generator=0)) == [2, 7]


def test_weighted_sampler_never_draws_zero_weights_and_follows_weights() -> None:
    s = WeightedRandomSampler([0.0, 1.0, 3.0, 0.0], num_samples=20_000, generator=5)
    order = np.array(list(s))
    counts = np.bincount(order, minlength=4)
    assert counts[0] == counts[3] == 0
    assert abs(counts[2] / counts[1] - 3.0) < 0.25


@given(
    weights=st.lists(st.floats(0.0, 10.0), min_size=1, max_size=30).filter(
        lambda w: sum(1 for x in w if x > 0) >= 1
    ),
    seed=SEEDS,
    data=st.data(),
)
@settings(max_examples=50, deadline=None)
def test_weighted_sampler_without_replacement_draws_distinct_positive_indices(
    weights: list[float], seed: int, data: st.DataObject
) -> None:
    positive = [i for i, w in enumerate(weights) if w > 0]
    k = data.draw(st.integers(1, len(positive)))
    order = list(WeightedRandomSampler(weights, k, replacement=False, generator=seed))
    assert len(order) == k
    assert len(set(order)) == k
    assert set(order) <= set(positive)


def test_weighted_sampler_without_replacement_first_draw_follows_weights() -> None:
    # Successive sampling: the first index is drawn with probability w_i / sum(w).
    s = WeightedRandomSampler([1.0, 2.0, 7.0], num_samples=2, replacement=False, generator=0)
    firsts = np.bincount([next(iter(s)) for _ in range(6000)], minlength=3) / 6000
    np.testing.assert_allclose(firsts, [0.1, 0.2, 0.7], atol=0.03)


# ---- seeding ---------------------------------------------------------------------------


def test_int_numpy_and_none_generators_are_reproducible() -> None:
    a = RandomSampler(range(100), generator=7)
    b = RandomSampler(range(100), generator=7)
    assert [list(a) for _ in range(3)] == [list(b) for _ in range(3)]

    c = RandomSampler(range(100), generator=np.random.default_rng(3))
    d = RandomSampler(range(100), generator=np.random.default_rng(3))
    assert list(c) == list(d)

    np.random.seed(11)
    first = list(RandomSampler(range(100)))
    np.random.seed(11)
    assert list(RandomSampler(range(100))) == first


def test_building_a_sampler_without_a_generator_draws_nothing_yet() -> None:
    """The seed is drawn at the first epoch, so code between construction and iteration
    gets the same global random numbers as without the sampler."""
    np.random.seed(5)
    RandomSampler(range(100))
    after = np.random.rand()
    np.random.seed(5)
    assert np.random.rand() == after
    assert list(RandomSampler(range(100), generator=8)) != list(
        RandomSampler(range(100), generator=7)
    )


def test_numpy_generator_seed_is_drawn_once_at_construction() -> None:
    rng = np.random.default_rng(0)
    s = RandomSampler(range(50), generator=rng)
    rng.integers(0, 10, size=100)  # advancing the user's rng later changes nothing
    s.set_epoch(0)
    first = list(s)
    s.set_epoch(0)
    assert list(s) == first
