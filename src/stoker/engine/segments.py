"""Raw POSIX shared-memory segments in ``/dev/shm``: create, map, unlink, sweep.

These are the bytes under the batch slots of :mod:`stoker.engine.slots`. Every segment of
a process pool is named ``stoker-<trainer pid>-<token>-...`` (the pool's *prefix*).

Liveness: the trainer holds an exclusive ``flock`` on ``<prefix>.alive`` for the pool's
life (:func:`hold_prefix`). The kernel drops the lock when the last process holding it
dies, however it dies. Segments of a pool whose lock is free are removed by the next pool
created on the machine (:func:`remove_orphaned_segments`); a pool whose lock is held is
alive, whatever PID namespace it runs in (containers that share ``/dev/shm`` but not their
process lists, as ``docker run --ipc=host`` does, cannot see each other's pids, but see
each other's locks).

Segments are reserved with ``posix_fallocate`` when created (:func:`create`), so a full
``/dev/shm`` fails then, with a message, instead of killing a process with SIGBUS.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import mmap
import os
import secrets

from stoker._errors import ShmError
from stoker._proc import pid_exists

try:  # CPython's POSIX shared memory primitives (what multiprocessing.shared_memory uses)
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = [
    "SEGMENT_PREFIX",
    "attach",
    "create",
    "free_bytes",
    "hold_prefix",
    "lease_oneoff",
    "map_shared",
    "new_prefix",
    "open_new",
    "remove_orphaned_segments",
    "shm_available",
    "sweep",
    "unlink",
]

SEGMENT_PREFIX = "stoker-"
_SHM_DIR = "/dev/shm"


@functools.cache
def shm_available() -> bool:
    """True where POSIX shared memory lives in ``/dev/shm`` (Linux)."""
    return _posixshmem is not None and os.path.isdir(_SHM_DIR)


def create(name: str, size: int) -> mmap.mmap:
    """Creates a segment of ``size`` bytes, its pages reserved now (trainer side)."""
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            _posixshmem.shm_unlink("/" + name)
            free = free_bytes()
            msg = (
                f"cannot reserve {size / 2**20:.1f} MiB of shared memory for a batch slot "
                f"({_SHM_DIR} has {free / 2**20:.1f} MiB free): {exc.strerror}. Give the container "
                "more shared memory (docker run --shm-size=8g, or a larger emptyDir medium: Memory "
                "in Kubernetes), lower batch_size / prefetch_factor / num_workers, or use "
                "worker_mode='thread'."
            )
            raise ShmError(msg) from exc
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def attach(name: str, size: int) -> mmap.mmap:
    """Maps an existing segment (worker side)."""
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, 0o600)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def lease_oneoff(name: str, size: int) -> object:
    """Trainer side: maps a one-off segment, unlinks it, returns a buffer over it.

    The mapping is released when the last array viewing the buffer is collected.
    """
    mm = attach(name, size)
    unlink(name)
    return (ctypes.c_ubyte * size).from_buffer(mm)


_shared_maps: dict[str, object] = {}


def map_shared(name: str, size: int) -> object:
    """Maps a shared segment once per process (read-mostly data: a spawned worker's dataset)."""
    buffer = _shared_maps.get(name)
    if buffer is None:
        buffer = _shared_maps[name] = (ctypes.c_ubyte * size).from_buffer(attach(name, size))
    return buffer


_ALIVE_SUFFIX = ".alive"
_held: dict[str, int] = {}  # prefix -> the fd whose lock marks its segments alive


def hold_prefix(prefix: str) -> None:
    """Marks ``prefix``'s segments alive until :func:`sweep` (or this process's death).

    Creates ``<prefix>.alive`` and holds an exclusive lock on it; other processes'
    :func:`remove_orphaned_segments` leave the prefix alone while the lock is held.
    """
    if prefix in _held:
        return
    name = prefix + _ALIVE_SUFFIX
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.set_inheritable(fd, False)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        unlink(name)
        raise
    _held[prefix] = fd


def sweep(prefix: str) -> None:
    """Unlinks every segment whose name starts with ``prefix``, then lets its lock go."""
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        names = []
    for name in names:
        if name.startswith(prefix):
            unlink(name)
    fd = _held.pop(prefix, None)
    if fd is not None:
        os.close(fd)


def new_prefix() -> str:
    """A segment-name prefix unique to this process and pool."""
    return f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"


def unlink(name: str) -> None:
    """Removes a segment's name (mappings stay valid until unmapped); gone already is fine."""
    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink("/" + name)


def free_bytes() -> int:
    """Bytes free in /dev/shm."""
    st = os.statvfs(_SHM_DIR)
    return st.f_bavail * st.f_frsize


def remove_orphaned_segments() -> list[str]:
    """Unlinks the segments of stoker pools that no process holds alive any more.

    Returns the names removed. A process killed with SIGKILL cannot clean up after
    itself; the next stoker pool on the machine does it instead. A pool is dead when the
    lock on its ``<prefix>.alive`` can be taken (its holder and the workers that inherited
    it are gone). Segments without a lock (made by a stoker older than the lock) go only
    when the pid in their name is not running here.
    """
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return []
    by_pool: dict[str, list[str]] = {}
    for name in names:
        if name.startswith(SEGMENT_PREFIX):
            parts = name.split("-", 3)
            if len(parts) >= 3 and parts[1].isdigit():
                pool = "-".join(parts[:3]).removesuffix(_ALIVE_SUFFIX)
                by_pool.setdefault(pool, []).append(name)
    removed = []
    for pool, members in by_pool.items():
        if pool in _held:
            continue
        lock = pool + _ALIVE_SUFFIX
        # a pool with a lock file is dead once nobody holds the lock; without one, once its
        # process is gone
        dead = _lock_is_free(lock) if lock in members else not pid_exists(int(pool.split("-")[1]))
        if dead:
            for name in members:
                unlink(name)
                removed.append(name)
    return removed


def _lock_is_free(name: str) -> bool:
    """True when nobody holds the lock on segment ``name`` (its pool is dead)."""
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, 0o600)
    except OSError:
        return False  # gone already, or not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)  # closing the fd releases the lock, if we got it
    return True


def open_new(name: str) -> int:
    """A file descriptor on a new, empty segment (``O_EXCL``: never someone else's)."""
    return _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
