"""Shared-memory slots that carry batches from process workers to the trainer.

Ownership (who creates, who reads, who frees):

* The **main process** creates every slot (``/dev/shm/stoker-<pid>-<token>-<n>``),
  decides which task may write into which slot, and unlinks every segment.
* A **worker** attaches to the slot named in its task, collates the batch straight into
  it (see :func:`stoker.collate.collate_into`), and sends back only metadata: offsets,
  shapes and dtypes.
* Before the pool exists (the first batches show how big a batch is) or when every slot
  is held by the consumer, a worker with a large batch creates a **one-off segment**
  under the trainer's prefix; the trainer maps it and unlinks it as soon as the message
  arrives, so it lives only as long as the batch's arrays. A pool's shutdown also sweeps
  its prefix, so a worker that dies between creating and sending leaks nothing.
* The **consumer** gets numpy views of the slot. A slot is *leased* to a batch: it goes
  back to the pool only when the last array (or torch tensor) that views it is garbage
  collected, so a batch a user keeps is never overwritten. That is the batch's lifetime
  rule; ``DataLoader(copy_batches=True)`` copies each batch out and frees its slot at once.

Segments are reserved with ``posix_fallocate`` when created, so a full ``/dev/shm``
fails then, with a message, instead of killing a process with SIGBUS mid-epoch.

Liveness: a process pool's segments share one prefix, and the trainer holds an exclusive
``flock`` on ``<prefix>.alive`` for the pool's life (:func:`hold_prefix`). The kernel drops
the lock when the last process holding it dies, however it dies. Segments of a pool whose
lock is free are removed by the next pool created on the machine
(:func:`remove_orphaned_segments`); a pool whose lock is held is alive, whatever PID
namespace it runs in (containers that share ``/dev/shm`` but not their process lists, as
``docker run --ipc=host`` does, cannot see each other's pids, but see each other's locks).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import mmap
import os
import secrets
import weakref
from dataclasses import dataclass

import numpy as np

from stoker._errors import ShmError

try:  # CPython's POSIX shared memory primitives (what multiprocessing.shared_memory uses)
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

__all__ = [
    "OneoffWriter",
    "SEGMENT_PREFIX",
    "SlotAllocator",
    "SlotPool",
    "SlotRef",
    "attach",
    "free_bytes",
    "hold_prefix",
    "lease_oneoff",
    "map_shared",
    "new_prefix",
    "remove_orphaned_segments",
    "shm_available",
    "sweep",
]

SEGMENT_PREFIX = "stoker-"
_SHM_DIR = "/dev/shm"
_ALIGN = 64  # bytes; every array in a slot starts on a cache line


@dataclass(frozen=True, slots=True)
class SlotRef:
    """Names a slot in a task message: which segment, how big, which generation."""

    index: int
    name: str
    size: int


@functools.cache
def shm_available() -> bool:
    """True where POSIX shared memory lives in ``/dev/shm`` (Linux)."""
    return _posixshmem is not None and os.path.isdir(_SHM_DIR)


def _create(name: str, size: int) -> mmap.mmap:
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            _posixshmem.shm_unlink("/" + name)
            free = _free_shm_bytes()
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


class OneoffWriter:
    """Worker side: writes one batch's arrays into a fresh segment under the trainer's prefix.

    Written with ``pwrite`` rather than through a mapping: the kernel fills each page once
    (no separate zeroing pass to reserve it), and a full ``/dev/shm`` is an ``ENOSPC``
    error (the array then travels inline) instead of a SIGBUS. Quacks like
    :class:`SlotAllocator` for :func:`stoker.engine.transport.encode`.
    """

    __slots__ = ("_fd", "ref", "used")

    def __init__(self, prefix: str, size: int, *, shared: bool = False) -> None:
        """``shared``: several processes map it and its owner unlinks it (a dataset sent to
        spawned workers); otherwise the one reader unlinks it on arrival."""
        name = f"{prefix}-w{os.getpid()}-{secrets.token_hex(4)}"
        size = _round_up(max(size, 1), mmap.PAGESIZE)
        self._fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(self._fd, size)  # sparse: pages appear as they are written
        except BaseException:
            self.close()
            _unlink(name)
            raise
        self.ref = SlotRef(-2 if shared else -1, name, size)
        self.used = 0

    def place(self, array: np.ndarray) -> int | None:
        if array.dtype.hasobject:
            return None
        offset = _round_up(self.used, _ALIGN)
        if offset + array.nbytes > self.ref.size:
            return None
        # as raw bytes: a buffer of datetimes or structured records cannot be cast to "B"
        data = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(self._fd, data[written:], offset + written)
        except OSError:  # ENOSPC and friends: this array travels inline instead
            return None
        self.used = offset + array.nbytes
        return offset

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def lease_oneoff(name: str, size: int) -> object:
    """Trainer side: maps a one-off segment, unlinks it, returns a buffer over it.

    The mapping is released when the last array viewing the buffer is collected.
    """
    mm = attach(name, size)
    _unlink(name)
    return (ctypes.c_ubyte * size).from_buffer(mm)


_shared_maps: dict[str, object] = {}


def map_shared(name: str, size: int) -> object:
    """Maps a shared segment once per process (read-mostly data: a spawned worker's dataset)."""
    buffer = _shared_maps.get(name)
    if buffer is None:
        buffer = _shared_maps[name] = (ctypes.c_ubyte * size).from_buffer(attach(name, size))
    return buffer


def free_bytes() -> int:
    """Bytes free in /dev/shm."""
    return _free_shm_bytes()


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
        _unlink(name)
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
            _unlink(name)
    fd = _held.pop(prefix, None)
    if fd is not None:
        os.close(fd)


def new_prefix() -> str:
    """A segment-name prefix unique to this process and pool."""
    return f"{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"


def _unlink(name: str) -> None:
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


def _free_shm_bytes() -> int:
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
        if lock in members:
            dead = _lock_is_free(lock)
        else:
            dead = not _pid_running(int(pool.split("-")[1]))
        if dead:
            for name in members:
                _unlink(name)
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


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Slot:
    __slots__ = ("buffer_type", "index", "leased", "mm", "name", "size", "wanted")

    def __init__(self, index: int, name: str, size: int) -> None:
        self.index = index
        self.name = name
        self.size = size
        self.mm = _create(name, size)
        self.buffer_type = type("SlotBuffer", (ctypes.c_ubyte * size,), {})
        self.leased = False
        self.wanted = size  # grown when a batch did not fit

    def ref(self) -> SlotRef:
        return SlotRef(self.index, self.name, self.size)

    def close(self) -> bool:
        """Unmaps (when no view is alive) and unlinks. Returns True when unmapped."""
        _unlink(self.name)
        try:
            self.mm.close()
        except BufferError:  # a consumer still holds a view: the mapping dies with it
            return False
        return True


class SlotPool:
    """Up to ``count`` reusable shared-memory slots, owned by the main process.

    Slots are created when first needed (each creation reserves its pages, which takes
    milliseconds for large batches), so building the pool costs nothing on the path of
    the first batch, and a consumer that never holds many batches never pays for them.

    Args:
        count: most slots (the loader passes ``prefetch_factor * num_workers + 2``).
        size: bytes per slot.

    Example:
        >>> pool = SlotPool(count=2, size=1 << 16)  # doctest: +SKIP
        >>> ref = pool.acquire()                      # doctest: +SKIP
        >>> pool.close()                              # doctest: +SKIP
    """

    def __init__(self, count: int, size: int, prefix: str | None = None, budget: int | None = None) -> None:
        if count < 1 or size < 1:
            raise AssertionError(f"SlotPool needs count >= 1 and size >= 1, got {count}, {size}")
        size = _round_up(size, mmap.PAGESIZE)
        need = count * size
        free = _free_shm_bytes()
        if need > free:
            msg = (
                f"the batch slot pool needs {need / 2**20:.1f} MiB of shared memory ({count} slots of "
                f"{size / 2**20:.1f} MiB) but {_SHM_DIR} has {free / 2**20:.1f} MiB free. Give the "
                "container more shared memory (docker run --shm-size=8g), or lower batch_size, "
                "prefetch_factor or num_workers."
            )
            raise ShmError(msg)
        remove_orphaned_segments()
        self._token = prefix or new_prefix()
        self._serial = 0
        self._capacity = count
        self._size = size
        self._budget = budget  # bytes all slots together may hold (None: no limit)
        self._slots: list[_Slot] = []
        self._free: list[int] = []
        self._closed = False
        self.creation_error: OSError | None = None  # why the last new slot could not be made

    def _new_slot(self, index: int, size: int) -> _Slot:
        self._serial += 1
        return _Slot(index, f"{self._token}-{self._serial}", size)

    @property
    def names(self) -> list[str]:
        return [slot.name for slot in self._slots]

    @property
    def nbytes(self) -> int:
        return sum(slot.size for slot in self._slots)

    @property
    def capacity(self) -> int:
        """The most slots the pool will create."""
        return self._capacity

    @property
    def slot_size(self) -> int:
        return self._size

    def grow(self, count: int) -> None:
        """Allows ``count`` slots in all (autotuning a deeper prefetch); never shrinks."""
        self._capacity = max(self._capacity, count)

    @property
    def num_free(self) -> int:
        """Slots that :meth:`acquire` can hand out now: free ones and ones not yet created."""
        return len(self._free) + self._capacity - len(self._slots)

    def acquire(self, prefer: tuple[int, ...] = ()) -> SlotRef | None:
        """A free slot for the next task, or ``None`` when every slot is in use.

        ``prefer`` lists slot indices to try first (the ones the receiving worker wrote
        most recently: still in its caches). Otherwise the most recently freed slot, or a
        new one while the pool is below its size.
        """
        if not self._free:
            if len(self._slots) >= self._capacity or self._closed or not self._fits(self._size):
                return None
            try:
                slot = self._new_slot(len(self._slots), self._size)
            except OSError as exc:  # ShmError included: /dev/shm full, out of file descriptors
                self._no_more_slots(exc)
                return None
            self._slots.append(slot)
            slot.leased = True
            return slot.ref()
        for index in prefer:
            if index in self._free:
                self._free.remove(index)
                break
        else:
            index = self._free.pop()
        slot = self._slots[index]
        if slot.wanted > slot.size:  # a batch overflowed it: replace with a bigger one
            bigger = _round_up(slot.wanted, mmap.PAGESIZE)
            if not self._fits(bigger - slot.size):  # over the budget: stay, the excess goes inline
                slot.wanted = slot.size
            else:
                try:
                    replacement = self._new_slot(slot.index, bigger)
                except OSError as exc:  # keep the slot it has; the excess goes inline
                    self._no_more_slots(exc)
                    slot.wanted = slot.size
                else:
                    slot.close()
                    slot = self._slots[slot.index] = replacement
                    self._size = max(self._size, bigger)
        slot.leased = True
        return slot.ref()

    def _no_more_slots(self, exc: OSError) -> None:
        """A slot could not be made: the pool stays at the slots it has (none: batches go
        through pipes and one-off segments) and remembers why, for the loader to say."""
        self.creation_error = exc
        self._capacity = len(self._slots)

    def _fits(self, extra: int) -> bool:
        return self._budget is None or self.nbytes + extra <= self._budget

    def release(self, index: int) -> None:
        """Returns a slot to the pool (a task failed, or no view was handed out)."""
        if self._closed:
            return
        slot = self._slots[index]
        if not slot.leased:
            raise AssertionError(f"slot {index} released twice")
        slot.leased = False
        self._free.append(index)

    def want(self, index: int, nbytes: int) -> None:
        """Records that slot ``index`` should hold ``nbytes`` next time it is handed out."""
        slot = self._slots[index]
        slot.wanted = max(slot.wanted, nbytes)

    def lease(self, index: int) -> object:
        """A buffer over slot ``index`` whose garbage collection returns the slot to the pool."""
        slot = self._slots[index]
        if not slot.leased:
            raise AssertionError(f"slot {index} viewed while not handed out")
        buffer = slot.buffer_type.from_buffer(slot.mm)
        weakref.finalize(buffer, self.release, index)
        return buffer

    def close(self) -> None:
        """Unlinks every segment; safe to call twice. Views still alive stay valid."""
        if self._closed:
            return
        self._closed = True
        for slot in self._slots:
            slot.close()
        self._free.clear()


class SlotAllocator:
    """Worker side: bump-allocates arrays inside one slot while a batch is collated.

    Arrays that do not fit come from the heap instead and are reported through
    :attr:`overflow` so the main process can grow the slot for next time.
    """

    __slots__ = ("_base", "_buffer", "_offsets", "overflow", "ref", "used")

    def __init__(self, ref: SlotRef, mm: mmap.mmap) -> None:
        self.ref = ref  # index -1: a one-off segment, named by ref.name
        self._buffer = mm
        self._base = np.frombuffer(mm, dtype=np.uint8, count=0).__array_interface__["data"][0]
        self._offsets: dict[int, tuple[int, np.ndarray]] = {}
        self.used = 0
        self.overflow = 0

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset = _round_up(self.used, _ALIGN)
        if dtype.hasobject or offset + nbytes > self.ref.size:
            self.overflow += nbytes
            return np.empty(shape, dtype)
        array = np.frombuffer(self._buffer, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
        array = array.reshape(shape)
        self.used = offset + nbytes
        self._offsets[id(array)] = (offset, array)
        return array

    def place(self, array: np.ndarray) -> int | None:
        """The slot offset of ``array``, copying it in if it is not there; None if it cannot be."""
        hit = self._offsets.get(id(array))
        if hit is not None and hit[1] is array:
            return hit[0]
        if array.dtype.hasobject:
            return None
        inside = self._offset_of(array)
        if inside is not None:
            return inside
        offset = _round_up(self.used, _ALIGN)
        if offset + array.nbytes > self.ref.size:
            self.overflow += array.nbytes
            return None
        target = np.frombuffer(self._buffer, dtype=array.dtype, count=array.size, offset=offset)
        np.copyto(target.reshape(array.shape), array, casting="no")
        self.used = offset + array.nbytes
        return offset

    def _offset_of(self, array: np.ndarray) -> int | None:
        """The offset of a contiguous array that already lies in this slot, else None.

        Another object than the one :meth:`__call__` returned can view the same memory: the
        numpy view of a tensor that collate built over the slot (``torch.from_numpy``), or a
        slice of an allocated array. Such an array needs no second copy.
        """
        if not array.flags.c_contiguous:
            return None
        offset = array.__array_interface__["data"][0] - self._base
        if 0 <= offset and offset + array.nbytes <= self.used:
            return offset
        return None

    def reset(self) -> None:
        self._offsets.clear()
        self.used = 0
        self.overflow = 0


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple

