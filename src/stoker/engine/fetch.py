"""Fetchers: from an index batch (map-style) or a stream (iterable) to a collated batch.

The same fetcher runs in the main process (``num_workers=0``) and inside each worker,
so the two paths cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["IterableFetcher", "MapFetcher"]


class MapFetcher:
    """Fetches the samples of one index batch and collates them.

    A dataset with a ``__getitems__`` method is asked for the whole batch at once
    (torch's rule: the attribute must exist and be truthy).
    """

    __slots__ = ("_collate", "_dataset", "_getitems", "auto_collation")

    def __init__(self, dataset: Any, auto_collation: bool, collate_fn: Callable[[Any], Any]):
        self._dataset = dataset
        self._collate = collate_fn
        self.auto_collation = auto_collation
        getitems = getattr(dataset, "__getitems__", None)
        self._getitems = getitems if getitems else None

    def fetch(self, index: Any) -> Any:
        """Returns the collated batch for ``index`` (a list of indices when batching)."""
        if not self.auto_collation:
            return self._collate(self._dataset[index])
        if self._getitems is not None:
            return self._collate(self._getitems(index))
        dataset = self._dataset
        return self._collate([dataset[i] for i in index])


class IterableFetcher:
    """Pulls ``batch_size`` samples from an iterable dataset's stream and collates them.

    The last, short batch is kept unless ``drop_last``; an exhausted stream raises
    ``StopIteration`` from :meth:`fetch`.
    """

    __slots__ = ("_collate", "_drop_last", "_ended", "_iterator", "batch_size")

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None,
        collate_fn: Callable[[Any], Any],
        drop_last: bool,
    ):
        self._iterator: Iterator[Any] = iter(dataset)
        self._collate = collate_fn
        self._drop_last = drop_last
        self._ended = False
        self.batch_size = batch_size

    def fetch(self) -> Any:
        if self._ended:
            raise StopIteration
        if self.batch_size is None:
            return self._collate(next(self._iterator))
        data: list[Any] = []
        iterator = self._iterator
        for _ in range(self.batch_size):
            try:
                data.append(next(iterator))
            except StopIteration:
                self._ended = True
                break
        if not data or (self._drop_last and len(data) < self.batch_size):
            raise StopIteration
        return self._collate(data)

