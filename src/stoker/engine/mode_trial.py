"""``worker_mode="auto"``: threads or processes, chosen by measuring both on the real epoch.

Thread workers cost nothing to start and hand batches over without a copy or a message,
but they share one interpreter: work that holds the GIL (Python code per sample) runs
one thread at a time and slows the training loop too. Process workers run in parallel
whatever the work, and pay for it with a start-up, a copy into shared memory and a
message per batch. Which one wins depends on the dataset, the batch and the machine, so
the loader measures instead of guessing:

1. It starts in threads (the first batch comes as soon as one batch is loaded).
2. After a warm-up of ``warmup`` batches it measures the delivered batches/s over a
   window (at least ``min_batches`` batches and ``min_s`` seconds): what the training
   loop receives, its own time between ``next()`` calls included, so threads that slow
   the loop by holding the GIL are measured as slower.
3. It lets the batches in flight arrive, switches to processes and measures again. When
   the epoch has too few batches left to measure processes (at least ``warmup +
   min_batches``), it does not start them for a handful of batches: the next epoch
   starts with processes and measures them from its first batch.
4. It goes back to threads only when they delivered at least ``margin`` times the
   processes' rate, and keeps processes otherwise: a tie goes to processes, which run
   Python in parallel when the machine has free CPUs (a busy machine can make a GIL-bound
   thread pool look as fast as processes). The choice then holds for the loader's life.

Switching never changes a batch: every sample draws from its own generator (see
:mod:`stoker.seeding`), so threads and processes load the same batches, and the epoch
goes on with the next batch of the sampler's order. The loader runs threads only for
what declares ``thread_safe = True`` (stoker's own datasets and transforms do), see
:func:`stoker._thread_safety.is_thread_safe`; anything else gets processes, unmeasured.

Example:
    >>> trial = ModeTrial(warmup=1, min_batches=2, min_s=0.0)
    >>> [trial.batch_delivered(t) for t in (0.0, 1.0, 2.0)]  # threads: 1 batch/s
    [None, None, 'process']
    >>> trial.switched("process")
    >>> [trial.batch_delivered(t) for t in (10.0, 11.0, 12.0)]  # processes: 1 batch/s
    [None, None, None]
    >>> trial.chosen, trial.history[-1]
    ('process', 'worker_mode auto: threads 1.0 batches/s, processes 1.0 batches/s: processes')
"""

from __future__ import annotations

__all__ = ["ModeTrial"]

_KINDS = ("thread", "process")
_PLURAL = {"thread": "threads", "process": "processes"}
_PAUSED = -(1 << 62)  # a delivery count that never reaches the window: nothing is measured


class ModeTrial:
    """Measures delivered batches/s in thread and then process workers, and keeps the faster.

    Args:
        warmup: batches delivered after a start or a switch before the window opens.
        min_batches, min_s: the window closes after both this many batches and seconds.
        margin: threads must deliver this many times the processes' rate to be kept
            (a tie goes to processes, see the module's notes).
    """

    def __init__(
        self,
        *,
        warmup: int = 4,
        min_batches: int = 8,
        min_s: float = 0.1,
        margin: float = 1.05,
    ) -> None:
        self.warmup = warmup
        self.min_batches = min_batches
        self.min_s = min_s
        self.margin = margin
        self.current = "thread"
        self.chosen: str | None = None
        self.rates: dict[str, float] = {}
        self.history: list[str] = []
        self._delivered = 0
        self._opened_at = 0.0

    def restart_window(self) -> None:
        """A new epoch or a new pool: the next batches warm up again before measuring."""
        self._delivered = 0

    def switched(self, kind: str) -> None:
        """The engine now runs ``kind`` workers."""
        if kind not in _KINDS:
            raise ValueError(f"unknown worker kind {kind!r}")
        self.current = kind
        self.restart_window()

    @property
    def batches_to_measure(self) -> int:
        """Batches a new pool must deliver for its rate to be measured."""
        return self.warmup + max(1, self.min_batches)

    def defer(self, kind: str) -> None:
        """The switch to ``kind`` waits for the next epoch: this one ends in its pool.

        Nothing more is measured in this epoch; the next pool is of ``kind`` and is
        measured from the next epoch's start.
        """
        if kind not in _KINDS:
            raise ValueError(f"unknown worker kind {kind!r}")
        if self.chosen is None:
            self.current = kind
            self._delivered = _PAUSED
            self.history.append(
                f"worker_mode auto: too few batches left in this epoch to measure "
                f"{_PLURAL[kind]}; the next epoch starts with them"
            )

    def batch_delivered(self, now: float) -> str | None:
        """Counts a delivery at time ``now``; returns the kind to switch to, or None."""
        if self.chosen is not None:
            return None
        self._delivered += 1
        if self._delivered == self.warmup:
            self._opened_at = now
            return None
        measured = self._delivered - self.warmup
        if measured < max(1, self.min_batches) or now - self._opened_at < self.min_s:
            return None
        elapsed = now - self._opened_at
        self.rates[self.current] = measured / elapsed if elapsed > 0 else float("inf")
        if "process" not in self.rates:
            self._delivered = _PAUSED  # nothing more counts until the switch
            return "process"
        threads, processes = self.rates["thread"], self.rates["process"]
        self.chosen = "thread" if threads >= processes * self.margin else "process"
        self.history.append(
            f"worker_mode auto: threads {threads:,.1f} batches/s, processes "
            f"{processes:,.1f} batches/s: {_PLURAL[self.chosen]}"
        )
        return self.chosen if self.chosen != self.current else None
