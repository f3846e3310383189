"""The storage settings take numpy integers and floats as Python's, and refuse bad values
with the message every stoker argument check gives, naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

from stoker.storage import Prefetcher, RetryPolicy, ShardCache, Storage


def test_numpy_scalars_are_taken_as_plain_numbers(tmp_path) -> None:
    storage = Storage(prefetch=np.int64(3), retries=np.int32(2))
    assert storage.prefetch == 3 and type(storage.prefetch) is int
    assert storage.retry.attempts == 2 and type(storage.retry.attempts) is int
    cache = ShardCache(tmp_path, max_bytes=np.uint32(1024))
    assert cache.max_bytes == 1024 and type(cache.max_bytes) is int
    policy = RetryPolicy(attempts=np.int64(4), base_delay_s=np.float32(0.25), max_delay_s=1)
    assert [policy.delay(n) for n in (1, 2, 3)] == [0.25, 0.5, 1.0]
    assert type(policy.base_delay_s) is float and type(policy.max_delay_s) is float
    prefetcher = Prefetcher([1, 2, 3], lambda n: n * 10, depth=np.int8(1))
    assert prefetcher.depth == 1 and type(prefetcher.depth) is int
    assert list(prefetcher) == [10, 20, 30]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda _: Storage(prefetch=-1),
            "prefetch must be a non-negative integer, got -1 (files downloaded ahead)",
        ),
        (
            lambda _: Storage(prefetch=2.0),
            "prefetch must be a non-negative integer, got 2.0 (files downloaded ahead)",
        ),
        (
            lambda folder: ShardCache(folder, max_bytes=True),
            "max_bytes must be a non-negative integer or None, got True",
        ),
        (
            lambda _: Prefetcher([1], str, depth=-2),
            "depth must be a non-negative integer, got -2 (items fetched ahead)",
        ),
        (lambda _: RetryPolicy(attempts=0), "attempts must be a positive integer, got 0"),
        (
            lambda _: RetryPolicy(base_delay_s=-0.5),
            "base_delay_s must be a non-negative number of seconds, got -0.5",
        ),
        (
            lambda _: RetryPolicy(max_delay_s=float("nan")),
            "max_delay_s must be a non-negative number of seconds, got nan",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_argument(tmp_path, make, message) -> None:
    with pytest.raises(ValueError) as caught:
        make(tmp_path)
    assert str(caught.value) == message
