"""A thread pool's first batch, made by one thread alone.

Thread workers share one interpreter. Two threads that make an epoch's first two batches
at once take turns on the GIL for their Python work, so the first batch takes up to twice
as long as one thread alone would, while the trainer waits for that batch and does not yet
need the second. So a thread pool taken up by an epoch gets one task at first, and the rest
of its tasks as soon as one of these happens:

- the first task is answered;
- the thread working on it stops using the CPU (less than ``busy_share`` of the time over
  an interval): it waits for a file, a socket, a lock, or for the other workers at a
  barrier. A dataset whose workers meet relies on every worker getting a task, and a thread
  that waits leaves the interpreter to the others anyway;
- ``limit_s`` has passed (work that releases the GIL does not slow the first batch, and
  the next batches should not wait long for it).

What it costs: the second batch starts when the first is done instead of beside it, once
per epoch; its workers' first batch comes up to twice as soon on Python-heavy samples.

The pool's other threads are not left idle meanwhile: the first task of a map-style epoch
says ``threads=num_workers``, and the worker that gets it splits the batch's samples into
that many runs of consecutive samples, loads the first run itself and the others in helper
threads (which see the worker's ``get_worker_info()``), then collates them in order. Each
sample draws from its own random scope wherever it is loaded, so the batch is the same; on
samples that release the GIL (decoding, resizing, reading files) the first batch comes up
to ``num_workers`` times as soon. ``__getitems__`` datasets get the batch whole, as always,
and with a ``worker_init_fn`` (which may have set up the worker's own thread) the worker
loads it alone.

Example:
    >>> cpu = iter([0.0, 0.009, 0.018, 0.019])  # the thread's CPU seconds at each look
    >>> now = iter([0.0, 0.01, 0.02, 0.03])
    >>> head = HeadStart(lambda: next(cpu), clock=lambda: next(now))
    >>> head.over(), head.over(), head.over()  # busy, busy, then waiting: it is over
    (False, False, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["HeadStart"]


class HeadStart:
    """Decides when a thread pool's first task stops holding the others back.

    Args:
        cpu_s: the CPU seconds the first task's thread has used so far, or None when they
            cannot be read (then only an answer or ``limit_s`` ends the head start).
        limit_s: the longest head start.
        busy_share: below this share of one CPU over an interval, the thread is waiting.
        interval_s: the shortest interval the share is measured over (how often to look).
        clock: the time, in seconds.
    """

    def __init__(
        self,
        cpu_s: Callable[[], float | None],
        *,
        limit_s: float = 1.0,
        busy_share: float = 0.5,
        interval_s: float = 0.01,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self._cpu_s = cpu_s
        self._busy_share = busy_share
        self._clock = clock
        self._last_at = clock()
        self._deadline = self._last_at + limit_s
        self._last_cpu = cpu_s()

    def over(self) -> bool:
        """True when the other tasks should go out now (the thread waits, or time is up)."""
        now = self._clock()
        if now >= self._deadline:
            return True
        if now - self._last_at < self.interval_s:
            return False
        cpu = self._cpu_s()
        if cpu is None or self._last_cpu is None:
            self._last_at, self._last_cpu = now, cpu
            return False
        share = (cpu - self._last_cpu) / (now - self._last_at)
        self._last_at, self._last_cpu = now, cpu
        return share < self._busy_share

    def wait_s(self) -> float:
        """How long the trainer may wait for an answer before it looks again."""
        return max(0.0, min(self.interval_s, self._deadline - self._clock()))
