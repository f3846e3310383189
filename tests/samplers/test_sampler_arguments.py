"""Every sampler takes numpy integers and booleans wherever it takes Python ones, as torch does."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.samplers import (
    BatchSampler,
    BlockShuffleSampler,
    BucketBatchSampler,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    WeightedRandomSampler,
)

DATA = list(range(20))
LENGTHS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]


def _build(ints, bools):
    """One of each sampler, its integer arguments made by ``ints`` and booleans by ``bools``."""
    return {
        "random": RandomSampler(
            DATA, replacement=bools(True), num_samples=ints(7), generator=ints(1)
        ),
        "weighted": WeightedRandomSampler(
            [1.0] * 20, ints(5), replacement=bools(False), generator=ints(2)
        ),
        "batch": BatchSampler(SequentialSampler(DATA), ints(6), bools(True)),
        "block": BlockShuffleSampler(DATA, block_size=ints(4), window=ints(2), generator=ints(3)),
        "bucket": BucketBatchSampler(
            LENGTHS,
            ints(4),
            bucket_size_multiplier=ints(2),
            shuffle=bools(True),
            drop_last=bools(False),
            generator=ints(4),
        ),
        "distributed": DistributedSampler(
            DATA,
            num_replicas=ints(3),
            rank=ints(1),
            shuffle=bools(True),
            seed=ints(5),
            drop_last=bools(False),
        ),
    }


@pytest.mark.parametrize("kind", ["random", "weighted", "batch", "block", "bucket", "distributed"])
def test_numpy_integers_and_bools_give_the_same_sampler(kind) -> None:
    plain = _build(int, bool)[kind]
    numpy = _build(np.int64, np.bool_)[kind]
    for sampler in (plain, numpy):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(np.int64(2))
    assert list(numpy) == list(plain)
    assert len(numpy) == len(plain)
    for name in ("num_samples", "batch_size", "block_size", "window", "num_replicas", "rank"):
        if hasattr(numpy, name):
            assert type(getattr(numpy, name)) is int, name
