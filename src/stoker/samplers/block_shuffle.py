"""``BlockShuffleSampler``: a shuffle that keeps reads close together on disk."""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

import numpy as np

from stoker._validate import check_int
from stoker.samplers._base import IndexSampler, Randomized

__all__ = ["BlockShuffleSampler"]

# Windows at least this long are shuffled one by one in place; shorter ones in one
# vectorised sort (a Python loop over a million tiny windows would be slow).
_LOOP_MIN_WINDOW_LEN = 64


class BlockShuffleSampler(Randomized, IndexSampler):
    """Shuffles blocks of consecutive indices, then indices within windows of blocks.

    What it is for: a fully random order over data stored contiguously (packed
    shards, a memory-mapped array, a file on a network file system) turns every read
    into a seek to a random place, which defeats the OS page cache and readahead and
    touches the whole file at once. This sampler trades some randomness for
    locality: the dataset is cut into blocks of ``block_size`` consecutive indices;
    each epoch the order of the blocks is shuffled, the shuffled blocks are grouped
    ``window`` at a time, and the indices inside each window are shuffled. At any
    moment the reads fall in at most ``window`` blocks, so the working set is about
    ``window * block_size`` samples and each block is read once, in full, per epoch.

    Every index appears exactly once per epoch. Choose ``block_size`` so that a block
    is a few megabytes of data, and ``window`` large enough that batches (drawn from
    one or two windows) mix samples from several blocks.

    Args:
        data_source: anything with ``__len__``; its length is read at every ``iter()``.
        block_size: consecutive indices per block (the last block may be shorter).
        window: blocks whose indices are shuffled together.
        generator: ``None``, an int seed, a ``numpy.random.Generator`` (epoch ``e``'s
            order is then a pure function of the seed and ``e``) or a
            ``torch.Generator`` (one seed is drawn from it per epoch).

    Example:
        >>> s = BlockShuffleSampler(range(12), block_size=3, window=2, generator=0)
        >>> order = list(s)
        >>> sorted(order) == list(range(12))
        True
        >>> len({i // 3 for i in order[:6]})  # the first window spans two blocks
        2
    """

    def __init__(
        self,
        data_source: Sized,
        block_size: int,
        *,
        window: int = 4,
        generator: Any = None,
    ) -> None:
        self.data_source = data_source
        self.block_size = check_int("block_size", block_size, minimum=1)
        self.window = check_int("window", window, minimum=1)
        self._init_epoch_state(generator)

    def _indices_for_epoch(self, epoch: int) -> np.ndarray:
        n = len(self.data_source)
        block_size = self.block_size
        rng = self._rng(epoch)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        block_starts = rng.permutation(-(-n // block_size)) * block_size
        block_lens = np.minimum(block_size, n - block_starts)
        out_starts = np.cumsum(block_lens) - block_lens
        # Block k of the shuffled order lands at out_starts[k]: shift each run of
        # positions by (its block's start - where it lands).
        indices = np.arange(n, dtype=np.int64) + np.repeat(block_starts - out_starts, block_lens)
        window_starts = out_starts[:: self.window]
        if block_size * self.window >= _LOOP_MIN_WINDOW_LEN:
            window_ends = np.append(window_starts[1:], n)
            for start, end in zip(window_starts.tolist(), window_ends.tolist(), strict=True):
                rng.shuffle(indices[start:end])
            return indices
        window_id = np.zeros(n, dtype=np.int64)
        window_id[window_starts[1:]] = 1
        np.cumsum(window_id, out=window_id)
        return indices[np.lexsort((rng.random(n), window_id))]

    def __len__(self) -> int:
        return len(self.data_source)
