"""``ShardSampler``: each rank reads whole shards of its own, block-shuffled."""

from __future__ import annotations

from collections.abc import Sequence, Sized
from typing import Any

import numpy as np

from stoker._validate import check_bool, check_int, is_int
from stoker.samplers._base import IndexSampler, as_int_array
from stoker.samplers.distributed import _resolve_topology

__all__ = ["ShardSampler"]


class ShardSampler(IndexSampler):
    """Rank ``rank`` of ``num_replicas`` reads whole shards, no other rank reading them.

    What it is for: a dataset stored in shards (a ``PackedDataset``, above all one at a
    URL, whose shards are downloaded whole) read by several ranks. ``DistributedSampler``
    deals single indices round-robin, so every rank reads, and downloads, nearly every
    shard. This sampler deals whole shards instead: each epoch the shards are shuffled
    (with ``seed`` and the epoch, the same on every rank) and dealt one by one to the
    rank with the fewest samples so far, so every sample is read exactly once per epoch,
    by one rank, and each shard is read by one rank only. Within a rank, its shards are
    read ``window`` at a time, the indices of each window shuffled together (a block
    shuffle whose blocks are the shards: the reads stay within ``window`` shards).

    Ranks may get different numbers of samples, since a shard is not split: with equal
    shards, and a shard count that ``num_replicas`` divides, they get the same number;
    otherwise they differ by up to a shard, and by epoch. ``len()`` is this rank's count
    in the epoch the next ``iter()`` reads. Code that needs the same number of batches on
    every rank (``DistributedDataParallel``) must stop each epoch at the smallest count
    (:meth:`min_len`), or use ``DistributedSampler``.

    Each epoch it tells a dataset that has ``set_shard_order`` (a ``PackedDataset``) this
    rank's shards in order, so a dataset at a URL prefetches the shards this rank reads
    next, never another rank's.

    Args:
        dataset: anything with ``__len__``; a ``PackedDataset`` gives its shards itself.
        shard_sizes: the number of samples in each shard, in index order (shard 0 holds
            indices ``0 .. shard_sizes[0] - 1``, and so on); default: from the dataset's
            manifest (a ``PackedDataset``). They must add up to ``len(dataset)``.
        num_replicas, rank: as for ``DistributedSampler`` (default from
            ``torch.distributed``, else the ``WORLD_SIZE`` / ``RANK`` variables).
        shuffle: shuffle the shards and the indices within windows every epoch
            (``False``: each rank reads its shards in order, front to back).
        seed: non-negative int, the same on every rank.
        window: shards whose indices are shuffled together.

    Example:
        >>> s = [ShardSampler(range(12), shard_sizes=[3] * 4, num_replicas=2, rank=r, seed=0)
        ...      for r in range(2)]
        >>> orders = [list(x) for x in s]
        >>> sorted(orders[0] + orders[1]) == list(range(12))
        True
        >>> [sorted({i // 3 for i in order}) for order in orders]  # whole shards each
        [[1, 2], [0, 3]]
    """

    def __init__(
        self,
        dataset: Sized,
        *,
        shard_sizes: Sequence[int] | None = None,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        window: int = 2,
    ) -> None:
        self.num_replicas, self.rank = _resolve_topology(num_replicas, rank)
        self.shuffle = check_bool("shuffle", shuffle)
        self.window = check_int("window", window, minimum=1)
        if not is_int(seed) or seed < 0:
            msg = f"seed must be a non-negative int, got {seed!r}"
            raise ValueError(msg)
        self.dataset = dataset
        if shard_sizes is None:
            shard_sizes = _shards_of(dataset)
        sizes = as_int_array("shard_sizes", shard_sizes, non_negative=True)
        total = int(sizes.sum())
        if total != len(dataset):
            msg = (
                f"shard_sizes add up to {total} samples but the dataset has {len(dataset)}; "
                "give one size per shard, in index order"
            )
            raise ValueError(msg)
        self.shard_sizes = sizes
        self._starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self._init_epoch_state(None, seeded=False)
        self._base_seed = int(seed)

    @property
    def seed(self) -> int:
        return self._base_seed  # type: ignore[return-value]

    def shards_for_epoch(self, epoch: int) -> list[list[int]]:
        """Every rank's shards in ``epoch``, in the order each reads them."""
        count = len(self.shard_sizes)
        order = self._rng(epoch).permutation(count) if self.shuffle else np.arange(count)
        dealt: list[list[int]] = [[] for _ in range(self.num_replicas)]
        samples = [0] * self.num_replicas
        for shard in order.tolist():
            rank = samples.index(min(samples))  # the fewest samples so far; ties: lowest rank
            dealt[rank].append(shard)
            samples[rank] += int(self.shard_sizes[shard])
        return dealt

    def _indices_for_epoch(self, epoch: int) -> np.ndarray:
        self._check_length()
        mine = self.shards_for_epoch(epoch)[self.rank]
        tell = getattr(self.dataset, "set_shard_order", None)
        if callable(tell):  # a dataset at a URL prefetches this rank's shards in this order
            tell(mine)
        rng = self._rng(epoch) if self.shuffle else None
        if rng is not None:
            rng.permutation(len(self.shard_sizes))  # the draw shards_for_epoch made
        parts = []
        for first in range(0, len(mine), self.window):
            window = [
                np.arange(self._starts[s], self._starts[s + 1], dtype=np.int64)
                for s in mine[first : first + self.window]
            ]
            indices = np.concatenate(window) if window else np.zeros(0, dtype=np.int64)
            if rng is not None:
                rng.shuffle(indices)
            parts.append(indices)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def _check_length(self) -> None:
        if len(self.dataset) != int(self._starts[-1]):
            msg = (
                f"the dataset had {int(self._starts[-1])} samples when the ShardSampler was "
                f"built and has {len(self.dataset)} now; build a new sampler after it changes"
            )
            raise ValueError(msg)

    def _counts(self, epoch: int) -> list[int]:
        return [
            int(sum(int(self.shard_sizes[s]) for s in shards))
            for shards in self.shards_for_epoch(epoch)
        ]

    def min_len(self) -> int:
        """The smallest rank's count in the epoch the next ``iter()`` reads."""
        return min(self._counts(self._epoch))

    def __len__(self) -> int:
        return self._counts(self._epoch)[self.rank]


def _shards_of(dataset: Any) -> list[int]:
    manifest = getattr(dataset, "manifest", None)
    shards = manifest.get("shards") if isinstance(manifest, dict) else None
    if not isinstance(shards, list):
        msg = (
            f"ShardSampler cannot tell the shards of a {type(dataset).__name__}: pass "
            "shard_sizes= (the samples in each shard, in index order)"
        )
        raise TypeError(msg)
    return [int(shard["records"]) for shard in shards]
