"""``BatchSampler``: groups a sampler's indices into lists of ``batch_size``."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from stoker._validate import check_bool, check_int
from stoker.samplers._base import IndexSampler, Sampler

__all__ = ["BatchSampler"]


def _has_fast_path(sampler: object) -> bool:
    """True when ``sampler`` yields exactly what its ``_epoch_indices()`` returns.

    A subclass that overrides ``__iter__`` is served through ``iter()``, so its
    override is honoured.
    """
    return (
        callable(getattr(sampler, "_epoch_indices", None))
        and getattr(type(sampler), "__iter__", None) is IndexSampler.__iter__
    )


class BatchSampler(Sampler[list[int]]):
    """Wraps a sampler (or any iterable of indices) to yield lists of ``batch_size``.

    Over a stoker sampler the epoch's indices come as one numpy array and each batch
    is one slice of it turned into Python ints (hundreds of thousands of batches per
    second); any other iterable is batched the way ``torch.utils.data.BatchSampler``
    batches it. Either way the batches are the same.

    Args:
        sampler: a sampler or any iterable of indices.
        batch_size: indices per batch.
        drop_last: drop the last batch when it has fewer than ``batch_size`` indices.

    Example:
        >>> from stoker.samplers import SequentialSampler
        >>> list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False))
        [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
        >>> list(BatchSampler(range(10), batch_size=3, drop_last=True))
        [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    """

    def __init__(
        self,
        sampler: Sampler[int] | Iterable[int],
        batch_size: int,
        drop_last: bool,
    ) -> None:
        # Like torch: no isinstance check on sampler, since objects with __getitem__
        # are iterable without being collections.abc.Iterable.
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.drop_last = check_bool("drop_last", drop_last, error=ValueError)
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[int]]:
        if _has_fast_path(self.sampler):
            return self._iter_array(self.sampler._epoch_indices())  # type: ignore[union-attr]
        return self._iter_any(iter(self.sampler))

    def iter_from(self, first_batch: int) -> Iterator[list[int]]:
        """This epoch's batches from batch ``first_batch`` on (a resumed epoch).

        Over a stoker sampler the skipped batches are sliced away, not generated.
        """
        if _has_fast_path(self.sampler):
            return self._iter_array(self.sampler._epoch_indices(), first_batch)  # type: ignore[union-attr]
        return itertools.islice(self._iter_any(iter(self.sampler)), first_batch, None)

    def _iter_array(self, indices: np.ndarray, first_batch: int = 0) -> Iterator[list[int]]:
        batch_size = self.batch_size
        n = len(indices)
        stop = n - n % batch_size if self.drop_last else n
        for start in range(first_batch * batch_size, stop, batch_size):
            yield indices[start : start + batch_size].tolist()

    def _iter_any(self, sampler_iter: Iterator[Any]) -> Iterator[list[Any]]:
        # torch's two paths, unchanged: zip over one iterator for drop_last, islice otherwise.
        if self.drop_last:
            for group in zip(*([sampler_iter] * self.batch_size), strict=False):
                yield [*group]
        else:
            batch = [*itertools.islice(sampler_iter, self.batch_size)]
            while batch:
                yield batch
                batch = [*itertools.islice(sampler_iter, self.batch_size)]

    def __len__(self) -> int:
        n = len(self.sampler)  # type: ignore[arg-type]
        if self.drop_last:
            return n // self.batch_size
        return (n + self.batch_size - 1) // self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Forwards to the wrapped sampler's ``set_epoch``; a no-op when it has none."""
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """``{"type": "BatchSampler", "sampler": <the wrapped sampler's state or None>}``."""
        inner = getattr(self.sampler, "state_dict", None)
        return {"type": type(self).__name__, "sampler": inner() if inner is not None else None}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores the wrapped sampler from a dict saved by :meth:`state_dict`."""
        if not isinstance(state_dict, Mapping) or "sampler" not in state_dict:
            msg = (
                "BatchSampler.load_state_dict expects the dict returned by state_dict(), "
                f"got {type(state_dict).__name__}: {state_dict!r}"
            )
            raise ValueError(msg)
        inner_state = state_dict["sampler"]
        if inner_state is None:
            return
        load = getattr(self.sampler, "load_state_dict", None)
        if load is None:
            msg = (
                f"the state holds a sampler state, but the wrapped {type(self.sampler).__name__} "
                "has no load_state_dict; wrap the same kind of sampler that was saved"
            )
            raise ValueError(msg)
        load(inner_state)
