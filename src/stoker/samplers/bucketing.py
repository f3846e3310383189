"""``BucketBatchSampler``: batches of similar length, to waste little padding."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from stoker._validate import check_bool, check_int
from stoker.samplers._base import EpochState, Randomized, Sampler, as_int_array

__all__ = ["BucketBatchSampler"]


class BucketBatchSampler(Randomized, EpochState, Sampler[list[int]]):
    """Yields batches of indices whose samples have similar lengths.

    Each epoch: shuffle all indices, cut them into pools of
    ``batch_size * bucket_size_multiplier``, sort each pool by length (ties keep the
    shuffled order), cut the pools into batches, and shuffle the order of the batches.
    Every index appears exactly once per epoch (except the one short batch when
    ``drop_last=True``). Batches then hold samples of similar length, so padding each
    batch to its longest sample wastes far less than random batching, while the pool
    shuffle keeps batch composition random from epoch to epoch. A larger multiplier
    pads less and randomises less.

    Pass it to a loader as ``batch_sampler=``.

    Args:
        lengths: a 1-D sequence of non-negative ints, ``lengths[i]`` being sample
            ``i``'s length (tokens, frames, ...).
        batch_size: indices per batch.
        bucket_size_multiplier: pool size in batches.
        shuffle: shuffle before pooling and shuffle the batch order; with ``False``
            pools are consecutive indices and batches come in pool order.
        drop_last: drop the batch with fewer than ``batch_size`` indices, if any.
        generator: ``None``, an int seed, a ``numpy.random.Generator`` (epoch ``e``'s
            batches are then a pure function of the seed and ``e``) or a
            ``torch.Generator`` (one seed is drawn from it per epoch).

    Example:
        >>> s = BucketBatchSampler([5, 1, 4, 2, 3, 1], batch_size=2, generator=0)
        >>> sorted(sorted(s.lengths[b].tolist()) for b in s)
        [[1, 1], [2, 3], [4, 5]]
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        bucket_size_multiplier: int = 100,
        shuffle: bool = True,
        drop_last: bool = False,
        generator: Any = None,
    ) -> None:
        self.lengths = as_int_array("lengths", lengths, non_negative=True)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.bucket_size_multiplier = check_int(
            "bucket_size_multiplier", bucket_size_multiplier, minimum=1
        )
        self.shuffle = check_bool("shuffle", shuffle)
        self.drop_last = check_bool("drop_last", drop_last)
        self._init_epoch_state(generator, seeded=shuffle)

    def _epoch_batches(self) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, starts)`` of the next epoch; advances the epoch.

        Batch ``k`` of the epoch is ``indices[starts[k] : starts[k] + batch_size]``.
        """
        epoch = self._next_epoch()
        n = len(self.lengths)
        batch_size = self.batch_size
        rng = self._rng(epoch) if self.shuffle else None
        order = rng.permutation(n) if rng is not None else np.arange(n, dtype=np.int64)
        # Pools are whole multiples of batch_size, so cutting the pool-sorted order
        # every batch_size never makes a batch straddle two pools.
        pool = np.arange(n) // (batch_size * self.bucket_size_multiplier)
        indices = order[np.lexsort((self.lengths[order], pool))].astype(np.int64, copy=False)
        num_batches = len(self)
        starts = np.arange(num_batches, dtype=np.int64) * batch_size
        if rng is not None:
            starts = rng.permutation(starts)
        return indices, starts

    def __iter__(self) -> Iterator[list[int]]:
        indices, starts = self._epoch_batches()
        return self._iter_batches(indices, starts)

    def _iter_batches(self, indices: np.ndarray, starts: np.ndarray) -> Iterator[list[int]]:
        batch_size = self.batch_size
        for start in starts.tolist():
            yield indices[start : start + batch_size].tolist()

    def __len__(self) -> int:
        n = len(self.lengths)
        if self.drop_last:
            return n // self.batch_size
        return -(-n // self.batch_size)
