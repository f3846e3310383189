"""Peak memory of this process and its workers while a block runs (``stoker bench``).

What :func:`stoker.tuning.sweep` reports as each setting's measured peak, beside its
estimate.
"""

from __future__ import annotations

import os
import threading

from stoker._proc import descendants, process_memory, reset_peak_rss, status_kib

__all__ = ["PeakMemory"]

_MEMORY_POLL_S = 0.05  # how often the workers' memory is sampled
_MEMORY_JOIN_TIMEOUT_S = 2.0  # how long to wait for the sampling thread to stop


class PeakMemory:
    """Peak memory of this process and its workers while the ``with`` block runs.

    The trainer's peak is the kernel's own high-water mark (``VmHWM``), reset on entry by
    writing ``5`` to ``/proc/self/clear_refs``; where that is refused, the trainer's
    ``VmRSS`` is sampled instead. The workers' private memory is sampled every
    ``_MEMORY_POLL_S`` by a background thread, and the peak of their sum is kept.
    """

    def __init__(self) -> None:
        self.baseline_bytes: int | None = None
        self.peak_bytes: int | None = None
        self._hwm_reset = False
        self._trainer_kib = 0
        self._workers_kib = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        rss = status_kib("self", "VmRSS")
        if rss is None:  # no /proc: nothing to measure
            return self
        self.baseline_bytes = rss * 1024
        self._hwm_reset = reset_peak_rss()
        self._thread = threading.Thread(target=self._poll, name="stoker-bench-memory", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        rss = status_kib("self", "VmRSS")
        if rss is not None:
            self._trainer_kib = max(self._trainer_kib, rss)
        workers = 0
        for child in descendants(os.getpid()):
            memory = process_memory(child)
            workers += memory.uss // 1024 if memory is not None else 0
        self._workers_kib = max(self._workers_kib, workers)

    def _poll(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(_MEMORY_POLL_S):
                return

    def __exit__(self, *exc_info: object) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(_MEMORY_JOIN_TIMEOUT_S)
        self._sample()  # once more, with the workers still alive (the loader closes after)
        trainer = self._trainer_kib
        if self._hwm_reset:
            trainer = max(trainer, status_kib("self", "VmHWM") or 0)
        self.peak_bytes = (trainer + self._workers_kib) * 1024
