"""How many CPUs other processes kept busy while a block ran: is a timing disturbed?

``stoker bench`` and ``stoker demo`` time loaders on machines they share; a figure above
:data:`BUSY_CPUS` says the timing taken in the block is suspect.
"""

from __future__ import annotations

import os
import time

from stoker._proc import descendants, machine_busy_s, process_cpu_s

__all__ = ["BUSY_CPUS", "BackgroundLoad"]

BUSY_CPUS = 0.3  # other processes above this many CPUs during a timing make it suspect


class BackgroundLoad:
    """How many CPUs *other* processes kept busy while a ``with`` block ran.

    The machine's busy time (``/proc/stat``) minus the CPU time of this process and its
    descendants (``/proc/<pid>/stat``), divided by the wall time. On a shared machine a
    figure well above 0 means a measurement taken in the block was disturbed. ``cpus``
    is ``None`` where ``/proc`` cannot be read.

    Example:
        >>> with BackgroundLoad() as load:
        ...     pass
        >>> load.cpus is None or load.cpus >= 0
        True
    """

    def __init__(self) -> None:
        self.cpus: float | None = None
        self.own_cpus: float | None = None
        self._start: tuple[float, float, dict[int, float]] | None = None

    def __enter__(self) -> BackgroundLoad:
        machine = machine_busy_s()
        self._start = None if machine is None else (time.perf_counter(), machine, _tree_cpu_s())
        return self

    def __exit__(self, *exc_info: object) -> None:
        machine = machine_busy_s()
        if self._start is None or machine is None:
            return
        clock, machine_before, tree_before = self._start
        wall = time.perf_counter() - clock
        tree_after = _tree_cpu_s()
        ours = sum(t - tree_before.get(pid, 0.0) for pid, t in tree_after.items())
        if wall > 0:
            self.cpus = max(0.0, (machine - machine_before - ours) / wall)
            self.own_cpus = ours / wall


def _tree_cpu_s() -> dict[int, float]:
    """CPU seconds used so far by this process and each of its descendants, by pid."""
    used = {}
    for pid in (os.getpid(), *descendants(os.getpid())):
        seconds = process_cpu_s(pid)
        if seconds is not None:
            used[pid] = seconds
    return used
