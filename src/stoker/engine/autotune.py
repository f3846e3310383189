"""``num_workers="auto"`` and ``prefetch_factor="auto"``: tuned online, within budgets.

In the spirit of tf.data's AUTOTUNE, measured rather than guessed: every tuning window
(at least :data:`WINDOW_BATCHES` batches and :data:`WINDOW_S` seconds) the tuner looks at
what the consumer experienced and what the workers did:

* the consumer waited for more than :data:`WAIT_SHARE` of the window **and** the workers
  were busy (they waited for a task less than ``1 -`` :data:`BUSY_SHARE` of their time):
  parallelism is short, so a worker is added, while workers stay within the CPU budget
  (the cores this process may use);
* the consumer waited **but** the workers sat idle waiting for tasks: the read-ahead is
  too short to keep them fed, so it grows (``prefetch_factor`` + 1, up to
  :data:`MAX_PREFETCH`);
* either step is taken only if the memory it commits, one batch's bytes x (workers x
  prefetch + 2), stays within the RAM budget (``memory_budget=``, by default a quarter of
  the memory available when the loader starts).

Growth only: a worker is never taken away mid-run, which keeps the schedule simple and
the batches' order unaffected (it never depends on the workers). Every decision is kept
in :attr:`AutoTuner.history` and shown by ``loader.stats()``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from stoker import _proc

__all__ = ["AutoTuner", "Tunable", "available_memory"]

WINDOW_BATCHES = 4
WINDOW_S = 0.1
WAIT_SHARE = 0.10
BUSY_SHARE = 0.75
MAX_PREFETCH = 8


_UNKNOWN_MEMORY = 8 * 2**30  # assumed available where the system does not say


def available_memory() -> int:
    """The memory the machine has available, in bytes (a large default where unknown)."""
    available = _proc.available_memory()
    return _UNKNOWN_MEMORY if available is None else available


class Tunable(Protocol):
    """What the tuner reads and changes: the running epoch's workers and read-ahead."""

    @property
    def workers(self) -> int: ...

    @property
    def prefetch(self) -> int: ...

    @property
    def batch_bytes(self) -> int: ...

    @property
    def worker_idle_s(self) -> float: ...

    def add_worker(self) -> None: ...

    def set_prefetch(self, prefetch: int) -> None: ...


@dataclass
class AutoTuner:
    """Grows workers and prefetch while they cut the consumer's wait (see module doc)."""

    tune_workers: bool
    tune_prefetch: bool
    max_workers: int
    memory_budget: int
    history: list[str] = field(default_factory=list)
    _window_start: float = 0.0
    _window_batches: int = 0
    _window_wait: float = 0.0
    _idle_start: float = 0.0

    def batch_delivered(self, waited_s: float, running: Tunable) -> None:
        """Called by the iterator after every batch; decides at the end of each window."""
        now = time.perf_counter()
        if not self._window_start:
            self._begin(now, running)
            return
        self._window_batches += 1
        self._window_wait += waited_s
        elapsed = now - self._window_start
        if self._window_batches < WINDOW_BATCHES or elapsed < WINDOW_S:
            return
        workers = running.workers
        idle = running.worker_idle_s - self._idle_start
        busy_share = max(0.0, 1 - idle / (elapsed * workers)) if workers else 1.0
        wait_share = self._window_wait / elapsed
        if wait_share > WAIT_SHARE:
            batch_bytes = running.batch_bytes
            if busy_share > BUSY_SHARE:
                if (
                    self.tune_workers
                    and workers < self.max_workers
                    and self._fits(batch_bytes, workers + 1, running.prefetch)
                ):
                    running.add_worker()
                    self.history.append(
                        f"worker {workers} added: consumer waited {100 * wait_share:.0f}% of the "
                        f"time, workers {100 * min(busy_share, 1):.0f}% busy"
                    )
            elif (  # workers starved of tasks
                self.tune_prefetch
                and running.prefetch < MAX_PREFETCH
                and self._fits(batch_bytes, workers, running.prefetch + 1)
            ):
                running.set_prefetch(running.prefetch + 1)
                self.history.append(
                    f"prefetch_factor raised to {running.prefetch}: consumer waited "
                    f"{100 * wait_share:.0f}% of the time, workers "
                    f"{100 * min(busy_share, 1):.0f}% busy"
                )
        self._begin(now, running)

    def _begin(self, now: float, running: Tunable) -> None:
        self._window_start = now
        self._window_batches = 0
        self._window_wait = 0.0
        self._idle_start = running.worker_idle_s

    def _fits(self, batch_bytes: int, workers: int, prefetch: int) -> bool:
        need = batch_bytes * (workers * prefetch + 2)
        if need <= self.memory_budget:
            return True
        note = (
            f"held at {workers if not self.history else 'current'} settings: {workers} workers x "
            f"prefetch {prefetch} would hold {need / 2**20:.0f} MiB of batches, over the "
            f"{self.memory_budget / 2**20:.0f} MiB memory budget"
        )
        if not self.history or self.history[-1] != note:
            self.history.append(note)
        return False
