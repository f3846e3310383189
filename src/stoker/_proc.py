"""What Linux says about processes and this machine: every ``/proc`` reader in one place.

The process tree (:func:`descendants`, :func:`process_stat`, :func:`cmdline`), memory
(:func:`process_memory` from ``smaps_rollup``, :func:`status_kib` from ``status``,
:func:`reset_peak_rss`), CPU time (:func:`process_cpu_s`, :func:`machine_busy_s`), open
files (:func:`open_fds`), the CPUs this process may use (:func:`usable_cpus`) and the
memory the machine has free (:func:`available_memory`).

Every reader returns ``None`` (or an empty result) where ``/proc`` is missing or the
process is gone, never raises for that: processes exit between two reads, and other
systems have no ``/proc`` at all.

Example:
    >>> import os
    >>> stat = process_stat(os.getpid())
    >>> stat is None or (stat.pid == os.getpid() and stat.state in "RS")
    True
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = [
    "ProcessMemory",
    "ProcessStat",
    "available_memory",
    "cmdline",
    "descendants",
    "is_multiprocessing_helper",
    "machine_busy_s",
    "mapped_file",
    "open_fds",
    "process_cpu_s",
    "process_memory",
    "process_stat",
    "reset_peak_rss",
    "status_kib",
    "usable_cpus",
]

# The fork server and resource tracker multiprocessing keeps for the whole session.
_MP_HELPERS = (b"multiprocessing.forkserver", b"multiprocessing.resource_tracker")


def _clock_ticks() -> int:
    """Clock ticks per second, the unit of the CPU times in ``/proc``."""
    try:
        return os.sysconf("SC_CLK_TCK")
    except (AttributeError, ValueError, OSError):
        return 100


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes: what the machine can give without
    swapping (None where unknown)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# -- the process tree ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessStat:
    """The fields of ``/proc/<pid>/stat`` stoker reads.

    ``(pid, start_ticks)`` names one process even after its pid is reused.
    """

    pid: int
    ppid: int
    state: str  # R running, S sleeping, D disk wait, Z zombie, X dead, ...
    start_ticks: int  # when it started, in clock ticks after boot
    cpu_s: float  # user + system CPU seconds used so far


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (ours or another user's: ``EPERM`` means it does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_stat(pid: int | str) -> ProcessStat | None:
    """``pid``'s ``/proc/<pid>/stat`` (``"self"`` for this process), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
        # the command name is in parentheses and may itself hold spaces or parentheses
        fields = text.rsplit(b")", 1)[1].split()
        return ProcessStat(
            pid=int(text.split(b" ", 1)[0]),
            ppid=int(fields[1]),
            state=fields[0].decode(),
            start_ticks=int(fields[19]),
            cpu_s=(int(fields[11]) + int(fields[12])) / _clock_ticks(),
        )
    except (OSError, ValueError, IndexError):
        return None


def process_cpu_s(pid: int | str) -> float | None:
    """User + system CPU seconds ``pid`` has used so far, or None if it is gone."""
    stat = process_stat(pid)
    return None if stat is None else stat.cpu_s


def cmdline(pid: int | str) -> str:
    """``pid``'s command line, arguments joined by spaces ("" if it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_multiprocessing_helper(pid: int) -> bool:
    """The fork server and resource tracker that multiprocessing keeps for the session."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
    except OSError:
        return False
    return any(name in command for name in _MP_HELPERS)


def descendants(pid: int, *, helpers: bool = False) -> list[int]:
    """Children, grandchildren, ... of ``pid``, zombies included, parents first.

    Read from ``/proc/<pid>/task/<tid>/children``. Unless ``helpers`` is true,
    multiprocessing's fork server and resource tracker are left out, with the processes
    below them.
    """
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    kids = [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
            if not helpers:
                kids = [k for k in kids if not is_multiprocessing_helper(k)]
            found.extend(kids)
            pending.extend(kids)
    return found


def open_fds(pid: int | str = "self") -> dict[int, str]:
    """``pid``'s open file descriptors and what each points at (``pipe:[123]``, a path)."""
    folder = f"/proc/{pid}/fd"
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    fds = {}
    for name in names:
        try:
            fds[int(name)] = os.readlink(f"{folder}/{name}")
        except (OSError, ValueError):  # closed meanwhile (the listing's own fd among them)
            continue
    return fds


# -- memory ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """One process's memory in bytes: resident, proportional and unique."""

    rss: int
    pss: int
    uss: int


def process_memory(pid: int | str) -> ProcessMemory | None:
    """``pid``'s memory from /proc/<pid>/smaps_rollup, or None when unavailable."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    fields[name] = int(parts[0]) * 1024
    except (OSError, ValueError):
        return None
    uss = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    return ProcessMemory(fields.get("Rss", 0), fields.get("Pss", 0), uss)


def status_kib(pid: int | str, key: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), or None."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(key.encode() + b":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def reset_peak_rss() -> bool:
    """Resets this process's ``VmHWM`` to its current resident set; False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


# -- the machine -----------------------------------------------------------------------


def machine_busy_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (all CPUs, steal included)."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    # cpu user nice system idle iowait irq softirq steal ...; guest time is inside user
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / _clock_ticks()


def mapped_file(address: int, pid: int | str = "self") -> str:
    """The file mapped at ``address`` in ``pid``'s memory ("" for anonymous memory)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split()
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= address < end:
                    return fields[5] if len(fields) > 5 else ""
    except OSError:
        pass
    return ""
