"""A bounded prefetcher: the next ``depth`` items of a list fetched by background threads.

A reader iterating its shard list gets each shard's local copy in order while the next
``depth`` shards download, so the network works while the model computes. At most
``depth`` fetches run at once and at most ``depth + 1`` fetched values wait for the
consumer (the next one included), so memory and disk stay bounded. A fetch that
fails hands its exception to the consumer when it reaches that item, in order.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from stoker._validate import check_int

__all__ = ["Prefetcher"]

T = TypeVar("T")
R = TypeVar("R")


class Prefetcher(Generic[T, R]):
    """Fetches ``items`` in order, up to ``depth`` ahead of the consumer, in threads.

    Args:
        items: what to fetch, in the order it will be consumed.
        fetch: ``fetch(item)`` returns the fetched value (run in a background thread).
        depth: how many items may be fetched ahead of the one being consumed (0: fetch
            each when it is reached, in the consumer's thread).
        release: called on a fetched value nobody will consume (after :meth:`close`).

    :meth:`get` returns the value of the next item or raises its fetch's exception.
    :meth:`close` cancels what has not started and waits for what has.

    Example:
        >>> with Prefetcher([1, 2, 3], lambda x: x * 10, depth=2) as p:
        ...     [p.get() for _ in range(3)]
        [10, 20, 30]
    """

    def __init__(
        self,
        items: Sequence[T],
        fetch: Callable[[T], R],
        *,
        depth: int = 2,
        release: Callable[[R], None] | None = None,
    ) -> None:
        depth = check_int("depth", depth, hint="items fetched ahead")
        self.items = list(items)
        self.fetch = fetch
        self.depth = depth
        self.release = release
        self._next_submit = 0
        self._consumed = 0
        self._pending: collections.deque[concurrent.futures.Future[R]] = collections.deque()
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(depth, thread_name_prefix="stoker-prefetch")
            if depth > 0 and len(self.items) > 1
            else None
        )
        self._fill()

    def _fill(self) -> None:
        if self._pool is None:
            return
        while self._next_submit < len(self.items) and len(self._pending) < self.depth + 1:
            item = self.items[self._next_submit]
            self._pending.append(self._pool.submit(self.fetch, item))
            self._next_submit += 1

    def __len__(self) -> int:
        return len(self.items)

    def get(self) -> R:
        """The next item's fetched value (waits for it); raises its fetch's error."""
        if self._consumed >= len(self.items):
            raise IndexError("every item was consumed")
        index = self._consumed
        self._consumed += 1
        if self._pool is None:
            return self.fetch(self.items[index])
        future = self._pending.popleft()
        try:
            return future.result()
        finally:
            self._fill()

    def __iter__(self) -> Iterator[R]:
        while self._consumed < len(self.items):
            yield self.get()

    def close(self) -> None:
        """Cancels the fetches not started, waits for the running ones, releases results."""
        pending, self._pending = self._pending, collections.deque()
        self._consumed = self._next_submit = len(self.items)
        for future in pending:
            future.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for future in pending:
            if future.cancelled() or future.exception() is not None:
                continue
            if self.release is not None:
                self.release(future.result())

    def __enter__(self) -> Prefetcher[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
