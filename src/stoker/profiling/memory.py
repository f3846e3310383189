"""Per-process memory, and the warning for workers whose private memory keeps growing.

``uss`` (unique set size) is memory only that process holds: the part copy-on-read grows.
``pss`` (proportional set size) splits shared pages among their users, so summing the PSS
of the trainer and its workers gives their true total. Both come from
``/proc/<pid>/smaps_rollup`` (Linux, read by :func:`stoker._proc.process_memory`);
elsewhere they are absent.
"""

from __future__ import annotations

import itertools
import time
import warnings
from dataclasses import dataclass, field

from stoker._proc import ProcessMemory, process_memory

__all__ = ["GrowthWatch", "ProcessMemory", "process_memory"]

_CHECK_EVERY_S = 5.0
_SAMPLES = 6
_MIN_GROWTH_BYTES = 32 * 2**20
_MIN_GROWTH_SHARE = 0.2


@dataclass
class GrowthWatch:
    """Samples each worker's USS every few seconds; warns once about steady growth."""

    history: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    warned: bool = False
    _last: float = field(default_factory=time.monotonic)  # the first look waits a period too

    def check(self, pids: dict[int, int], batches: int) -> None:
        now = time.monotonic()
        if self.warned or now - self._last < _CHECK_EVERY_S:
            return
        self._last = now
        for worker_id, pid in pids.items():
            memory = process_memory(pid)
            if memory is None:
                continue
            samples = self.history.setdefault(worker_id, [])
            samples.append((batches, memory.uss))
            del samples[:-_SAMPLES]
            if len(samples) == _SAMPLES and self._growing(samples):
                self.warned = True
                first, last = samples[0], samples[-1]
                warnings.warn(
                    f"worker {worker_id}'s private memory grew from {first[1] / 2**20:.0f} MiB "
                    f"to {last[1] / 2**20:.0f} MiB over {last[0] - first[0]} batches and keeps "
                    "growing. The usual cause is copy-on-read: the dataset holds Python lists "
                    "or dicts (of paths, labels, records) and every read dirties their pages in "
                    "each worker. Store them with stoker.compact.StringArray / RecordArray or "
                    "numpy arrays (docs/memory.md).",
                    ResourceWarning,
                    stacklevel=5,
                )
                return

    @staticmethod
    def _growing(samples: list[tuple[int, int]]) -> bool:
        values = [uss for _, uss in samples]
        rising = all(b > a for a, b in itertools.pairwise(values))
        growth = values[-1] - values[0]
        return rising and growth > _MIN_GROWTH_BYTES and growth > _MIN_GROWTH_SHARE * values[0]
