"""Datasets the Ray actors unpickle: module level, numpy and stoker only.

Every sample draws from the global generators (numpy's and Python's), so a batch
depends on the per-sample random scopes and not on which actor loaded it.
"""

from __future__ import annotations

import random
import time

import numpy as np

from stoker import IterableDataset, get_worker_info


class Noisy:
    """Map-style: sample ``i`` is ``{"index": i, "noise": draws, "image": i-filled array}``."""

    def __init__(self, n: int, side: int = 8, delay_s: float = 0.0) -> None:
        self.n = n
        self.side = side
        self.delay_s = delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if self.delay_s:
            time.sleep(self.delay_s)
        noise = np.array([np.random.rand(), random.random()])
        image = np.full((self.side, self.side), i, dtype=np.float32) + np.random.rand()
        return {"index": i, "noise": noise, "image": image}


class BrokenSample(ValueError):
    """What :class:`FailsAt` raises: a ValueError of a type of its own."""


class FailsAt(Noisy):
    """Raises :class:`BrokenSample` at one index."""

    def __init__(self, n: int, bad: int) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> dict:
        if i == self.bad:
            raise BrokenSample(f"sample {i} is corrupt")
        return super().__getitem__(i)


class Counting(IterableDataset):
    """An iterable dataset sharded by worker, with a place it can save and restore."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.position = 0  # the next index this copy's stream would consider
        self._resume_at = 0

    def __iter__(self):
        info = get_worker_info()
        workers, me = (info.num_workers, info.id) if info is not None else (1, 0)
        start, self._resume_at = self._resume_at, 0  # a resumed stream starts there, once
        for i in range(start, self.n):
            if i % workers == me:
                self.position = i + 1
                yield {"index": i, "noise": np.random.rand()}

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self._resume_at = state["position"]


class StallsAt(Noisy):
    """Sleeps for a minute at one index: a stuck sample."""

    def __init__(self, n: int, slow: int) -> None:
        super().__init__(n)
        self.slow = slow

    def __getitem__(self, i: int) -> dict:
        if i == self.slow:
            time.sleep(60)
        return super().__getitem__(i)


def failing_init(worker_id: int) -> None:
    """A worker_init_fn that fails in worker 1."""
    if worker_id == 1:
        raise RuntimeError(f"worker {worker_id} cannot open its database")
