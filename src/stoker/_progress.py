"""Epochs and resumable progress: what ``DataLoader.state_dict()`` is made of.

The loader owns the epoch counter. At the start of every epoch it tells the sampler
(``set_epoch``; stoker's samplers also advance by themselves) and records the sampler's
and generator's state *before* anything draws from them. While the epoch runs, the
iterator counts the batches it has handed out. A state is therefore small and needs no
buffered batch: ``{epoch, batches handed out, seeds, the sampler's epoch-start state}``.
Restoring it re-creates the epoch's index order and skips the batches already handed out
without loading them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STATE_VERSION", "Progress", "epoch_owner", "skip_batches"]

STATE_VERSION = 1


@dataclass(slots=True)
class Progress:
    """Where the current epoch stands; shared by the loader and its live iterator."""

    epoch: int
    seed: int
    start: dict[str, Any] = field(default_factory=dict)
    yielded: int = 0
    done: bool = False
    samples: int = 0  # an iterable dataset's samples drawn this epoch (its random positions)


def epoch_owner(index_sampler: Any) -> Any:
    """The sampler that takes ``set_epoch``: the index sampler or the one it wraps."""
    for candidate in (index_sampler, getattr(index_sampler, "sampler", None)):
        if candidate is not None and callable(getattr(candidate, "set_epoch", None)) and hasattr(candidate, "epoch"):
            return candidate
    return None


def skip_batches(index_sampler: Any, skip: int, batched: bool) -> tuple[Iterator[Any], int]:
    """An iterator over the epoch's index batches from batch ``skip`` on.

    Returns it with the number of samples the skipped batches held (their positions).
    A BatchSampler over a stoker sampler slices instead of iterating.
    """
    iter_from = getattr(index_sampler, "iter_from", None)
    if skip and iter_from is not None:
        return iter_from(skip), skip * index_sampler.batch_size
    iterator = iter(index_sampler)
    if not skip:
        return iterator, 0
    skipped = list(itertools.islice(iterator, skip))
    positions = sum(len(batch) for batch in skipped) if batched else len(skipped)
    return iterator, positions
