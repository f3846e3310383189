"""``stoker.profile(loader)``: how much of each training step waits for data, and a verdict.

The usual rule of thumb, measured instead of guessed: time each step's wait for the
next batch against the whole step. Above 20% the data pipeline is the bottleneck; below
5% training is compute-bound and loading is not the problem; around 10% the usual cause
is heavy CPU augmentation. The verdict names what to change, using the loader's own stage
timings (:meth:`stoker.DataLoader.stats`) to say which stage to attack.

Example:
    >>> import numpy as np
    >>> from stoker import ArrayDataset, DataLoader, profile
    >>> loader = DataLoader(ArrayDataset(np.zeros((64, 4))), batch_size=8)
    >>> with profile(loader) as p:
    ...     for batch in p:
    ...         pass  # the training step
    >>> p.steps
    8
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

__all__ = ["Profile", "profile"]

BOTTLENECK_SHARE = 0.20
COMPUTE_BOUND_SHARE = 0.05


class Profile:
    """Iterates a loader while timing the data wait of every step.

    Use it as the loop's iterable (``for batch in p``); each step is the time from one
    batch's arrival to the next's. Read :attr:`data_wait_share`, :attr:`verdict` or print
    :meth:`report` afterwards.

    Example:
        >>> p = Profile([1, 2, 3])
        >>> [x for x in p], p.steps
        ([1, 2, 3], 3)
    """

    def __init__(self, loader: Any, *, skip_first: int = 1) -> None:
        self.loader = loader
        self.skip_first = skip_first  # the first step includes worker start-up
        self.waits: list[float] = []
        self.steps_s: list[float] = []
        self._stats_before: Any = None

    def __enter__(self) -> Profile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def __iter__(self) -> Iterator[Any]:
        stats = getattr(self.loader, "stats", None)
        self._stats_before = stats() if callable(stats) else None
        iterator = iter(self.loader)
        clock = time.perf_counter
        previous = clock()
        while True:
            asked = clock()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            arrived = clock()
            if self.waits:  # the step that just ended: from the last arrival to this one
                self.steps_s.append(arrived - previous)
            self.waits.append(arrived - asked)
            previous = arrived
            yield batch

    @property
    def steps(self) -> int:
        return len(self.waits)

    def _counted(self) -> tuple[list[float], list[float]]:
        k = min(self.skip_first, max(0, len(self.steps_s) - 1))
        return self.waits[1:][k:], self.steps_s[k:]

    @property
    def data_wait_share(self) -> float:
        """Data wait as a share of step time (0..1), first steps excluded."""
        waits, steps = self._counted()
        total = sum(steps)
        return sum(waits) / total if total > 0 else 0.0

    @property
    def verdict(self) -> str:
        share = self.data_wait_share
        if share > BOTTLENECK_SHARE:
            return "data-bound: the pipeline is the bottleneck. " + self._advice()
        if share < COMPUTE_BOUND_SHARE:
            return (
                "compute-bound: the model, not data loading, sets the pace; leave the loader "
                "as it is."
            )
        return (
            "balanced, with a noticeable data wait: typical of heavy CPU augmentation. Move "
            "costly transforms to batch level or to the GPU, or add a worker or two (stoker "
            "bench finds the knee)."
        )

    def _advice(self) -> str:
        stats = getattr(self.loader, "stats", None)
        if not callable(stats):
            return "Raise num_workers and prefetch_factor (stoker bench finds the knee)."
        now = stats()
        fetch, collate, transport = (
            now.per_batch_ms("fetch"),
            now.per_batch_ms("collate"),
            now.per_batch_ms("transport"),
        )
        workers = getattr(self.loader, "num_workers", 0)
        if workers == 0:
            return (
                "It loads in the main process: set num_workers (stoker bench sweeps it) with "
                "persistent_workers=True."
            )
        if transport > max(fetch, collate) / max(1, workers):
            return (
                "Handing batches over costs more than making them: raise batch_size, or use "
                "worker_mode='thread' for light samples."
            )
        if fetch >= collate:
            return (
                f"Fetching dominates ({fetch:.1f} ms per batch in the workers): raise "
                "num_workers if cores are idle, pack small files into shards (stoker pack) and "
                "read them with BlockShuffleSampler, decode at reduced size, and check "
                "stats().slowest_samples."
            )
        return (
            f"collate_fn dominates ({collate:.1f} ms per batch): keep it light (no per-sample "
            "Python loops), or move batch-level work to the GPU."
        )

    def report(self) -> str:
        waits, steps = self._counted()
        if not steps:
            return (
                f"profiled {self.steps} step(s): too few to judge (need at least "
                f"{self.skip_first + 2})"
            )
        mean_step = 1000 * sum(steps) / len(steps)
        mean_wait = 1000 * sum(waits) / len(waits) if waits else 0.0
        return (
            f"profiled {len(steps)} steps (first {self.skip_first} excluded): step "
            f"{mean_step:.2f} ms, data wait {mean_wait:.2f} ms = "
            f"{100 * self.data_wait_share:.1f}% of the step.\nverdict: {self.verdict}"
        )


def profile(loader: Any, *, skip_first: int = 1) -> Profile:
    """Profiles a training loop over ``loader``: ``with stoker.profile(loader) as p: for b in p``.

    Also usable without ``with``: ``for batch in stoker.profile(loader)``.
    """
    return Profile(loader, skip_first=skip_first)
