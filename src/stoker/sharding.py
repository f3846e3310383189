"""Splitting an iterable dataset's files and records over ranks and workers.

Every (rank, worker) pair is one *shard*: shard ``rank * num_workers + worker_id`` of
``world_size * num_workers``. Files are the unit of work as long as there are enough
of them; records fill the gap when there are not:

* at least as many files as shards: files are dealt out round-robin (shard ``s``
  reads files ``s, s + S, s + 2S, ...``) and each shard reads its files whole;
* fewer files than shards: shard ``s`` reads file ``s % F``, which ``k`` shards share,
  and keeps the records whose index ``i`` in that file has ``i % k == s // F``.

Either way every record is read by exactly one shard, whatever the number of files,
ranks and workers.

The rank and world size come from ``torch.distributed`` when it is imported and
initialised, else from the ``RANK`` / ``WORLD_SIZE`` environment variables (which
``torchrun`` sets), else 0 and 1. The worker comes from :func:`stoker.get_worker_info`
(process and thread workers alike), else from ``torch.utils.data.get_worker_info`` so
the same dataset shards itself under torch's DataLoader too. Nothing here imports torch.

Example:
    >>> shard_for_worker(["a", "b", "c", "d", "e"], rank=1, world_size=2)
    Shard(index=1, count=2, items=['b', 'd'], record_stride=1, record_offset=0)
    >>> shard_for_worker(["a"], rank=1, world_size=3)
    Shard(index=1, count=3, items=['a'], record_stride=3, record_offset=1)
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from stoker._validate import check_int
from stoker._worker_info import get_worker_info
from stoker.datasets import IterableDataset

__all__ = ["Shard", "ShardedIterable", "current_shard", "shard_for_worker", "shard_records"]

F = TypeVar("F")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Shard(Generic[F]):
    """What one shard reads: its files, and which records of each.

    Attributes:
        index: the shard id, ``rank * num_workers + worker_id``.
        count: how many shards there are, ``world_size * num_workers``.
        items: the files (or any units of work) this shard opens, in order.
        record_stride: keep every ``record_stride``-th record of each file ...
        record_offset: ... starting at record ``record_offset`` (0-based).

    Example:
        >>> s = Shard(index=0, count=2, items=["f"], record_stride=2, record_offset=1)
        >>> list(s.records(["r0", "r1", "r2", "r3"]))
        ['r1', 'r3']
    """

    index: int
    count: int
    items: list[F]
    record_stride: int
    record_offset: int

    def records(self, records: Iterable[R]) -> Iterator[R]:
        """The records of one of :attr:`items` that belong to this shard."""
        return itertools.islice(records, self.record_offset, None, self.record_stride)


def _from_environment() -> tuple[int, int] | None:
    raw_rank, raw_world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if raw_rank is None and raw_world is None:
        return None
    if raw_rank is None or raw_world is None:
        missing = "RANK" if raw_rank is None else "WORLD_SIZE"
        msg = (
            f"the environment sets only one of RANK and WORLD_SIZE ({missing} is missing): "
            "set both (torchrun does), or pass rank= and world_size= explicitly"
        )
        raise ValueError(msg)
    try:
        return int(raw_rank), int(raw_world)
    except ValueError:
        msg = (
            f"RANK and WORLD_SIZE must be integers, got RANK={raw_rank!r}, "
            f"WORLD_SIZE={raw_world!r}; fix the environment or pass rank= and world_size="
        )
        raise ValueError(msg) from None


def _distributed_topology() -> tuple[int, int]:
    """(rank, world_size): torch.distributed if initialised, else the environment, else (0, 1)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return _from_environment() or (0, 1)


def _any_worker_info() -> Any:
    """The calling worker's info (``id``, ``num_workers``, ``seed``): stoker's, else torch's.

    ``None`` outside workers. torch is not imported here: only asked once it is loaded.
    """
    info = get_worker_info()
    if info is not None:
        return info
    torch_data = sys.modules.get("torch.utils.data")
    return torch_data.get_worker_info() if torch_data is not None else None


def _worker_topology() -> tuple[int, int]:
    """(worker_id, num_workers) of the calling worker: stoker's, else torch's, else (0, 1)."""
    info = _any_worker_info()
    if info is None:
        return 0, 1
    return int(info.id), int(info.num_workers)


def current_shard(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    worker_id: int | None = None,
    num_workers: int | None = None,
) -> tuple[int, int]:
    """``(shard index, shard count)`` of the calling (rank, worker).

    Arguments left ``None`` are found as the module docstring says; passing them is
    for tests and for code that knows better.

    Raises:
        ValueError: an argument (or the environment) is not a valid topology.
    """
    if rank is None or world_size is None:
        found_rank, found_world = _distributed_topology()
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
    if worker_id is None or num_workers is None:
        found_id, found_num = _worker_topology()
        worker_id = found_id if worker_id is None else worker_id
        num_workers = found_num if num_workers is None else num_workers
    world_size = check_int("world_size", world_size, minimum=1)
    num_workers = check_int("num_workers", num_workers, minimum=1)
    rank = check_int("rank", rank)
    worker_id = check_int("worker_id", worker_id)
    if rank >= world_size:
        msg = f"rank must be in [0, {world_size - 1}] with world_size={world_size}, got rank={rank}"
        raise ValueError(msg)
    if worker_id >= num_workers:
        msg = (
            f"worker_id must be in [0, {num_workers - 1}] with num_workers={num_workers}, "
            f"got {worker_id}"
        )
        raise ValueError(msg)
    return rank * num_workers + worker_id, world_size * num_workers


def shard_for_worker(
    items: Sequence[F],
    *,
    rank: int | None = None,
    world_size: int | None = None,
    worker_id: int | None = None,
    num_workers: int | None = None,
) -> Shard[F]:
    """The :class:`Shard` of ``items`` (files) that the calling (rank, worker) reads.

    Args:
        items: the files (any sequence of units of work), the same list on every rank
            and worker.
        rank, world_size, worker_id, num_workers: the topology; ``None`` finds it
            (see :func:`current_shard`).

    Returns:
        The shard; its ``items`` may be empty (then this worker reads nothing).

    Example:
        >>> shard_for_worker(list(range(6)), rank=0, world_size=2, worker_id=1, num_workers=2)
        Shard(index=1, count=4, items=[1, 5], record_stride=1, record_offset=0)
    """
    items = list(items)
    index, count = current_shard(
        rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers
    )
    n = len(items)
    if n >= count:
        return Shard(index, count, items[index::count], 1, 0)
    if n == 0:
        return Shard(index, count, [], 1, 0)
    file_index = index % n
    sharing = len(range(file_index, count, n))  # shards that read this file
    return Shard(index, count, [items[file_index]], sharing, index // n)


def shard_records(
    items: Sequence[F],
    open_fn: Callable[[F], Iterable[R]],
    *,
    rank: int | None = None,
    world_size: int | None = None,
    worker_id: int | None = None,
    num_workers: int | None = None,
) -> Iterator[R]:
    """Yields the records of the calling (rank, worker)'s shard of ``items``.

    Args:
        items: the files, the same list on every rank and worker.
        open_fn: ``open_fn(item)`` returns an iterable of that item's records (a file
            object iterates its lines); it is closed after use if it has ``close()``.
        rank, world_size, worker_id, num_workers: see :func:`shard_for_worker`.

    Example:
        >>> files = {"a": [1, 2, 3], "b": [4]}
        >>> list(shard_records(sorted(files), files.__getitem__, rank=0, world_size=3))
        [1, 3]
    """
    shard = shard_for_worker(
        items, rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers
    )
    for item in shard.items:
        records = open_fn(item)
        try:
            yield from shard.records(records)
        finally:
            close = getattr(records, "close", None)
            if close is not None:
                close()


class ShardedIterable(IterableDataset[R]):
    """An iterable dataset over files, split over ranks and workers by :func:`shard_records`.

    The shard is worked out when iteration starts, inside the worker, so one object
    serves every rank and worker. ``open_fn`` must pickle (a module-level function)
    for process workers started with ``spawn`` / ``forkserver``.

    Args:
        items: the files (any sequence of units of work).
        open_fn: ``open_fn(item)`` returns an iterable of the item's records.
        rank, world_size: fix the topology instead of finding it at iteration time.

    Example:
        >>> from stoker import DataLoader
        >>> ds = ShardedIterable(["ab", "cde"], iter)
        >>> list(DataLoader(ds, batch_size=None))
        ['a', 'b', 'c', 'd', 'e']
    """

    def __init__(
        self,
        items: Sequence[F],
        open_fn: Callable[[F], Iterable[R]],
        *,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if not callable(open_fn):
            msg = (
                "open_fn must be callable (it receives one item and returns its records), "
                f"got {open_fn!r}"
            )
            raise TypeError(msg)
        self.items = list(items)
        self.open_fn = open_fn
        self.rank = rank
        self.world_size = world_size

    def __iter__(self) -> Iterator[R]:
        return shard_records(self.items, self.open_fn, rank=self.rank, world_size=self.world_size)

    def __repr__(self) -> str:
        name = getattr(self.open_fn, "__name__", self.open_fn)
        return f"ShardedIterable({len(self.items)} items, open_fn={name!r})"
