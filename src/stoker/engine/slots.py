"""Batch slots: reusable memory that batches are collated into.

Process workers write into shared memory, which carries the batch to the trainer. Thread
workers of large batches write into slots of the trainer's own memory
(``SlotPool(in_process=True)``): nothing to carry, but a fresh allocation per batch would
cost more than the copy. The pool's thread mode leases a slot as it sends the task and the
worker collates into the lease; everything below holds for both, apart from segments.

Ownership (who creates, who reads, who frees):

* The **main process** creates every slot (a segment of :mod:`stoker.engine.segments`),
  decides which task may write into which slot, and unlinks every segment.
* A **worker** attaches to the slot named in its task, collates the batch straight into
  it (:class:`SlotAllocator`, through :func:`stoker.collate.collate_into`), and sends back
  only metadata: offsets, shapes and dtypes.
* Before the pool exists (the first batches show how big a batch is) or when every slot
  is held by the consumer, a worker with a large batch writes a **one-off segment**
  (:class:`OneoffWriter`) under the trainer's prefix; the trainer maps it and unlinks it
  as soon as the message arrives, so it lives only as long as the batch's arrays. A
  pool's shutdown also sweeps its prefix, so a worker that dies between creating and
  sending leaks nothing.
* The **consumer** gets numpy views of the slot. A slot is *leased* to a batch: it goes
  back to the pool only when the last array (or torch tensor) that views it is garbage
  collected, so a batch a user keeps is never overwritten. That is the batch's lifetime
  rule; ``DataLoader(copy_batches=True)`` copies each batch out and frees its slot at once.

:class:`SlotRef` names a slot in a task message; its :class:`SlotKind` says whether it is a
pool slot, a one-off segment or a shared segment (a dataset sent to spawned workers).
:func:`plan_slots` sizes the pool from the first batch and the memory budget.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import mmap
import os
import secrets
import weakref
from dataclasses import dataclass
from typing import Final

import numpy as np

from stoker._errors import ShmError
from stoker.engine import segments

__all__ = [
    "IN_PROCESS_MIN_BATCH_BYTES",
    "NOT_POOLED",
    "OneoffWriter",
    "SlotAllocator",
    "SlotKind",
    "SlotPlan",
    "SlotPool",
    "SlotRef",
    "plan_slots",
    "slots_for",
]

_ALIGN = 64  # bytes; every array in a slot starts on a cache line
_HEADROOM = 1.25  # a slot holds this much more than the batch it was sized for
# thread workers reuse slots only for batches this large: smaller ones come from the
# allocator's free lists, faulted in already
IN_PROCESS_MIN_BATCH_BYTES = 1 << 20


class SlotKind(enum.Enum):
    """What a :class:`SlotRef` names."""

    POOL = "pool"  # a reusable slot of the trainer's SlotPool (index: its place in the pool)
    ONEOFF = "oneoff"  # one batch's segment, written by a worker, unlinked when it arrives
    SHARED = "shared"  # read-mostly data several processes map (a dataset sent to spawned workers)


NOT_POOLED: Final = -1  # SlotRef.index of the kinds that are not a SlotPool's slot


@dataclass(frozen=True, slots=True)
class SlotRef:
    """Names shared memory in a message: its kind, pool index, segment name and size."""

    kind: SlotKind
    index: int  # the pool slot's index; NOT_POOLED for the other kinds
    name: str
    size: int


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
        self._fd = segments.open_new(name)
        try:
            os.ftruncate(self._fd, size)  # sparse: pages appear as they are written
        except BaseException:
            self.close()
            segments.unlink(name)
            raise
        kind = SlotKind.SHARED if shared else SlotKind.ONEOFF
        self.ref = SlotRef(kind, NOT_POOLED, name, size)
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


class _Slot:
    __slots__ = ("buffer_type", "in_process", "index", "leased", "mm", "name", "size", "wanted")

    def __init__(self, index: int, name: str, size: int, in_process: bool = False) -> None:
        self.index = index
        self.name = name
        self.size = size
        self.in_process = in_process
        self.mm = _private_memory(size) if in_process else segments.create(name, size)
        self.buffer_type = type("SlotBuffer", (ctypes.c_ubyte * size,), {})
        self.leased = False
        self.wanted = size  # grown when a batch did not fit

    def ref(self) -> SlotRef:
        return SlotRef(SlotKind.POOL, self.index, self.name, self.size)

    def close(self) -> bool:
        """Unmaps (when no view is alive) and unlinks. Returns True when unmapped."""
        if not self.in_process:
            segments.unlink(self.name)
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
        in_process: slots of the trainer's own memory, for thread workers: no segment in
            ``/dev/shm``, and transparent huge pages where the system offers them. Reusing
            them spares each batch a fresh allocation, which the kernel zeroes and faults in
            page by page (for a 24 MiB batch, more than the copy into it costs).

    Example:
        >>> pool = SlotPool(count=2, size=1 << 16)  # doctest: +SKIP
        >>> ref = pool.acquire()                      # doctest: +SKIP
        >>> pool.close()                              # doctest: +SKIP
    """

    def __init__(
        self,
        count: int,
        size: int,
        prefix: str | None = None,
        budget: int | None = None,
        *,
        in_process: bool = False,
    ) -> None:
        if count < 1 or size < 1:
            raise AssertionError(f"SlotPool needs count >= 1 and size >= 1, got {count}, {size}")
        size = _round_up(size, mmap.PAGESIZE)
        if not in_process:  # shared memory: /dev/shm must hold every slot
            _check_shm_room(count, size)
            segments.remove_orphaned_segments()
        self._in_process = in_process
        self._token = prefix or segments.new_prefix()
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
        return _Slot(index, f"{self._token}-{self._serial}", size, self._in_process)

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
        self.ref = ref
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
        array = np.frombuffer(
            self._buffer, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset
        )
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
        if offset >= 0 and offset + array.nbytes <= self.used:
            return offset
        return None

    def reset(self) -> None:
        self._offsets.clear()
        self.used = 0
        self.overflow = 0


def _check_shm_room(count: int, size: int) -> None:
    """A ``ShmError`` when ``/dev/shm`` cannot hold ``count`` slots of ``size`` bytes."""
    need, free = count * size, segments.free_bytes()
    if need > free:
        msg = (
            f"the batch slot pool needs {need / 2**20:.1f} MiB of shared memory ({count} "
            f"slots of {size / 2**20:.1f} MiB) but /dev/shm has {free / 2**20:.1f} MiB free. "
            "Give the container more shared memory (docker run --shm-size=8g), or lower "
            "batch_size, prefetch_factor or num_workers."
        )
        raise ShmError(msg)


def _private_memory(size: int) -> mmap.mmap:
    """``size`` bytes of this process's memory, in huge pages where the system allows it."""
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            memory.madvise(mmap.MADV_HUGEPAGE)
    return memory


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True, slots=True)
class SlotPlan:
    """The slot pool for a batch size: how many slots, how big, and what the budget allows."""

    count: int  # slots in the pool
    size: int  # bytes per slot (headroom included)
    wanted: int  # the slots torch's rule would keep busy: batches in flight + 2 the consumer holds
    ahead: int  # batches the memory budget lets load ahead (at least one)


def plan_slots(batch_bytes: int, arrays: int, in_flight: int, memory_budget: int) -> SlotPlan:
    """Sizes the pool from a batch's bytes (and array count), within ``memory_budget``."""
    size = int(batch_bytes * _HEADROOM) + _ALIGN * arrays + 4096
    wanted = in_flight + 2
    count = wanted if wanted * size <= memory_budget else max(1, memory_budget // size)
    ahead = min(in_flight, max(1, memory_budget // max(batch_bytes, 1)))
    return SlotPlan(count=count, size=size, wanted=wanted, ahead=ahead)


def slots_for(in_flight: int, slot_size: int, memory_budget: int) -> int:
    """The pool's size once more batches may be in flight (autotuning), within the budget."""
    wanted = in_flight + 2
    return min(wanted, max(1, memory_budget // slot_size)) if slot_size else wanted
