"""BlockShuffleSampler: a full permutation whose reads stay within a window of blocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.samplers import BlockShuffleSampler


def _check_windows(order: list[int], n: int, block_size: int, window: int) -> int:
    """Parses ``order`` into windows; fails unless each is ``window`` whole blocks.

    Returns the number of windows. Every window but the last must consist of exactly
    ``window`` complete blocks (in any interleaving); the last may have fewer.
    """

    def block_len(b: int) -> int:
        return min(block_size, n - b * block_size)

    position = 0
    windows = 0
    while position < len(order):
        blocks: set[int] = set()
        needed = 0
        consumed = 0
        while position < len(order):
            b = order[position] // block_size
            if b not in blocks:
                blocks.add(b)
                needed += block_len(b)
                assert len(blocks) <= window, f"window {windows} touches more than {window} blocks"
            position += 1
            consumed += 1
            if len(blocks) == window and consumed == needed:
                break
        assert consumed == needed, f"window {windows} holds only part of its blocks"
        windows += 1
    return windows


@given(
    n=st.integers(0, 400),
    block_size=st.integers(1, 40),
    window=st.integers(1, 6),
    seed=st.integers(0, 2**40),
)
@settings(max_examples=150, deadline=None)
def test_each_index_once_and_reads_stay_within_window_blocks(
    n: int, block_size: int, window: int, seed: int
) -> None:
    s = BlockShuffleSampler(range(n), block_size, window=window, generator=seed)
    for _ in range(2):
        order = list(s)
        assert sorted(order) == list(range(n))
        assert len(order) == len(s)
        num_blocks = -(-n // block_size)
        assert _check_windows(order, n, block_size, window) == -(-num_blocks // window)


def test_the_checker_rejects_a_full_shuffle() -> None:
    order = np.random.default_rng(0).permutation(400).tolist()
    with pytest.raises(AssertionError, match=r"touches more than 2 blocks"):
        _check_windows(order, 400, 20, 2)


def test_block_order_and_within_window_order_both_change_between_epochs() -> None:
    s = BlockShuffleSampler(range(1000), 50, window=2, generator=3)
    first, second = list(s), list(s)
    assert first != second
    first_blocks = [i // 50 for i in first[::50]]
    second_blocks = [i // 50 for i in second[::50]]
    assert first_blocks != second_blocks


def test_indices_within_a_window_are_mixed() -> None:
    # Window 1: each block is shuffled in place, not left in order.
    order = list(BlockShuffleSampler(range(100), 100, window=1, generator=0))
    assert order != list(range(100))
    assert sorted(order) == list(range(100))


def test_the_small_window_path_and_the_loop_path_both_shuffle() -> None:
    # block_size * window < 64 takes the vectorised path, >= 64 the per-window loop.
    for block_size, window in ((3, 2), (16, 4)):
        s = BlockShuffleSampler(range(480), block_size, window=window, generator=5)
        order = list(s)
        assert sorted(order) == list(range(480))
        assert order != sorted(order)


def test_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match=r"block_size must be a positive integer, got 0"):
        BlockShuffleSampler(range(4), 0)
    with pytest.raises(ValueError, match=r"window must be a positive integer, got 2.0"):
        BlockShuffleSampler(range(4), 2, window=2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"generator must be an int seed"):
        BlockShuffleSampler(range(4), 2, generator="seed")
