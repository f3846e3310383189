"""The contract every stoker sampler keeps: epochs, seeds and state_dict."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from stoker.samplers import (
    BatchSampler,
    BlockShuffleSampler,
    BucketBatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

_LENGTHS = [(i * 37) % 23 for i in range(60)]

# Each factory builds a sampler from a generator argument (None, int, numpy or torch).
FACTORIES: dict[str, Callable[[Any], Any]] = {
    "random": lambda g: RandomSampler(range(60), generator=g),
    "random_replacement": lambda g: RandomSampler(
        range(60), replacement=True, num_samples=70, generator=g
    ),
    "random_num_samples": lambda g: RandomSampler(range(25), num_samples=60, generator=g),
    "subset": lambda g: SubsetRandomSampler(list(range(0, 120, 2)), generator=g),
    "weighted": lambda g: WeightedRandomSampler(np.arange(1.0, 61.0), 60, generator=g),
    "weighted_no_replacement": lambda g: WeightedRandomSampler(
        np.arange(1.0, 61.0), 50, replacement=False, generator=g
    ),
    "block_shuffle": lambda g: BlockShuffleSampler(range(60), 4, window=2, generator=g),
    "block_shuffle_long_windows": lambda g: BlockShuffleSampler(
        range(600), 40, window=3, generator=g
    ),
    "bucket": lambda g: BucketBatchSampler(_LENGTHS, 4, bucket_size_multiplier=2, generator=g),
    "batch_of_random": lambda g: BatchSampler(RandomSampler(range(60), generator=g), 7, False),
}


def _epoch(sampler: Any) -> list[Any]:
    return [tuple(x) if isinstance(x, list) else x for x in sampler]


@pytest.fixture(params=sorted(FACTORIES))
def factory(request: pytest.FixtureRequest) -> Callable[[Any], Any]:
    return FACTORIES[request.param]


def test_same_int_seed_gives_same_epochs_and_epochs_differ(factory: Callable[[Any], Any]) -> None:
    a, b = factory(123), factory(123)
    epochs_a = [_epoch(a) for _ in range(3)]
    assert epochs_a == [_epoch(b) for _ in range(3)]
    assert epochs_a[0] != epochs_a[1] != epochs_a[2]
    assert _epoch(factory(124)) != epochs_a[0]


def test_epoch_is_a_pure_function_of_seed_and_epoch(factory: Callable[[Any], Any]) -> None:
    iterated = factory(5)
    epochs = [_epoch(iterated) for _ in range(5)]
    fresh = factory(5)
    fresh.set_epoch(3)  # the 4th iteration of another sampler with the same seed
    assert _epoch(fresh) == epochs[3]
    # set_epoch picks the epoch of the next iteration only; the one after is epoch + 1.
    assert _epoch(fresh) == epochs[4]
    counter = fresh.sampler if isinstance(fresh, BatchSampler) else fresh
    assert counter.epoch == 5


def factory_at(factory: Callable[[Any], Any], seed: int, epoch: int) -> Any:
    s = factory(seed)
    s.set_epoch(epoch)
    return s


def test_set_epoch_every_epoch_gives_that_epoch(factory: Callable[[Any], Any]) -> None:
    s = factory(9)
    s.set_epoch(2)
    second = _epoch(s)
    s.set_epoch(2)
    assert _epoch(s) == second
    s.set_epoch(0)
    assert _epoch(s) != second


def test_iter_takes_the_epoch_eagerly(factory: Callable[[Any], Any]) -> None:
    s = factory(1)
    first, second = iter(s), iter(s)  # two iterators, taken before reading either
    expected = factory(1)
    assert _epoch(second) == _epoch(factory_at(factory, 1, 1))
    assert _epoch(first) == _epoch(expected)


def test_len_matches_number_yielded(factory: Callable[[Any], Any]) -> None:
    s = factory(3)
    assert len(_epoch(s)) == len(s)


def test_numpy_generator_is_accepted_and_reproducible(factory: Callable[[Any], Any]) -> None:
    a = factory(np.random.default_rng(42))
    b = factory(np.random.default_rng(42))
    assert [_epoch(a) for _ in range(2)] == [_epoch(b) for _ in range(2)]


def test_none_generator_follows_numpy_global_seed(factory: Callable[[Any], Any]) -> None:
    """The seed is drawn from numpy's global RNG at the first epoch, not at construction."""
    np.random.seed(1234)
    first = _epoch(factory(None))
    a = factory(None)
    np.random.seed(1234)
    assert _epoch(a) == first


def test_state_dict_round_trip_resumes_the_next_epoch(factory: Callable[[Any], Any]) -> None:
    a = factory(None)
    _epoch(a)
    _epoch(a)
    state = a.state_dict()
    json.dumps(state)  # small and plain: ints and strings only, no index lists
    assert len(json.dumps(state)) < 200
    expected = [_epoch(a) for _ in range(2)]
    b = factory(None)  # another random base seed, replaced by the loaded one
    b.load_state_dict(state)
    assert [_epoch(b) for _ in range(2)] == expected


def test_torch_generator_is_accepted_and_state_round_trips(factory: Callable[[Any], Any]) -> None:
    torch = pytest.importorskip("torch", reason="torch.Generator support needs torch")
    a = factory(torch.Generator().manual_seed(7))
    b = factory(torch.Generator().manual_seed(7))
    assert [_epoch(a) for _ in range(2)] == [_epoch(b) for _ in range(2)]
    state = a.state_dict()
    expected = [_epoch(a) for _ in range(2)]
    c = factory(torch.Generator().manual_seed(999))
    c.load_state_dict(state)
    assert [_epoch(c) for _ in range(2)] == expected


def test_load_state_dict_rejects_mismatched_states() -> None:
    s = RandomSampler(range(5), generator=0)
    with pytest.raises(ValueError, match=r"saved by a BlockShuffleSampler; it cannot be loaded"):
        s.load_state_dict(BlockShuffleSampler(range(5), 2, generator=0).state_dict())
    with pytest.raises(ValueError, match=r"expects the dict returned by state_dict\(\), got list"):
        s.load_state_dict([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"epoch must be a non-negative integer, got -3"):
        s.load_state_dict({"type": "RandomSampler", "epoch": -3, "seed": 1})
    with pytest.raises(ValueError, match=r"uses an int seed, but the state has no 'seed'"):
        s.load_state_dict({"type": "RandomSampler", "epoch": 0})


def test_load_state_dict_rejects_int_seed_state_for_torch_generator() -> None:
    torch = pytest.importorskip("torch", reason="torch.Generator support needs torch")
    s = RandomSampler(range(5), generator=torch.Generator())
    with pytest.raises(ValueError, match=r"draws from a torch.Generator, but the state has no"):
        s.load_state_dict(RandomSampler(range(5), generator=3).state_dict())


def test_state_dict_contents() -> None:
    s = RandomSampler(range(5), generator=17)
    list(s)
    assert s.state_dict() == {"type": "RandomSampler", "epoch": 1, "seed": 17}
    assert s.base_seed == 17
    q = SequentialSampler(range(3))
    list(q)
    assert q.state_dict() == {"type": "SequentialSampler", "epoch": 1}
    q.load_state_dict({"type": "SequentialSampler", "epoch": 5})
    assert q.epoch == 5


@pytest.mark.parametrize("bad", [-1, 1.0, "2", True])
def test_set_epoch_rejects_bad_epochs(bad: object) -> None:
    s = RandomSampler(range(5), generator=0)
    with pytest.raises(ValueError, match=rf"epoch must be a non-negative integer, got {bad!r}"):
        s.set_epoch(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"epoch must be a non-negative integer"):
        s.epoch = bad  # type: ignore[assignment]


def test_epoch_attribute_reads_and_sets_the_next_epoch() -> None:
    s = RandomSampler(range(30), generator=4)
    assert s.epoch == 0
    list(s)
    assert s.epoch == 1
    s.epoch = 0  # torch code sets DistributedSampler.epoch directly
    t = RandomSampler(range(30), generator=4)
    assert list(s) == list(t)


def test_distributed_sampler_keeps_the_epoch_contract() -> None:
    a = DistributedSampler(range(50), num_replicas=3, rank=1, seed=8)
    epochs = [list(a) for _ in range(4)]
    assert epochs[0] != epochs[1]
    b = DistributedSampler(range(50), num_replicas=3, rank=1, seed=8)
    b.set_epoch(3)
    assert list(b) == epochs[3]
    state = b.state_dict()
    assert state == {"type": "DistributedSampler", "epoch": 4, "seed": 8}
    c = DistributedSampler(range(50), num_replicas=3, rank=1, seed=0)
    c.load_state_dict(state)
    assert c.seed == 8
    assert list(c) == list(b)
