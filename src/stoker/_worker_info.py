"""``get_worker_info()``: which worker is running this code, if any."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["WorkerInfo", "get_worker_info"]

_local = threading.local()


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a dataset can learn about the worker it runs in.

    Attributes:
        id: the worker's index, ``0 <= id < num_workers``.
        num_workers: how many workers the loader runs.
        seed: the worker's seed (base seed + id); numpy and ``random`` are already
            seeded from it.
        dataset: this worker's copy of the dataset.

    Example:
        >>> from stoker import get_worker_info
        >>> get_worker_info() is None  # in the main process
        True
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any


def get_worker_info() -> WorkerInfo | None:
    """The :class:`WorkerInfo` of the current worker, or ``None`` outside workers.

    Works for process and thread workers alike (it is thread-local).
    """
    return getattr(_local, "info", None)


def _set_worker_info(info: WorkerInfo | None) -> None:
    """Engine-only: declares the calling thread a worker (``None`` to clear)."""
    _local.info = info
