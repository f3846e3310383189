"""The leak check: nothing a test started may outlive it.

``tests/conftest.py`` takes a :func:`baseline` before every test and fails the test when
:func:`leftovers` finds something new still there after it: a worker process (zombies
included, multiprocessing's fork server and resource tracker aside), a stoker thread, an
open pipe, socket or shared-memory file descriptor, a ``/dev/shm/stoker-<pid>-*`` segment
or a ``stoker-stack-<pid>-*`` stack-dump file.

Everything is read from ``/proc`` (through :mod:`stoker._proc`) and the file system, so
the check sees what really exists, not what the engine believes exists. The helpers
(:func:`descendants`, :func:`wait_gone`, :func:`shm_segments`, ...) serve tests that
check the same things at a point of their own, for instance in a child trainer.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import multiprocessing
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

from stoker import _proc
from stoker._proc import ProcessStat, process_stat

__all__ = [
    "SETTLE_S",
    "Baseline",
    "Proc",
    "baseline",
    "clean_up",
    "data_segments",
    "descendants",
    "is_gone",
    "leftovers",
    "shm_segments",
    "stack_files",
    "wait_gone",
    "worker_processes",
    "worker_threads",
]

SETTLE_S = 3.0  # how long leftovers may take to go away (thread workers finish their batch)
_POLL_S = 0.02

Proc = ProcessStat  # a process as /proc/<pid>/stat describes it


# -- processes -------------------------------------------------------------------------
def descendants(root: int) -> list[Proc]:
    """Every process below ``root`` (children, grandchildren, ...), zombies included."""
    found = (process_stat(pid) for pid in _proc.descendants(root, helpers=True))
    return [proc for proc in found if proc is not None]


def is_gone(proc: Proc) -> bool:
    """True when that process (same pid *and* start time) has exited (zombies count as exited)."""
    now = process_stat(proc.pid)
    return now is None or now.start_ticks != proc.start_ticks or now.state in ("Z", "X")


def wait_gone(procs: list[Proc], limit_s: float = 10.0) -> list[Proc]:
    """Waits until every process in ``procs`` has exited; returns those still alive."""
    deadline = time.monotonic() + limit_s
    alive = [p for p in procs if not is_gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        alive = [p for p in alive if not is_gone(p)]
    return alive


def _is_mp_helper(proc: Proc, root: int) -> bool:
    """The forkserver and resource tracker multiprocessing keeps for the whole session."""
    return proc.ppid == root and _proc.is_multiprocessing_helper(proc.pid)


def worker_processes() -> list[Proc]:
    """Live processes below this one, except multiprocessing's own helpers."""
    me = os.getpid()
    return [p for p in descendants(me) if p.state not in ("Z", "X") and not _is_mp_helper(p, me)]


# -- threads, segments, stack files, file descriptors ----------------------------------
def worker_threads() -> list[threading.Thread]:
    """The engine's live worker threads (``stoker-worker-<id>``)."""
    return [
        t for t in threading.enumerate() if t.name.startswith("stoker-worker-") and t.is_alive()
    ]


def _stoker_threads() -> list[threading.Thread]:
    """Every live thread stoker named: workers, pin-memory, sampling, packing threads."""
    return [t for t in threading.enumerate() if t.name.startswith("stoker-") and t.is_alive()]


def shm_segments(pid: int) -> list[str]:
    """Names of this process's stoker segments in /dev/shm."""
    try:
        names = os.listdir("/dev/shm")
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(f"stoker-{pid}-"))


def data_segments(pid: int) -> list[str]:
    """This process's segments that hold batches (not the pools' ``.alive`` locks)."""
    return [n for n in shm_segments(pid) if not n.endswith(".alive")]


def stack_files(pid: int) -> list[str]:
    """The stack-dump files of ``pid``'s process workers."""
    return sorted(glob.glob(os.path.join(tempfile.gettempdir(), f"stoker-stack-{pid}-*")))


# What workers leave open when they are not shut down: the pipes and sockets of their
# queues and the shared-memory files of their slots. Regular files are left out: a
# dataset or a session fixture may keep its shards open from one test to the next.
_WORKER_FD_KINDS = ("pipe:", "socket:", "anon_inode:", "/dev/shm/")


def _worker_fds() -> dict[int, str]:
    """This process's open pipes, sockets, event fds and shared-memory files, except its
    channels to multiprocessing's fork server and resource tracker (they live as long as
    the session; the helper holds the other end of the same pipe)."""
    me = os.getpid()
    helpers: set[str] = set()
    for proc in descendants(me):
        if _is_mp_helper(proc, me):
            helpers.update(_proc.open_fds(proc.pid).values())
    return {
        fd: target
        for fd, target in _proc.open_fds().items()
        if target.startswith(_WORKER_FD_KINDS)
        and target not in helpers
        and not _is_mp_arena(target)
    }


def _is_mp_arena(target: str) -> bool:
    """multiprocessing's own heap arena (``/dev/shm/pym-*``): a test's ``multiprocessing.Value``
    or ``Lock`` puts it there, and multiprocessing keeps it for the life of the process."""
    return target.startswith("/dev/shm/pym-")


# -- before and after a test -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Baseline:
    """What existed before a test; a leak is something new that is still there after it."""

    processes: frozenset[tuple[int, int]]  # (pid, start_ticks)
    threads: frozenset[int]  # id() of each stoker thread
    segments: frozenset[str]
    stacks: frozenset[str]
    fds: frozenset[tuple[int, str]]  # (fd, what it points at)


def baseline() -> Baseline:
    me = os.getpid()
    return Baseline(
        processes=frozenset((p.pid, p.start_ticks) for p in descendants(me)),
        threads=frozenset(id(t) for t in _stoker_threads()),
        segments=frozenset(shm_segments(me)),
        stacks=frozenset(stack_files(me)),
        fds=frozenset(_worker_fds().items()),
    )


def _current_leftovers(before: Baseline) -> list[str]:
    me = os.getpid()
    problems = []
    for proc in descendants(me):
        if (proc.pid, proc.start_ticks) in before.processes or _is_mp_helper(proc, me):
            continue
        kind = "zombie (never joined)" if proc.state == "Z" else f"state {proc.state}"
        problems.append(
            f"process {proc.pid} ({kind}, parent {proc.ppid}): {_proc.cmdline(proc.pid)[:120]!r}"
        )
    problems += [
        f"thread {t.name} is alive" for t in _stoker_threads() if id(t) not in before.threads
    ]
    problems += [f"/dev/shm/{n} exists" for n in shm_segments(me) if n not in before.segments]
    problems += [f"{p} exists" for p in stack_files(me) if p not in before.stacks]
    problems += [
        f"file descriptor {fd} ({target}) is open"
        for fd, target in sorted(_worker_fds().items())
        if (fd, target) not in before.fds
    ]
    return problems


def leftovers(before: Baseline, settle_s: float = SETTLE_S) -> list[str]:
    """What the test left behind, after giving it up to ``settle_s`` to go away."""
    deadline = time.monotonic() + settle_s
    problems = _current_leftovers(before)
    while problems and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        problems = _current_leftovers(before)
    # last, because it joins finished children: a zombie the engine forgot to join is
    # reported above before this reaps it
    problems += [
        f"multiprocessing child {child.name} (pid {child.pid}) is alive"
        for child in multiprocessing.active_children()
        if child.name.startswith("stoker-worker-")
        and child.pid not in {pid for pid, _ in before.processes}
    ]
    return problems


def clean_up(before: Baseline) -> None:
    """Removes what a failed test left behind, so that the tests after it are not blamed.

    Kills the processes it started (its own descendants only, matched by pid and start
    time), reaps the zombies among this process's children, and removes its segments and
    stack files. Threads and file descriptors are left: nothing outside them owns them.
    """
    me = os.getpid()
    left = [
        proc
        for proc in reversed(descendants(me))  # grandchildren before their parents
        if (proc.pid, proc.start_ticks) not in before.processes and not _is_mp_helper(proc, me)
    ]
    for proc in left:
        if proc.state not in ("Z", "X") and not is_gone(proc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    # reaped through their Popen object where there is one, so it knows (and does not warn)
    children = {proc.pid for proc in left if proc.ppid == me}
    for obj in gc.get_objects() if children else ():
        if isinstance(obj, subprocess.Popen) and obj.pid in children:
            obj.wait()
            children.discard(obj.pid)
    multiprocessing.active_children()  # joins the multiprocessing children among them
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    for name in shm_segments(me):
        if name not in before.segments:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join("/dev/shm", name))
    for path in stack_files(me):
        if path not in before.stacks:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
