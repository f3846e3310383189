"""Batches of samples of similar length from a stream: :class:`BucketStream`.

A map-style dataset can sort its lengths up front (:class:`stoker.BucketBatchSampler`);
a stream cannot, so :class:`BucketStream` forms batches on the fly from a bounded window:

* without ``boundaries`` it reads ``window`` samples, sorts them by ``key``, cuts the
  sorted run into batches of ``batch_size`` and yields those batches in a random order;
  the samples of a short last batch wait for the next window, so only the stream's end
  yields a short batch. Within a window the batches' key ranges do not overlap;
* with ``boundaries`` (sorted key limits, such as ``[64, 128, 256, 512]``) each sample
  goes to the bucket ``[b[i-1], b[i])`` holding its key, and a bucket yields a batch as
  soon as it holds ``batch_size`` samples. Every batch's keys lie within one bucket. When
  ``window`` samples wait in the buckets, the fullest bucket yields a short batch, so at
  most ``window`` samples are ever held.

Each sample is yielded exactly once, in a batch that is a plain list of samples (no
indices). Give it to the loader with ``batch_size=None`` and a padding collate::

    loader = DataLoader(BucketStream(stream, 32, key=lambda s: len(s["input_ids"])),
                        batch_size=None, collate_fn=stoker.pad_collate, num_workers=2)

With ``batch_size=None`` the loader hands each yielded list to ``collate_fn`` as one batch.
With workers each worker buckets its own shard of the stream.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from stoker._validate import check_int, check_optional_int
from stoker.datasets import IterableDataset
from stoker.sharding import current_shard
from stoker.streams.shuffle import buffer_rng

__all__ = ["BucketStream"]

_DEFAULT_WINDOW_BATCHES = 32


def _check_boundaries(boundaries: Sequence[float] | None) -> list[float] | None:
    if boundaries is None:
        return None
    values = list(boundaries)
    if not values or any(later <= earlier for earlier, later in itertools.pairwise(values)):
        msg = (
            f"boundaries must be a non-empty, strictly increasing list of keys, got {boundaries!r}"
        )
        raise ValueError(msg)
    return values


class BucketStream(IterableDataset[list[Any]]):
    """Yields batches (lists) of samples of similar ``key`` from an iterable dataset.

    Args:
        dataset: the iterable dataset (a stream reader, a :class:`ShuffleBuffer`, ...).
        batch_size: samples per batch.
        key: the length of a sample (default ``len``).
        window: the most samples held at once; default ``32 * batch_size``. Larger
            windows pad less and hold more memory.
        boundaries: bucket limits; ``None`` sorts each window instead (see module docs).
        drop_last: leave out the short batches that the stream's end leaves.
        seed: orders the batches of a window; ``None`` follows the loader's epoch seed
            (0 outside a loader).

    Example:
        >>> from stoker import IterableDataset
        >>> class Words(IterableDataset):
        ...     def __iter__(self):
        ...         return iter(["a", "bbbb", "cc", "dddd", "e", "ff"])
        >>> batches = list(BucketStream(Words(), 2, window=6, seed=0))
        >>> sorted(sorted(len(w) for w in b) for b in batches)
        [[1, 1], [2, 2], [4, 4]]
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        key: Callable[[Any], float] = len,
        window: int | None = None,
        boundaries: Sequence[float] | None = None,
        drop_last: bool = False,
        seed: int | None = None,
    ) -> None:
        if not hasattr(dataset, "__iter__"):
            msg = (
                "BucketStream takes an iterable dataset (with __iter__), got "
                f"{type(dataset).__name__}"
            )
            raise TypeError(msg)
        if not callable(key):
            msg = f"key must be a function of a sample that returns its length, got {key!r}"
            raise TypeError(msg)
        self.dataset = dataset
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        window = check_optional_int("window", window, minimum=1)
        self.window = _DEFAULT_WINDOW_BATCHES * self.batch_size if window is None else window
        if self.window < self.batch_size:
            msg = f"window ({self.window}) must hold at least one batch ({self.batch_size} samples)"
            raise ValueError(msg)
        self.key = key
        self.boundaries = _check_boundaries(boundaries)
        self.drop_last = bool(drop_last)
        self.seed = check_optional_int("seed", seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Sets the epoch (passed on to the dataset) whose batch order the next iteration uses."""
        self.epoch = check_int("epoch", epoch)
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def __iter__(self) -> Iterator[list[Any]]:
        shard = current_shard(
            rank=getattr(self.dataset, "rank", None),
            world_size=getattr(self.dataset, "world_size", None),
        )
        rng = buffer_rng(self.seed, 0, self.epoch, shard[0])
        source = iter(self.dataset)
        if self.boundaries is None:
            return self._sorted_windows(source, rng)
        return self._buckets(source, self.boundaries)

    def _sorted_windows(self, source: Iterator[Any], rng: Any) -> Iterator[list[Any]]:
        size, key, held = self.batch_size, self.key, []
        ended = False
        while not ended:
            for sample in source:
                held.append(sample)
                if len(held) >= self.window:
                    break
            else:
                ended = True
            held.sort(key=key)
            full = len(held) // size * size
            batches = [held[i : i + size] for i in range(0, full, size)]
            held = held[full:]
            for j in rng.permutation(len(batches)).tolist():
                yield batches[j]
        if held and not self.drop_last:
            yield held

    def _buckets(self, source: Iterator[Any], boundaries: list[float]) -> Iterator[list[Any]]:
        size, key = self.batch_size, self.key
        buckets: list[list[Any]] = [[] for _ in range(len(boundaries) + 1)]
        held = 0
        for sample in source:
            bucket = buckets[bisect.bisect_right(boundaries, key(sample))]
            bucket.append(sample)
            held += 1
            if len(bucket) == size:
                yield bucket[:]
                bucket.clear()
                held -= size
            elif held >= self.window:
                fullest = max(buckets, key=len)
                held -= len(fullest)
                yield fullest[:]
                fullest.clear()
        for bucket in buckets:
            if bucket and not self.drop_last:
                yield bucket

    def __repr__(self) -> str:
        return f"BucketStream({self.dataset!r}, batch_size={self.batch_size}, window={self.window})"
